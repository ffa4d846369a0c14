"""The solutions of the chapters' exercises, loaded from the notebooks themselves (their one
source), and wrong answers made from them by naming the mistake's edit.

``solution("01_weighted_sum", "1.1")`` runs the solution cell of exercise 1.1 as a module
and returns it, so ``.scale_columns_kernel`` is the kernel a student would write.
``solution(..., mistakes={"cols < n_cols": "cols <= n_cols"})`` is the same cell with that
text replaced (each must occur, so a test cannot go on testing a mistake the solution no
longer contains). The cell runs from a file, because ``@triton.jit`` reads its source.
"""

import hashlib
import importlib.util
import json
import re
import sys
import tempfile
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[3] / "notebooks"
PRELUDE = """\
import math
import torch
import triton
import triton.language as tl
from course_lib.core.runtime import DEVICE
"""
_FOLDER = Path(tempfile.mkdtemp(prefix="course_solutions_"))
_loaded = {}


def solution_source(notebook, exercise):
    """The source of the solution cell(s) of exercise ``N.M`` in ``notebooks/<notebook>.ipynb``."""
    cells = json.loads((NOTEBOOKS / f"{notebook}.ipynb").read_text())["cells"]
    grade_id = "exercise_{}_{}_solution".format(*exercise.split("."))
    sources = ["".join(cell["source"]) for cell in cells
               if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "").startswith(grade_id)]
    if not sources:
        raise LookupError(f"{notebook}.ipynb has no solution cell of exercise {exercise}")
    return "\n\n".join(sources)


def layout_free(text):
    """A pattern matching ``text`` however its lines are folded: any run of whitespace may be
    another run (a line break and indentation, say), and a break may follow an opening bracket
    or comma or come before a closing bracket. The solutions are wrapped to the book's column."""
    pattern = ""
    for char in text.strip():
        if char.isspace():
            pattern += "" if pattern.endswith(r"\s*") else r"\s*"
        elif char in "([{,":
            pattern += re.escape(char) + r"\s*"
        elif char in ")]}":
            pattern += (r"" if pattern.endswith(r"\s*") else r"\s*") + re.escape(char)
        else:
            pattern += re.escape(char)
    return pattern


def solution(notebook, exercise, mistakes=None, prelude=""):
    """The solution cell of exercise ``N.M`` run as a module, with each ``old: new`` of
    ``mistakes`` applied to its source first. ``prelude`` is code the cell needs from the
    notebook's earlier cells."""
    source = solution_source(notebook, exercise)
    for old, new in (mistakes or {}).items():
        if old in source:
            source = source.replace(old, new)
            continue
        found = re.compile(layout_free(old))  # the same code folded to the book's column
        if not found.search(source):
            raise AssertionError(f"exercise {exercise}'s solution no longer contains {old!r}: update the test")
        source = found.sub(lambda match: new, source)
    text = PRELUDE + prelude + "\n" + source + "\n"
    key = hashlib.sha1(text.encode()).hexdigest()[:16]
    if key not in _loaded:
        path = _FOLDER / f"solution_{exercise.replace('.', '_')}_{key}.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module  # triton looks the kernel's module up
        spec.loader.exec_module(module)
        _loaded[key] = module
    return _loaded[key]
