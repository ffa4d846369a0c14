"""Student copies of the course notebooks, and grading of the copies students return.

Both follow the exercise convention of CONTRIBUTING.md: a code cell tagged ``solution``
holds the answer between a line ``# BEGIN SOLUTION`` and a line ``# END SOLUTION``, and
a code cell tagged ``checker`` calls one ``check_...`` function that raises when the
answer is wrong.

Command line::

    python -m course_lib.teaching.instructor student SRC_DIR DEST_DIR
    python -m course_lib.teaching.instructor grade SUBMISSIONS_DIR [--out CSV] [--timeout SECONDS]

``nbformat`` and ``nbclient`` (and ``ipykernel`` to run notebooks) are instructor-only
dependencies, so they are imported inside the functions that need them.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..core.runtime import ON_GPU
from .grading.gradebook import (Return, course_commit, exercise_column, feedback_page, feedback_path, find_returns,
                                gradebook_csv, student_from_file_name, write_atomically)
from .grading.sandbox import Sandbox, find_sandbox, run_limited

SOLUTION_TAG = "solution"
CHECKER_TAG = "checker"
HIDE_INPUT_TAG = "hide-input"
REMOVE_IN_STUDENT_TAG = "remove-in-student"
# Where the student copies are kept (the book's chapter pages and the launch buttons' target)
# and where the book's solutions pages are written, relative to the repository.
STUDENT_DIR = "student"
SOLUTIONS_DIR = "book/solutions"
INTERPRETER_OUTPUT = "interpreter-output"  # a cell whose outputs only the CPU interpreter can make
BEGIN_SOLUTION = "# BEGIN SOLUTION"
END_SOLUTION = "# END SOLUTION"
STUDENT_PLACEHOLDER = ("# YOUR CODE HERE", "pass")
CHECKER_CALL = re.compile(r"(check_\w+)\(")
EXERCISE_HEADING = re.compile(r"###\s+Exercise\s+(\d+)\.(\d+)\b")
TASK_ROLE, SOLUTION_ROLE, CHECKER_ROLE = "task", "solution", "checker"
NBGRADER_KEY = "nbgrader"
NBGRADER_SCHEMA_VERSION = 3
CHECKER_POINTS = 1
KERNEL_NAME = "python3"
DEFAULT_TIMEOUT = 600
DEFAULT_NOTEBOOK_TIMEOUT = 3600
DEFAULT_MEMORY_LIMIT_GIB = 16.0  # host memory of one return's processes (its kernel included)
INSTALL_HINT = "pip install nbformat nbclient ipykernel psutil"
PASSED_MARK = "✓"
FAILED_MARK = "✗"


def _import_instructor_dependency(module_name: str):
    try:
        return importlib.import_module(module_name)
    except ImportError as error:
        raise ImportError(
            f"course_lib.teaching.instructor needs {module_name}, an instructor-only dependency "
            f"that is not installed. Install it with: {INSTALL_HINT}"
        ) from error


def _tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def _notebooks_in(folder: str | Path) -> list[Path]:
    """The ``*.ipynb`` files directly in ``folder``, sorted; an error if there are none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder")
    notebooks = sorted(folder.glob("*.ipynb"))
    if not notebooks:
        raise FileNotFoundError(f"{folder} holds no *.ipynb notebooks")
    return notebooks


# --- exercise cells: stable ids and nbgrader's metadata ------------------------------


@dataclass(frozen=True)
class ExerciseCell:
    """A cell of an exercise: its statement, its solution or its checker."""

    cell_index: int
    role: str  # one of ROLES
    grade_id: str


def exercise_cells(notebook, name: str) -> list[ExerciseCell]:
    """The exercise cells of a notebook, each with its stable id ``exercise_N_M_<role>``.

    An exercise is a markdown cell headed ``### Exercise N.M``, then its solution and
    checker cells; the id follows the exercise's number, so it stays the same when cells
    are added elsewhere. A solution or checker cell before any heading is an error.
    """
    cells: list[ExerciseCell] = []
    exercise: str | None = None
    used: set[str] = set()
    for cell_index, cell in enumerate(notebook.cells):
        heading = EXERCISE_HEADING.match(cell.source) if cell.cell_type == "markdown" else None
        tags = _tags(cell)
        if heading:
            exercise = f"exercise_{heading.group(1)}_{heading.group(2)}"
            role = TASK_ROLE
        elif cell.cell_type == "code" and SOLUTION_TAG in tags:
            role = SOLUTION_ROLE
        elif cell.cell_type == "code" and CHECKER_TAG in tags:
            role = CHECKER_ROLE
        else:
            continue
        if exercise is None:
            raise ValueError(f"{name}, cell {cell_index}: a {role} cell before any '### Exercise N.M' heading")
        grade_id, repeat = f"{exercise}_{role}", 1
        while grade_id in used:
            repeat += 1
            grade_id = f"{exercise}_{role}_{repeat}"
        used.add(grade_id)
        cells.append(ExerciseCell(cell_index, role, grade_id))
    return cells


def nbgrader_metadata(role: str, grade_id: str) -> dict:
    """nbgrader's cell metadata (schema 3): statements read-only, solutions for students
    to write, checkers read-only test cells worth one point each."""
    metadata = {
        "grade": role == CHECKER_ROLE,
        "grade_id": grade_id,
        "locked": role != SOLUTION_ROLE,
        "schema_version": NBGRADER_SCHEMA_VERSION,
        "solution": role == SOLUTION_ROLE,
    }
    if role == CHECKER_ROLE:
        metadata["points"] = CHECKER_POINTS
    return metadata


def _stamp(notebook, name: str) -> bool:
    """Give every exercise cell its nbgrader metadata; whether anything changed."""
    changed = False
    for exercise_cell in exercise_cells(notebook, name):
        cell = notebook.cells[exercise_cell.cell_index]
        metadata = nbgrader_metadata(exercise_cell.role, exercise_cell.grade_id)
        if cell.metadata.get(NBGRADER_KEY) != metadata:
            cell.metadata[NBGRADER_KEY] = metadata
            changed = True
    return changed


def stamp_exercise_metadata(paths) -> list[Path]:
    """Write nbgrader's metadata into the exercise cells of each notebook; the notebooks
    that changed. Sources and outputs are left as they are."""
    nbformat = _import_instructor_dependency("nbformat")
    changed = []
    for path in map(Path, paths):
        notebook = nbformat.read(path, as_version=4)
        if _stamp(notebook, path.name):
            nbformat.write(notebook, path)
            changed.append(path)
    return changed


def _grade_id(cell) -> str | None:
    return cell.get("metadata", {}).get(NBGRADER_KEY, {}).get("grade_id")


# --- student copies -----------------------------------------------------------------


def _is_marker(line: str, marker: str) -> bool:
    return line.strip() == marker


def _replace_solution_blocks(source: str, where: str) -> str:
    """Replace each marked block, markers included, by the placeholder at its indentation.

    ``where`` names the notebook and cell in error messages. A cell with no block, an
    ``# END SOLUTION`` without its ``# BEGIN SOLUTION``, a nested or an unclosed block is
    an error, so that a solution can never slip through into a student copy.
    """
    student_lines: list[str] = []
    block_indent: str | None = None
    blocks_found = 0
    for line_number, line in enumerate(source.split("\n"), start=1):
        if _is_marker(line, BEGIN_SOLUTION):
            if block_indent is not None:
                raise ValueError(f"{where}: nested {BEGIN_SOLUTION!r} at line {line_number}")
            block_indent = line[: len(line) - len(line.lstrip())]
        elif _is_marker(line, END_SOLUTION):
            if block_indent is None:
                raise ValueError(
                    f"{where}: {END_SOLUTION!r} at line {line_number} "
                    f"has no {BEGIN_SOLUTION!r} before it"
                )
            student_lines.extend(block_indent + text for text in STUDENT_PLACEHOLDER)
            block_indent = None
            blocks_found += 1
        elif block_indent is None:
            student_lines.append(line)
    if block_indent is not None:
        raise ValueError(f"{where}: {BEGIN_SOLUTION!r} is never closed by {END_SOLUTION!r}")
    if blocks_found == 0:
        raise ValueError(
            f"{where}: tagged {SOLUTION_TAG!r} but has no "
            f"{BEGIN_SOLUTION!r} ... {END_SOLUTION!r} block"
        )
    return "\n".join(student_lines)


def _without_run_metadata(cell) -> None:
    """Drop what the instructors' run left on a cell: its execution count and timings."""
    cell.metadata.pop("execution", None)
    if cell.cell_type == "code":
        cell.execution_count = None


def solutions_page_link(notebook_stem: str) -> str:
    """The line a student copy adds under each exercise statement: where its solution is."""
    return (f"Stuck after the hints? The solution is on [this chapter's solutions page]"
            f"(../{SOLUTIONS_DIR}/{notebook_stem}.md).")


def make_student_copy(src_path: str | Path, dest_path: str | Path) -> Path:
    """Write the student version of the notebook ``src_path`` to ``dest_path``.

    Solutions are replaced by ``# YOUR CODE HERE`` / ``pass`` and their cells lose the
    ``hide-input`` tag; cells tagged ``remove-in-student`` are dropped; the outputs of
    solution and checker cells (which came from the solution) are cleared, the others
    kept (the book's chapter pages are these copies, with the course's GPU outputs); execution
    counts and timings are dropped; each exercise statement ends with a link to the chapter's
    solutions page. Raises ValueError, naming the notebook and cell index, for a solution
    cell whose markers are missing or malformed, and for any ``# BEGIN SOLUTION`` line left
    outside a solution cell.
    """
    nbformat = _import_instructor_dependency("nbformat")
    src_path, dest_path = Path(src_path), Path(dest_path)
    notebook = nbformat.read(src_path, as_version=4)
    _stamp(notebook, src_path.name)  # the ids by which grading finds the checker cells
    roles = {cell.cell_index: cell.role for cell in exercise_cells(notebook, src_path.name)}

    kept_cells = []
    for cell_index, cell in enumerate(notebook.cells):
        tags = _tags(cell)
        if REMOVE_IN_STUDENT_TAG in tags:
            continue
        _without_run_metadata(cell)
        if roles.get(cell_index) == TASK_ROLE:
            cell.source = cell.source.rstrip() + "\n\n" + solutions_page_link(src_path.stem)
        if cell.cell_type == "code":
            if SOLUTION_TAG in tags:
                where = f"{src_path.name}, cell {cell_index}"
                cell.source = _replace_solution_blocks(cell.source, where)
                cell.metadata["tags"] = [tag for tag in tags if tag != HIDE_INPUT_TAG]
            if SOLUTION_TAG in tags or CHECKER_TAG in tags:
                cell.outputs = []
        kept_cells.append((cell_index, cell))

    # A marked solution in a cell not tagged `solution` would otherwise reach students.
    for cell_index, cell in kept_cells:
        if any(_is_marker(line, BEGIN_SOLUTION) for line in cell.source.split("\n")):
            raise ValueError(
                f"{src_path.name}, cell {cell_index}: contains {BEGIN_SOLUTION!r} but is "
                f"not tagged {SOLUTION_TAG!r}; tag it, or tag it {REMOVE_IN_STUDENT_TAG!r}"
            )

    notebook.cells = [cell for _, cell in kept_cells]
    dest_path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, dest_path)
    return dest_path


def make_student_copies(src_dir: str | Path, dest_dir: str | Path) -> list[Path]:
    """Write a student copy of each ``*.ipynb`` in ``src_dir`` (not recursive) to ``dest_dir``."""
    notebooks = _notebooks_in(src_dir)
    dest_dir = Path(dest_dir)
    if dest_dir.resolve() == Path(src_dir).resolve():
        raise ValueError(f"{dest_dir} is the source folder; student copies would overwrite it")
    return [make_student_copy(notebook, dest_dir / notebook.name) for notebook in notebooks]


def _solution_code(source: str) -> str:
    """A solution cell's code as the solutions page shows it: the markers left out."""
    return "\n".join(line for line in source.split("\n")
                     if not (_is_marker(line, BEGIN_SOLUTION) or _is_marker(line, END_SOLUTION))).strip()


def solutions_page(src_path: str | Path) -> str:
    """The markdown of one chapter's solutions page: each exercise's heading and the code of
    its solution cells, from the instructors' notebook ``src_path``."""
    nbformat = _import_instructor_dependency("nbformat")
    src_path = Path(src_path)
    notebook = nbformat.read(src_path, as_version=4)
    title = next((cell.source.split("\n", 1)[0].lstrip("# ").strip() for cell in notebook.cells
                  if cell.cell_type == "markdown" and cell.source.startswith("# ")), src_path.stem)
    lines = [f"# Solutions: {title}", "",
             f"The answers to the exercises of [the chapter](../../{STUDENT_DIR}/{src_path.stem}.ipynb). "
             "Try the hints under each exercise first: a kernel you wrote yourself teaches more than one you read.",
             ""]
    for exercise_cell in exercise_cells(notebook, src_path.name):
        cell = notebook.cells[exercise_cell.cell_index]
        if exercise_cell.role == TASK_ROLE:
            lines += ["", cell.source.split("\n", 1)[0].replace("###", "##", 1), ""]
        elif exercise_cell.role == SOLUTION_ROLE:
            lines += ["```python", _solution_code(cell.source), "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def make_solutions_pages(src_dir: str | Path, dest_dir: str | Path) -> list[Path]:
    """Write one solutions page (markdown) for each ``*.ipynb`` of ``src_dir`` into ``dest_dir``."""
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for notebook in _notebooks_in(src_dir):
        path = dest_dir / f"{notebook.stem}.md"
        path.write_text(solutions_page(notebook), encoding="utf-8")
        written.append(path)
    return written


def exercise_table() -> str:
    """The instructors' table of every exercise (``exercises.EXERCISES``), as markdown."""
    from .exercises import EXERCISES

    rows = ["| Exercise | Title | Answer | Skills | Difficulty (1–5) | Minutes |", "|---|---|---|---|---|---|"]
    for exercise in EXERCISES:
        answer = "a `@triton.jit` kernel" if exercise.kernel else "PyTorch"
        rows.append(f"| {exercise.number} | {exercise.title} | {answer} | {exercise.skills} | "
                    f"{exercise.difficulty} | {exercise.minutes} |")
    kernels = sum(exercise.kernel for exercise in EXERCISES)
    minutes = sum(exercise.minutes for exercise in EXERCISES)
    rows += ["", f"{len(EXERCISES)} exercises, {kernels} of them kernels; about {minutes / 60:.0f} hours in all."]
    return "\n".join(rows) + "\n"


# --- grading ------------------------------------------------------------------------

AS_RELEASED, EDITED, MISSING = "as released", "edited", "missing"
CHECKER_ID_KEY = "course_lib_checker"  # the grade id of a released checker cell, in the graded notebook
GRADED_CHECKER_SOURCE = """\
# The released checker {grade_id}, run by course_lib.teaching.instructor (see course_lib/teaching/fresh_checker.py).
__course_grader = {{"__name__": "course_lib_fresh_checker"}}
exec(compile(open({runner!r}, encoding="utf-8").read(), {runner!r}, "exec"), __course_grader)
__course_grader["run_checker"](globals(), {source!r}, {grade_id!r}, {seed!r}, {results!r}, {package!r})
"""
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # course_lib itself
FRESH_CHECKER_FILE = Path(__file__).resolve().parent / "fresh_checker.py"
FRESH_CHECKER_IN_PACKAGE = FRESH_CHECKER_FILE.relative_to(PACKAGE_DIR)  # where a copy of the package has it


@dataclass(frozen=True)
class ReleasedChecker:
    """A checker cell as the instructor released it."""

    grade_id: str
    label: str  # the check_... function it calls
    source: str
    tags: tuple[str, ...]
    follows: str | None  # grade_id of the exercise cell it comes after: its solution, or its statement


@dataclass(frozen=True)
class ReleasedNotebook:
    name: str  # file name in the release folder
    checkers: tuple[ReleasedChecker, ...]
    grade_ids: frozenset[str]  # of all its exercise cells


@dataclass
class CheckerResult:
    """One checker of the release, in one returned notebook."""

    grade_id: str
    label: str
    passed: bool
    error: str | None = None  # why it failed
    in_return: str = AS_RELEASED  # the return's copy of the cell: as released, edited or missing
    # The checker's whole message, its hints included (error is its first line): feedback, not a verdict.
    message: str | None = field(default=None, compare=False)


@dataclass
class CellError:
    """A code cell of the return, outside the checkers, that raised."""

    cell_index: int  # in the returned notebook
    error: str  # first line of "ename: evalue"


@dataclass
class NotebookGrade:
    """The result of grading one returned notebook against the release."""

    notebook: str  # file name
    release: str | None = None  # the released notebook it was graded against
    checkers: list[CheckerResult] = field(default_factory=list)
    errored_cells: list[CellError] = field(default_factory=list)
    problem: str | None = None  # why grading could not run it all: unreadable, killed, kernel died, tampered
    student: str | None = None
    assignment: str | None = None  # nbgrader's assignment folder, or the released notebook's name
    # The graded notebook handed back to the student (nbformat's JSON): feedback, not a verdict.
    feedback_notebook: str | None = field(default=None, compare=False, repr=False)

    @property
    def passed(self) -> int:
        return sum(checker.passed for checker in self.checkers)

    @property
    def total(self) -> int:
        return len(self.checkers)

    @property
    def score(self) -> str:
        # A return matched to no notebook was not graded: "0/0" would read like a pass.
        return f"{self.passed}/{self.total}" if self.release is not None else "not graded"


def _error_line(ename: str, evalue: str) -> str:
    text = f"{ename}: {evalue}" if evalue else ename
    return text.split("\n", 1)[0]


def _cell_error(cell) -> str | None:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return _error_line(output.get("ename", ""), output.get("evalue", ""))
    return None


def _checker_label(source: str, grade_id: str) -> str:
    call = CHECKER_CALL.search(source)
    return call.group(1) if call else grade_id


def load_release(folder: str | Path) -> list[ReleasedNotebook]:
    """The checker cells of every notebook in the instructor's ``folder``, by stable id."""
    nbformat = _import_instructor_dependency("nbformat")
    release = []
    for path in _notebooks_in(folder):
        notebook = nbformat.read(path, as_version=4)
        checkers, follows = [], None
        cells = exercise_cells(notebook, path.name)
        for exercise_cell in cells:
            cell = notebook.cells[exercise_cell.cell_index]
            if exercise_cell.role == CHECKER_ROLE:
                checkers.append(ReleasedChecker(
                    grade_id=exercise_cell.grade_id,
                    label=_checker_label(cell.source, exercise_cell.grade_id),
                    source=cell.source,
                    tags=tuple(_tags(cell)),
                    follows=follows,
                ))
            else:
                follows = exercise_cell.grade_id
        release.append(ReleasedNotebook(
            name=path.name,
            checkers=tuple(checkers),
            grade_ids=frozenset(exercise_cell.grade_id for exercise_cell in cells),
        ))
    return release


def _match_release(notebook, file_name: str, release: list[ReleasedNotebook]) -> ReleasedNotebook | None:
    """The released notebook a return comes from: the one sharing most exercise ids with
    it (from nbgrader's metadata, or from its ``### Exercise N.M`` headings when a copy lost
    the metadata), else the one whose name ends the return's file name (``alice_01_x.ipynb``)."""
    ids = {_grade_id(cell) for cell in notebook.cells} if notebook is not None else set()
    if notebook is not None:  # a copy that lost its metadata still has the exercises' headings
        try:
            ids |= {cell.grade_id for cell in exercise_cells(notebook, file_name)}
        except ValueError:  # cells out of order: the metadata and the name are left to match
            pass
    overlap, best = max(((len(ids & released.grade_ids), released) for released in release),
                        key=lambda pair: pair[0], default=(0, None))
    if overlap:
        return best
    by_name = [released for released in release if file_name.endswith(released.name)]
    return max(by_name, key=lambda released: len(released.name), default=None)


def _read_return(path: Path):
    """(notebook, None) or (None, why it cannot be graded)."""
    nbformat = _import_instructor_dependency("nbformat")
    try:
        notebook = nbformat.read(path, as_version=4)
        nbformat.validate(notebook)
    except Exception as error:  # truncated JSON, another kind of file, an invalid notebook
        return None, f"not a readable notebook: {_error_line(type(error).__name__, str(error))}"
    return notebook, None


def _graded_notebook(notebook, released: ReleasedNotebook, seed: int | None, results_path: Path,
                     package_dir: Path = PACKAGE_DIR):
    """The return with its checker cells replaced by the release's, each after its
    solution (at the end if the return lost that too). Returns the notebook, the
    return's index of each of its cells (None for a released checker) and what the
    return had done to each checker cell."""
    nbformat_v4 = _import_instructor_dependency("nbformat.v4")
    by_id = {checker.grade_id: checker for checker in released.checkers}
    in_return = {grade_id: MISSING for grade_id in by_id}
    to_place: dict[str | None, list[ReleasedChecker]] = {}
    for checker in released.checkers:
        to_place.setdefault(checker.follows, []).append(checker)

    def released_cell(checker):
        source = GRADED_CHECKER_SOURCE.format(
            grade_id=checker.grade_id, runner=str(package_dir / FRESH_CHECKER_IN_PACKAGE),
            source=checker.source, seed=seed, results=str(results_path), package=str(package_dir))
        return nbformat_v4.new_code_cell(source, metadata={"tags": list(checker.tags), CHECKER_ID_KEY: checker.grade_id})

    try:  # a copy that lost nbgrader's metadata: the ids its headings give
        derived = {cell.cell_index: cell.grade_id for cell in exercise_cells(notebook, "the return")}
    except ValueError:
        derived = {}
    cells, return_index = [], []
    for cell_index, cell in enumerate(notebook.cells):
        grade_id = _grade_id(cell) or derived.get(cell_index)
        if grade_id in by_id or (cell.cell_type == "code" and CHECKER_TAG in _tags(cell)):
            if in_return.get(grade_id) == MISSING:
                checker = by_id[grade_id]
                same = cell.source.strip() == checker.source.strip() and tuple(_tags(cell)) == checker.tags
                in_return[grade_id] = AS_RELEASED if same else EDITED
            continue  # checkers come from the release
        if cell.cell_type == "code":
            cell.outputs = []  # only this run's outputs count
            cell.execution_count = None
        cells.append(cell)
        return_index.append(cell_index)
        for checker in to_place.pop(grade_id, []) if grade_id else []:
            cells.append(released_cell(checker))
            return_index.append(None)
    for checker in (checker for group in to_place.values() for checker in group):
        cells.append(released_cell(checker))
        return_index.append(None)
    notebook.cells = cells
    return notebook, return_index, in_return


def _execute(notebook, folder: Path, timeout: int, allow_errors: bool) -> None:
    """Run ``notebook`` in a fresh ``python3`` kernel from ``folder``, outputs in place."""
    nbclient = _import_instructor_dependency("nbclient")
    kernelspec = _import_instructor_dependency("jupyter_client.kernelspec")
    client = nbclient.NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name=KERNEL_NAME,
        allow_errors=allow_errors,
        interrupt_on_timeout=allow_errors,
        resources={"metadata": {"path": str(Path(folder).resolve())}},
    )
    try:
        client.execute()
    except kernelspec.NoSuchKernel as error:
        raise RuntimeError(f"no {KERNEL_NAME!r} Jupyter kernel. Install one with: {INSTALL_HINT}") from error


def execute_in_place(paths, timeout: int = DEFAULT_TIMEOUT) -> None:
    """Re-execute notebooks top to bottom and save them with the new outputs.

    This is how the stored outputs are made (on a GPU, by ``make gpu-run``); any cell
    that raises stops it, so a broken notebook is never saved. Cells tagged
    INTERPRETER_OUTPUT draw what only Triton's CPU interpreter can (course_lib.teaching.accesses):
    run on a GPU, they keep the outputs the interpreter made.
    """
    nbformat = _import_instructor_dependency("nbformat")
    for path in map(Path, paths):
        notebook = nbformat.read(path, as_version=4)
        kept = {cell.id: cell.outputs for cell in notebook.cells
                if INTERPRETER_OUTPUT in cell.metadata.get("tags", [])} if ON_GPU else {}
        _execute(notebook, path.parent, timeout, allow_errors=False)
        for cell in notebook.cells:
            if cell.get("id") in kept:
                cell.outputs = kept[cell.id]
        nbformat.write(notebook, path)


def _processes_left(sandboxed: bool) -> list[str]:
    """In a sandbox (its own process namespace, whose first process is bwrap's): the command
    lines of the processes still running there but this one."""
    if not sandboxed:
        return []
    left = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) not in (1, os.getpid()):
            try:
                left.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip())
            except OSError:  # it ended meanwhile
                pass
    return left


def run_graded(graded_path: Path, folder: Path, timeout: int, summary_path: Path, executed_path: Path,
               sandboxed: bool = False) -> None:
    """Execute a graded notebook from ``folder``, going on past errors, and write each
    cell's error (or None), why execution stopped early if it did, and (``sandboxed``) the
    processes the notebook left running, to ``summary_path``; the notebook with its outputs to
    ``executed_path`` (for the student's feedback). Runs in a process of its own, killed at the
    grader's wall-clock limit."""
    nbformat = _import_instructor_dependency("nbformat")
    nbclient = _import_instructor_dependency("nbclient")
    notebook = nbformat.read(graded_path, as_version=4)
    aborted = None
    try:
        _execute(notebook, folder, timeout, allow_errors=True)
    except nbclient.exceptions.DeadKernelError:
        aborted = "the kernel died"
    summary = {"errors": [_cell_error(cell) for cell in notebook.cells], "aborted": aborted,
               "checker_ids": [cell.metadata.get(CHECKER_ID_KEY) for cell in notebook.cells],
               "executed": [cell.get("execution_count") is not None for cell in notebook.cells],
               "left_running": _processes_left(sandboxed)}
    Path(summary_path).write_text(json.dumps(summary), encoding="utf-8")
    nbformat.write(notebook, executed_path)


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (caches aside), by relative path, as bytes: taken once for a
    class, so that each return, and each checking process, gets a fresh copy of the package
    as it was when grading began."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*"))
            if path.is_file() and "__pycache__" not in path.parts}


def _write_snapshot(snapshot: dict[str, bytes], folder: Path) -> None:
    for relative, content in snapshot.items():
        target = folder / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)


def _fresh_package(snapshot: dict[str, bytes], folder: Path) -> Path:
    """A copy of course_lib at ``folder/package/course_lib``, from ``snapshot``."""
    package_copy = folder / "package" / "course_lib"
    _write_snapshot(snapshot, package_copy)
    return package_copy


def _read_results(results_path: Path) -> tuple[dict[str, dict], list[str]]:
    """The checkers' records, first by grade id, and every grade id recorded more than once
    (each released checker writes one record when it runs: a second is a forgery)."""
    results: dict[str, dict] = {}
    repeated = []
    if results_path.exists():
        for line in results_path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
                grade_id = str(record["grade_id"])
            except (ValueError, KeyError, TypeError):
                repeated.append("an unreadable record")
                continue
            if grade_id in results:
                repeated.append(grade_id)
            results.setdefault(grade_id, record)
    return results, repeated


# A checker cell that hands one name to a kernel exercise's or a PyTorch exercise's checker, or
# exercise 5.3's three (two kernels and their torch.library operator): its verdict comes from
# course_lib/teaching/kernel_verdicts.py, run on the answers' source in a process of its own.
KERNEL_CHECKER_CALL = re.compile(r"^\s*exercises\.(check_\w+)\((\w+)\)\s*$")
OPERATOR_CHECKER_CALL = re.compile(r"^\s*exercises\.(check_\w+)\(\s*(\w+)\s*,\s*(\w+)\s*,\s*(\w+)\s*,?\s*\)\s*$")
KERNEL_VERDICTS_IN_PACKAGE = Path("teaching") / "kernel_verdicts.py"
KERNEL_ANSWER, TORCH_ANSWER, OPERATOR_ANSWER = "kernel", "torch", "operator"


def _kernel_checkers(released: ReleasedNotebook) -> dict[str, tuple[str, str | tuple[str, ...], str]]:
    """{grade_id: (check function, answer name, KERNEL_ANSWER, TORCH_ANSWER or OPERATOR_ANSWER)} of
    the release's checkers judged out of the notebook's process: those of the kernel exercises and
    of the PyTorch exercises (``kernel=False``) whose checker cell hands the checker one name, and
    those of kernel_verdicts.OPERATOR_CHECKERS handed three (their answer name: the three names,
    two kernels and the operator)."""
    from .exercises import EXERCISES
    from .kernel_verdicts import OPERATOR_CHECKERS

    kinds = {exercise.checker: KERNEL_ANSWER if exercise.kernel else TORCH_ANSWER for exercise in EXERCISES}
    found = {}
    for checker in released.checkers:
        call = KERNEL_CHECKER_CALL.match(checker.source)
        operator_call = OPERATOR_CHECKER_CALL.match(checker.source)
        if call and call.group(1) in kinds and call.group(1) not in OPERATOR_CHECKERS:
            found[checker.grade_id] = (call.group(1), call.group(2), kinds[call.group(1)])
        elif operator_call and operator_call.group(1) in OPERATOR_CHECKERS and operator_call.group(1) in kinds:
            found[checker.grade_id] = (operator_call.group(1), operator_call.groups()[1:], OPERATOR_ANSWER)
    return found


def _verdict_records(log_path: Path, secret: str) -> list[dict]:
    """The verdicts a checking process printed, each after the secret only the grader knows."""
    if not log_path.exists():
        return []
    return [json.loads(line[len(secret):]) for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines()
            if line.startswith(secret)]


def _kernel_verdicts(return_sources: list[str], kernels: dict[str, tuple[str, str, str]], seed: int | None,
                     scratch: Path, package: dict[str, bytes], sandbox: Sandbox, answer_limit: float,
                     memory_limit: float | None = None) -> dict[str, dict]:
    """{grade_id: record} for each checker of ``kernels`` (:func:`_kernel_checkers`), from its
    answer's source alone, checked (a kernel in Triton's language, a PyTorch answer in the
    grader's PyTorch language, an operator's cell in that language extended by what building
    the operator needs) and run by kernel_verdicts.py in a process that never runs the return's
    other code: started once the return's sandbox is gone, in a sandbox of its own, from a fresh
    copy of the package (``package``, a :func:`_snapshot`) in Python's isolated mode (``-I``: its
    own ``sys.path``, no environment variables read). Each answer has ``answer_limit`` seconds:
    one that hangs is stopped, and the answers after it get a new process."""
    from .kernel_verdicts import NotAKernel, NotPyTorch, kernel_definition, operator_definition, torch_definition

    verdicts, entries = {}, []
    for grade_id, (checker, name, kind) in kernels.items():
        entry = {"grade_id": grade_id, "checker": checker, "kind": kind}
        try:
            if kind == OPERATOR_ANSWER:  # two kernels, and the cell that makes them an operator
                entry.update(name=name[-1], names=list(name),
                             sources=[kernel_definition(return_sources, kernel) for kernel in name[:-1]]
                             + [operator_definition(return_sources, name[:-1], name[-1])])
            else:
                definition = torch_definition if kind == TORCH_ANSWER else kernel_definition
                entry.update(name=name, source=definition(return_sources, name))
            entries.append(entry)
        except (NotAKernel, NotPyTorch) as error:
            message = f"{type(error).__name__}: {error}"
            verdicts[grade_id] = {"grade_id": grade_id, "passed": False, "error": message.split("\n", 1)[0],
                                  "message": message}
    if not entries:
        return verdicts
    folder = scratch / "verdicts"
    package_copy = _fresh_package(package, folder)
    secret = secrets.token_hex(16)
    for attempt in range(len(entries)):  # a new process after each answer stopped at its limit
        remaining = [entry for entry in entries if entry["grade_id"] not in verdicts]
        if not remaining:
            break
        work = folder / f"work_{attempt}"  # its working directory, empty
        work.mkdir()
        spec = folder / f"spec_{attempt}.json"
        spec.write_text(json.dumps({"seed": seed, "kernels": remaining}), encoding="utf-8")
        log = folder / f"log_{attempt}.txt"  # outside the sandbox: only the grader reads it
        command, environment = sandbox.command(
            [sys.executable, "-I", str(package_copy / KERNEL_VERDICTS_IN_PACKAGE), str(package_copy), str(spec)],
            read_only=[package_copy.parent, spec], writable=[work], cwd=work)
        exit_code, killed = run_limited(command, answer_limit, log, environment=environment,
                                        stdin_text=secret + "\n", memory_limit=memory_limit,
                                        progress=lambda: len(_verdict_records(log, secret)),
                                        limit_name="the limit for one answer")
        for record in _verdict_records(log, secret):
            verdicts.setdefault(record["grade_id"], record)
        unjudged = [entry for entry in remaining if entry["grade_id"] not in verdicts]
        why = killed or f"ended with exit code {exit_code}"
        for entry in unjudged[:1] if killed else unjudged:  # killed: the answer it was judging
            answer = "kernel" if entry["kind"] == KERNEL_ANSWER else "answer"
            verdicts[entry["grade_id"]] = {"grade_id": entry["grade_id"], "passed": False,
                                           "error": f"the {answer}'s own checking process {why}, before its verdict"}
    return verdicts


# Errors a return's cell gets when it reaches for what the sandbox keeps from it: the package,
# the system, a folder it may not write. A return that meets one is marked and scores nothing.
SANDBOX_REFUSALS = ("[Errno 30] Read-only file system", "[Errno 13] Permission denied",
                    "[Errno 1] Operation not permitted")


def _run_return(graded, scratch: Path, package_copy: Path, sandbox: Sandbox, timeout: int,
                notebook_timeout: float, memory_limit: float | None) -> tuple[int | None, str | None]:
    """Execute the graded notebook in the sandbox: it sees its package copy and itself read-only,
    its working folder and the folder its checkers write to; nothing else of the grader's."""
    nbformat = _import_instructor_dependency("nbformat")
    graded_path = scratch / "graded.ipynb"
    nbformat.write(graded, graded_path)
    work, out = scratch / "work", scratch / "out"  # the kernel's folder; the checkers' results
    command, environment = sandbox.command(
        [sys.executable, "-m", "course_lib.teaching.instructor", "run-graded", str(graded_path), str(work),
         str(out / SUMMARY_FILE), str(out / EXECUTED_FILE), "--timeout", str(timeout), *(["--sandboxed"] if sandbox.executable else [])],
        read_only=[package_copy.parent, graded_path], writable=[work, out], cwd=work,
        environment={"PYTHONPATH": str(package_copy.parent)})
    return run_limited(command, notebook_timeout, scratch / "log.txt", environment=environment,
                       memory_limit=memory_limit, limit_name="the limit for one notebook")


RESULTS_FILE, SUMMARY_FILE, EXECUTED_FILE = "checkers.jsonl", "summary.json", "executed.ipynb"


def grade_notebook(
    path: str | Path,
    release: list[ReleasedNotebook],
    *,
    seed: int | None = None,
    timeout: int = DEFAULT_TIMEOUT,
    notebook_timeout: float = DEFAULT_NOTEBOOK_TIMEOUT,
    package: dict[str, bytes] | None = None,
    memory_limit_gib: float | None = DEFAULT_MEMORY_LIMIT_GIB,
    sandbox: Sandbox | None = None,
    student: str | None = None,
    assignment: str | None = None,
    grader_paths=(),
) -> NotebookGrade:
    """Grade the returned notebook at ``path`` against the released notebook it comes from.

    The return runs as the student left it, but for its checker cells: every checker of
    the release runs, from the release's source, against ``course_lib.teaching.exercises``
    imported afresh, on hidden inputs drawn from ``seed`` (None: the checkers' own random
    inputs). A checker passes only when it returned. ``timeout`` bounds each cell (the cell
    is interrupted) and each answer judged by its own process; ``notebook_timeout`` the whole
    run, past which the sandbox and everything in it are killed, as they are once they hold
    more than ``memory_limit_gib`` GiB of host memory together (None: no limit).

    The return runs in ``sandbox`` (:func:`find_sandbox` when None), in a scratch folder of its
    own, with a read-only copy of the package made from ``package`` (a :func:`_snapshot` of it,
    taken once for a whole class; now, if None). ``student`` and ``assignment`` (None: from the
    file name, as :func:`student_from_file_name` reads it, and the released notebook) label it.
    A cell that meets the sandbox's walls (SANDBOX_REFUSALS), or names one of ``grader_paths``
    (the release, the other returns) in its error, marks the return tampered: it scores nothing.
    """
    path = Path(path)
    sandbox = sandbox or find_sandbox()
    notebook, problem = _read_return(path)
    released = _match_release(notebook, path.name, release)
    grade = NotebookGrade(notebook=path.name, release=released.name if released else None, problem=problem,
                          student=student or student_from_file_name(path.name, released.name if released else None),
                          assignment=assignment or (Path(released.name).stem if released else None))
    if released is None:
        grade.problem = problem or "matches no notebook of the release"
        return grade
    if notebook is None:
        grade.checkers = [CheckerResult(checker.grade_id, checker.label, False, problem, MISSING)
                          for checker in released.checkers]
        return grade

    package = package if package is not None else _snapshot(PACKAGE_DIR)
    return_sources = [cell.source for cell in notebook.cells if cell.cell_type == "code"]
    kernels = _kernel_checkers(released)
    memory_limit = None if memory_limit_gib is None else memory_limit_gib * 2**30
    # The scratch folder is the grader's: the sandbox sees only the parts of it named below.
    with tempfile.TemporaryDirectory(prefix="course_lib_grading_") as scratch:
        scratch = Path(scratch)
        package_copy = _fresh_package(package, scratch)
        (scratch / "work").mkdir()
        (scratch / "out").mkdir()
        results_path, summary_path = scratch / "out" / RESULTS_FILE, scratch / "out" / SUMMARY_FILE
        executed_path = scratch / "out" / EXECUTED_FILE
        graded, return_index, in_return = _graded_notebook(notebook, released, seed, results_path, package_copy)
        exit_code, killed = _run_return(graded, scratch, package_copy, sandbox, timeout, notebook_timeout,
                                        memory_limit)
        # The return's sandbox, and every process in it, is gone: what it left is only read now.
        results, repeated = _read_results(results_path)
        verdicts = _kernel_verdicts(return_sources, kernels, seed, scratch, package, sandbox, timeout, memory_limit)
        if killed:
            grade.problem = killed
        elif not summary_path.is_file() or summary_path.is_symlink():
            last_line = (scratch / "log.txt").read_text(errors="replace").strip().splitlines()[-1:]
            grade.problem = f"the grading process failed (exit code {exit_code}): {' '.join(last_line)[:200]}"
        else:
            _read_summary(grade, json.loads(summary_path.read_text(encoding="utf-8")), return_index, results, repeated)
        results.update(verdicts)  # a kernel's or PyTorch answer's verdict comes from its own process, whatever
        # the notebook wrote
        outputs = _executed_outputs(executed_path, len(graded.cells))
    refused = [f"cell {cell.cell_index}: {cell.error}" for cell in grade.errored_cells
               if any(refusal in cell.error for refusal in (*SANDBOX_REFUSALS, *map(str, grader_paths)))]
    if refused and not grade.problem:
        grade.problem = "tampered: it reached for what the sandbox keeps from returns (" + "; ".join(refused[:3]) + ")"
    tampered = bool(grade.problem and grade.problem.startswith("tampered"))

    for checker in released.checkers:
        result = results.get(checker.grade_id)
        if result is None:
            error = f"did not finish: {grade.problem}" if grade.problem else "did not run"
        else:
            error = result["error"]
        passed = result is not None and result["passed"] is True and not tampered
        if in_return[checker.grade_id] == MISSING:
            # Counted as failed whatever the answer: the release's copy still ran, for the report.
            ran = "it passed" if passed else error
            passed, error = False, f"checker cell missing from the return (run from the release: {ran})"
        message = result.get("message") if result is not None and not in_return[checker.grade_id] == MISSING else None
        grade.checkers.append(CheckerResult(checker.grade_id, checker.label, passed, error,
                                            in_return[checker.grade_id], message or error))
    grade.feedback_notebook = _feedback_notebook(graded, outputs, released, grade)
    return grade


FEEDBACK_NOTEBOOK_LIMIT = 64 * 2**20  # bytes: a return that printed more is handed back without its outputs


def _executed_outputs(executed_path: Path, cell_count: int) -> list | None:
    """Each graded cell's outputs from the return's run, read once its sandbox is gone; None when
    the run left no readable notebook of those cells (killed, too large, or replaced by the return)."""
    nbformat = _import_instructor_dependency("nbformat")
    if (executed_path.is_symlink() or not executed_path.is_file()
            or executed_path.stat().st_size > FEEDBACK_NOTEBOOK_LIMIT):
        return None
    try:
        executed = nbformat.read(executed_path, as_version=4)
        nbformat.validate(executed)
    except Exception:  # whatever the return left there, it is only feedback
        return None
    if len(executed.cells) != cell_count:
        return None
    return [cell.get("outputs", []) for cell in executed.cells]


def _feedback_notebook(graded, outputs: list | None, released: ReleasedNotebook, grade: NotebookGrade) -> str:
    """The graded notebook, as nbgrader hands back its own: the return's cells with this run's
    outputs (``outputs``; None: none), each checker cell showing the release's source rather than
    the grader's call, after a first cell with the score and each checker's verdict. Those are the
    verdicts that count: a cell may have printed a pass that the answer's own process refused."""
    nbformat = _import_instructor_dependency("nbformat")
    nbformat_v4 = _import_instructor_dependency("nbformat.v4")
    sources = {checker.grade_id: checker.source for checker in released.checkers}
    # Indented lines: text from the return (an error message) stays text, not markdown.
    verdicts = [f"    {exercise_column(checker.grade_id)} {checker.label}: "
                + ("passed" if checker.passed else f"failed: {checker.error}") for checker in grade.checkers]
    problem = [f"**Problem:** {grade.problem}", ""] if grade.problem else []
    summary = nbformat_v4.new_markdown_cell("\n".join([f"# Graded: {grade.score}", "", *problem, *verdicts]))
    cells = [summary]
    for cell, cell_outputs in zip(graded.cells, outputs or [[]] * len(graded.cells)):
        cell = copy.deepcopy(cell)
        grade_id = cell.metadata.pop(CHECKER_ID_KEY, None)
        if grade_id in sources:
            cell.source = sources[grade_id]
        if cell.cell_type == "code":
            cell.outputs = cell_outputs
        cells.append(cell)
    return nbformat.writes(nbformat_v4.new_notebook(cells=cells, metadata=graded.metadata))


def _read_summary(grade: NotebookGrade, summary: dict, return_index: list, results: dict, repeated: list) -> None:
    """What the grading process saw of the run (each cell's error, what ran), checked against
    the checkers' own records: a record no checker could have written marks the return tampered."""
    grade.problem = summary["aborted"]
    for error, index in zip(summary["errors"], return_index):
        if error is not None and index is not None:
            grade.errored_cells.append(CellError(cell_index=index, error=error))
    checker_errors = {cell_id: error for cell_id, error in zip(summary["checker_ids"], summary["errors"])
                      if cell_id is not None}
    ran = {cell_id for cell_id, executed in zip(summary["checker_ids"], summary["executed"])
           if cell_id is not None and executed}
    unexpected = [grade_id for grade_id in results if grade_id not in ran]
    # A checker records a pass only once it has returned, and its cell then ends without
    # error, as the grading process, outside the kernel, sees it: a pass recorded for a
    # cell that raised was written by something else.
    contradicted = [grade_id for grade_id, record in results.items()
                    if record.get("passed") is not False and checker_errors.get(grade_id)]
    if summary.get("left_running"):  # killed with the sandbox; a return has no business leaving them
        grade.problem = f"tampered: it left processes running after its notebook ended: {summary['left_running'][:3]}"
    if repeated or unexpected or contradicted:
        grade.problem = ("tampered: the checkers' results were written by something else than the checkers "
                         f"(repeated: {sorted(set(repeated))[:5]}; of checkers that did not run: "
                         f"{sorted(unexpected)[:5]}; passes of checkers whose cell raised: "
                         f"{sorted(contradicted)[:5]})")


def grade_folder(
    folder: str | Path,
    release_dir: str | Path,
    *,
    seed: int | None = None,
    timeout: int = DEFAULT_TIMEOUT,
    notebook_timeout: float = DEFAULT_NOTEBOOK_TIMEOUT,
    on_start: Callable[[Path], None] | None = None,
    on_graded: Callable[[list[NotebookGrade]], None] | None = None,
    memory_limit_gib: float | None = DEFAULT_MEMORY_LIMIT_GIB,
    sandbox: Sandbox | None = None,
    jobs: int = 1,
) -> list[NotebookGrade]:
    """Grade every return in ``folder`` (nbgrader's ``submitted/<student>/<assignment>/`` or flat:
    :func:`find_returns`) against the notebooks of ``release_dir``, ``jobs`` at a time, each in
    ``sandbox`` (:func:`find_sandbox` when None). ``on_start`` sees each path as it starts,
    ``on_graded`` the grades so far, in the returns' order, after each. Other files (but hidden
    ones) get a row saying they were not graded, and a notebook whose grading fails for any
    reason gets a row saying why: the rest of the folder is graded all the same."""
    from concurrent.futures import ThreadPoolExecutor

    sandbox = sandbox or find_sandbox()
    release = load_release(release_dir)
    returns = find_returns(folder)
    package = _snapshot(PACKAGE_DIR)  # before any return runs: every copy is of the package as it is now
    grader_paths = (Path(folder).resolve(), Path(release_dir).resolve())  # which no return sees

    def grade_return(found: Return) -> NotebookGrade:
        if on_start is not None:
            on_start(found.path)
        if found.path.suffix != ".ipynb":
            return NotebookGrade(notebook=found.path.name, student=found.student or found.path.name,
                                 assignment=found.assignment, problem="not graded: only *.ipynb notebooks are")
        try:
            return grade_notebook(found.path, release, seed=seed, timeout=timeout, notebook_timeout=notebook_timeout,
                                  package=package, memory_limit_gib=memory_limit_gib, sandbox=sandbox,
                                  student=found.student, assignment=found.assignment, grader_paths=grader_paths)
        except Exception as error:  # a fault of the grader's, not the student's: say it, go on
            return NotebookGrade(notebook=found.path.name, student=found.student, assignment=found.assignment,
                                 problem=f"grading failed: {_error_line(type(error).__name__, str(error))}")

    grades = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:  # each return's work is in processes of its own
        for grade in pool.map(grade_return, returns):
            grades.append(grade)
            if on_graded is not None:
                on_graded(grades)
    return grades


def _checker_columns(grade: NotebookGrade) -> list[tuple[str, CheckerResult]]:
    """(column name, result) for each checker; a label called twice gets ``#2``, ``#3``..."""
    seen: dict[str, int] = {}
    columns = []
    for checker in grade.checkers:
        seen[checker.label] = seen.get(checker.label, 0) + 1
        count = seen[checker.label]
        columns.append((checker.label if count == 1 else f"{checker.label}#{count}", checker))
    return columns


def _changed_checkers(grade: NotebookGrade) -> str:
    changed: dict[str, list[str]] = {}
    for name, checker in _checker_columns(grade):
        if checker.in_return != AS_RELEASED:
            changed.setdefault(checker.in_return, []).append(name)
    return "; ".join(f"{state}: {', '.join(names)}" for state, names in changed.items())


def format_table(grades: list[NotebookGrade]) -> str:
    """A plain-text table for the instructor: one row per return with its student, assignment,
    score, ✓/✗ per checker, the checker cells the return had edited or lost, and any problem.
    Checkers are columns, in order of first appearance, so copies of one notebook line up; a
    notebook without a column's checker leaves it blank. What the return's own cells printed or
    raised is left to its feedback page, seen by its student alone."""
    checker_names: list[str] = []
    for grade in grades:
        for name, _ in _checker_columns(grade):
            if name not in checker_names:
                checker_names.append(name)

    header = ["student", "assignment", "score", *checker_names, "checker cells changed", "problem"]
    rows = [header]
    for grade in grades:
        marks = {name: PASSED_MARK if checker.passed else FAILED_MARK for name, checker in _checker_columns(grade)}
        rows.append([grade.student or "", grade.assignment or grade.notebook, grade.score,
                     *(marks.get(name, "") for name in checker_names), _changed_checkers(grade), grade.problem or ""])

    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = [
        "  ".join(text.ljust(width) for text, width in zip(row, widths)).rstrip() for row in rows
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


GRADEBOOK_FILE = "gradebook.csv"


def write_gradebook(grades: list[NotebookGrade], out_dir: str | Path, seed: int | None,
                    commit: str | None = None) -> Path:
    """``out_dir/gradebook.csv`` (:func:`gradebook_csv`) and, per student and assignment, a feedback
    page (``out_dir/feedback/<student>/<assignment>.html``) and the graded notebook beside it
    (``.ipynb``, where the return was run), each written atomically."""
    out_dir = Path(out_dir)
    commit = commit or course_commit(PACKAGE_DIR.parent)
    for grade in grades:
        page = feedback_path(out_dir, grade)
        write_atomically(page, feedback_page(grade, seed, commit))
        if grade.feedback_notebook is not None:
            write_atomically(page.with_suffix(".ipynb"), grade.feedback_notebook)
    return write_atomically(out_dir / GRADEBOOK_FILE, gradebook_csv(grades, seed, commit))


# --- command line -------------------------------------------------------------------


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.teaching.instructor",
        description=(
            "Instructor tools for the course notebooks: make student copies with the "
            "solutions removed, and grade the notebooks students return. "
            f"Needs the instructor-only packages: {INSTALL_HINT}"
        ),
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    student = commands.add_parser(
        "student",
        help="write student copies of the notebooks in a folder",
        description=(
            "Copy every *.ipynb in SRC_DIR (not recursive) into DEST_DIR, replacing each "
            f"'{BEGIN_SOLUTION}' ... '{END_SOLUTION}' block of a cell tagged "
            f"'{SOLUTION_TAG}' with '# YOUR CODE HERE' and 'pass', dropping cells tagged "
            f"'{REMOVE_IN_STUDENT_TAG}', clearing the outputs of solution and checker cells and linking each "
            "exercise to its chapter's solutions page."
        ),
    )
    student.add_argument("src_dir", metavar="SRC_DIR", help="folder of instructor notebooks")
    student.add_argument("dest_dir", metavar="DEST_DIR", help="folder to write the copies to")

    solutions = commands.add_parser(
        "solutions", help="write one solutions page (markdown) a notebook, for the book",
        description="Write DEST_DIR/<notebook>.md for every *.ipynb in SRC_DIR: the code of its solution cells.")
    solutions.add_argument("src_dir", metavar="SRC_DIR", help="folder of instructor notebooks")
    solutions.add_argument("dest_dir", metavar="DEST_DIR", help="folder to write the pages to")
    table = commands.add_parser("exercise-table", help="write the instructors' table of every exercise (markdown)")
    table.add_argument("out", metavar="FILE", help="file to write")

    grade = commands.add_parser(
        "grade",
        help="grade returned notebooks against the release and print a score table",
        description=(
            "Run every returned notebook of SUBMISSIONS_DIR (nbgrader's submitted/<student>/<assignment>/, "
            "or flat, named <student>_<released notebook>), each in a sandbox of its own (bubblewrap), with "
            "the checker cells of the released notebook it comes from (found by their ids) in place of its "
            "own, against course_lib.teaching.exercises imported afresh, on hidden inputs drawn from --seed. "
            "Print per return the checkers passed, the checker cells it had edited or lost and any problem; "
            "write the gradebook and a feedback page per student and assignment to --out. Without "
            "bubblewrap it refuses to run, unless --unsafe. The exit code is 0 whatever the scores; "
            "it is non-zero only when grading itself fails."
        ),
    )
    grade.add_argument(
        "submissions_dir", metavar="SUBMISSIONS_DIR",
        help="folder of returned notebooks: nbgrader's layout (submitted/<student>/<assignment>/) or flat"
    )
    grade.add_argument(
        "--release", metavar="DIR", default="notebooks",
        help="folder of the instructor's notebooks the returns come from (default notebooks)",
    )
    grade.add_argument(
        "--out", metavar="DIR",
        help=f"also write DIR/{GRADEBOOK_FILE} (a row per student and assignment), DIR/feedback/<student>/"
             "<assignment>.html and the graded notebook beside it (.ipynb), rewritten as each return is graded; "
             "DIR must not be inside SUBMISSIONS_DIR",
    )
    grade.add_argument("--jobs", metavar="N", type=int, default=1, help="returns graded at once (default 1)")
    grade.add_argument("--unsafe", action="store_true",
                       help="grade without a sandbox when there is none (the returns' code can then reach "
                            "everything the grader can)")
    grade.add_argument(
        "--seed", metavar="N", type=int,
        help="seed of the checkers' hidden inputs (default: a new one, printed, to grade the same way again)",
    )
    grade.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=int,
        default=DEFAULT_TIMEOUT,
        help=f"longest a single cell, or one answer judged by its own process, may run (default {DEFAULT_TIMEOUT})",
    )
    grade.add_argument(
        "--notebook-timeout", metavar="SECONDS", type=float, default=DEFAULT_NOTEBOOK_TIMEOUT,
        help=f"longest one notebook may run before its process and kernel are killed (default {DEFAULT_NOTEBOOK_TIMEOUT})",
    )
    grade.add_argument(
        "--memory-limit", metavar="GIB", type=float, default=DEFAULT_MEMORY_LIMIT_GIB,
        help="host memory one notebook's processes may hold together before they are killed "
             f"(default {DEFAULT_MEMORY_LIMIT_GIB:g})",
    )
    stamp = commands.add_parser(
        "stamp",
        help="give the exercise cells of notebooks their ids and nbgrader metadata",
        description="Write nbgrader's metadata (grade_id, solution, grade, locked, points) into the "
                    "exercise cells of each notebook, in place; sources and outputs stay as they are.",
    )
    stamp.add_argument("notebooks", metavar="NOTEBOOK", nargs="+", help="notebooks to stamp")
    run_graded_command = commands.add_parser("run-graded", help=argparse.SUPPRESS)
    run_graded_command.add_argument("graded_path", type=Path)
    run_graded_command.add_argument("folder", type=Path)
    run_graded_command.add_argument("summary_path", type=Path)
    run_graded_command.add_argument("executed_path", type=Path)
    run_graded_command.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT)
    run_graded_command.add_argument("--sandboxed", action="store_true")
    execute = commands.add_parser(
        "execute",
        help="re-execute notebooks in place, saving their new outputs",
        description="Run each notebook top to bottom in a fresh kernel and save it; stop at the first error.",
    )
    execute.add_argument("notebooks", metavar="NOTEBOOK", nargs="+", help="notebooks to execute")
    execute.add_argument("--timeout", metavar="SECONDS", type=int, default=DEFAULT_TIMEOUT,
                         help=f"longest a single cell may run (default {DEFAULT_TIMEOUT})")
    return parser


def _grade_command(arguments) -> None:
    sandbox = find_sandbox(unsafe=arguments.unsafe)  # before anything runs: no sandbox, no grading
    seed = arguments.seed if arguments.seed is not None else secrets.randbelow(2**31)
    commit = course_commit(PACKAGE_DIR.parent)
    print(f"sandbox: {sandbox.name}; hidden inputs from seed {seed} (--seed {seed} grades the same way again); "
          f"course at commit {commit}", file=sys.stderr)

    def save(grades):
        latest = grades[-1]
        print(f"  {latest.student} {latest.assignment or latest.notebook}: {latest.score}", file=sys.stderr)
        if arguments.out:
            write_gradebook(grades, arguments.out, seed, commit)

    grades = grade_folder(
        arguments.submissions_dir,
        arguments.release,
        seed=seed,
        timeout=arguments.timeout,
        notebook_timeout=arguments.notebook_timeout,
        memory_limit_gib=arguments.memory_limit,
        on_start=lambda path: print(f"grading {path.parent.name}/{path.name} ...", file=sys.stderr),
        on_graded=save,
        sandbox=sandbox,
        jobs=arguments.jobs,
    )
    print(format_table(grades))
    if arguments.out:
        print(f"wrote {Path(arguments.out) / GRADEBOOK_FILE} and {Path(arguments.out) / 'feedback'}/")


def main(argv: list[str] | None = None) -> int:
    arguments = _build_parser().parse_args(argv)
    try:
        if arguments.command == "student":
            for path in make_student_copies(arguments.src_dir, arguments.dest_dir):
                print(f"wrote {path}")
        elif arguments.command == "solutions":
            for path in make_solutions_pages(arguments.src_dir, arguments.dest_dir):
                print(f"wrote {path}")
        elif arguments.command == "exercise-table":
            Path(arguments.out).parent.mkdir(parents=True, exist_ok=True)
            Path(arguments.out).write_text(exercise_table(), encoding="utf-8")
            print(f"wrote {arguments.out}")
        elif arguments.command == "execute":
            for path in arguments.notebooks:
                print(f"executing {path} ...", file=sys.stderr)
                execute_in_place([path], timeout=arguments.timeout)
        elif arguments.command == "stamp":
            for path in stamp_exercise_metadata(arguments.notebooks):
                print(f"stamped {path}")
        elif arguments.command == "run-graded":
            run_graded(arguments.graded_path, arguments.folder, arguments.timeout, arguments.summary_path,
                       arguments.executed_path, arguments.sandboxed)
        else:
            _grade_command(arguments)
    except (ImportError, OSError, ValueError, RuntimeError) as error:  # SandboxUnavailable too
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
