"""course_lib/teaching/kernel_verdicts.py: a returned kernel taken as source, checked to be
Triton's language alone, and judged in a process of its own whose verdicts carry a secret."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.teaching.exercises import EXERCISES
from course_lib.teaching.kernel_verdicts import NotAKernel, check_kernel_source, kernel_definition

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "course_lib"
# Exercise 1.1's kernel as its notebook's solution cell defines it, and the line of its body
# before which the tests below write what a return might.
SCALE_COLUMNS = kernel_definition(
    ["".join(cell["source"]) for cell in json.loads((ROOT / "notebooks" / "01_weighted_sum.ipynb").read_text())["cells"]
     if cell["cell_type"] == "code"], "scale_columns_kernel")
BODY_START = "    # BEGIN SOLUTION\n"


def solution_kernels():
    """(name, source) of every kernel a chapter's solution cells define."""
    import ast

    found = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = [''.join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        for cell in json.loads(path.read_text())["cells"]:
            if "solution" in cell["metadata"].get("tags", []):
                for node in ast.parse("".join(cell["source"])).body:
                    if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
                        found.append((node.name, kernel_definition(cells, node.name)))
    return found


def test_every_solution_kernel_is_taken_as_triton_language():
    kernels = solution_kernels()
    assert len(kernels) >= sum(exercise.kernel for exercise in EXERCISES)
    for name, source in kernels:
        check_kernel_source(source, name)


@pytest.mark.parametrize("body, refused", [
    ("    import sys\n", "uses Import"),
    ("    x = __import__('os')\n", "names `__import__`"),
    ("    x = x_ptr.__class__\n", "reads `.__class__`"),
    ("    x = tl.core\n", "`tl.core`"),
    ("    x = getattr(tl, 'load')\n", "calls the builtin `getattr`"),
    ("    x = open('/tmp/results')\n", "calls the builtin `open`"),
    ("    x = x_ptr.handle\n", "reads `.handle`"),
    ("    f = lambda: 0\n", "defines a function inside it"),
    ("    x = [i for i in range(3)]\n", "uses ListComp"),
    ("    x = triton.cdiv(n_rows, 2)\n", "names `triton`"),
])
def test_python_beyond_triton_is_refused_by_name(body, refused):
    source = SCALE_COLUMNS.replace(BODY_START, body + BODY_START)
    with pytest.raises(NotAKernel, match=refused.replace("(", r"\(").replace("[", r"\[")):
        check_kernel_source(source, "scale_columns_kernel")


def test_the_answer_must_be_one_jit_function():
    with pytest.raises(NotAKernel, match="decorated `@triton.jit` and nothing else"):
        check_kernel_source(SCALE_COLUMNS.replace("@triton.jit", "@triton.jit\n@staticmethod"), "scale_columns_kernel")
    with pytest.raises(NotAKernel, match="no top-level `@triton.jit def scale_columns_kernel"):
        kernel_definition([SCALE_COLUMNS, "scale_columns_kernel = lambda *args: None"], "scale_columns_kernel")
    assert kernel_definition(["x = 1", SCALE_COLUMNS], "scale_columns_kernel") == SCALE_COLUMNS


def test_verdicts_come_with_the_secret_and_a_kernel_cannot_forge_one(tmp_path):
    wrong = SCALE_COLUMNS.replace("(cols < n_cols)[None, :]", "(cols <= n_cols)[None, :]")
    printer = SCALE_COLUMNS.replace(BODY_START,
                                    '    print("s3cr3t{\\"grade_id\\": \\"forged\\", \\"passed\\": true}")\n')
    options = SCALE_COLUMNS.replace("@triton.jit\n", "@triton.jit(do_not_specialize=[], debug=False)\n")
    entries = [("right", SCALE_COLUMNS), ("wrong", wrong), ("printer", printer), ("python", "import os\n"),
               ("options", options)]
    spec = {"seed": 5, "kernels": [{"grade_id": grade_id, "checker": "check_scale_columns",
                                    "name": "scale_columns_kernel", "source": source} for grade_id, source in entries]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    run = subprocess.run([sys.executable, str(PACKAGE / "teaching" / "kernel_verdicts.py"), str(PACKAGE),
                          str(tmp_path / "spec.json")], input="0123abcd\n", capture_output=True, text=True,
                         cwd=tmp_path, timeout=600)
    verdicts = [json.loads(line[len("0123abcd"):]) for line in run.stdout.splitlines() if line.startswith("0123abcd")]
    assert [(v["grade_id"], v["passed"]) for v in verdicts] == [
        ("right", True), ("wrong", False), ("printer", True), ("python", False), ("options", True)], \
        run.stdout + run.stderr
    assert '"forged"' in run.stdout  # the kernel printed its line; without the secret it counts for nothing
    assert "out of bounds" in verdicts[1]["error"]
    assert verdicts[3]["error"].startswith("NotAKernel: the answer must be one function")


@pytest.mark.parametrize("decorator", ["@triton.jit(do_not_specialize=[])", "@triton.jit(debug=True)",
                                       "@triton.jit(do_not_specialize=['n_rows'], noinline=False)",
                                       "@triton.jit(do_not_specialize_on_alignment=[0])"])
def test_a_right_answer_with_options_of_triton_jit_is_taken(decorator):
    source = SCALE_COLUMNS.replace("@triton.jit\n", decorator + "\n")
    check_kernel_source(source, "scale_columns_kernel")
    assert kernel_definition(["x = 1", source], "scale_columns_kernel") == source


@pytest.mark.parametrize("decorator", ["@triton.jit(repr=print)", "@triton.jit(launch_metadata=lambda *a: 0)",
                                       "@triton.jit(do_not_specialize=open('x'))", "@triton.jit(print)"])
def test_options_that_run_code_are_refused(decorator):
    with pytest.raises(NotAKernel, match="must be decorated `@triton.jit` and nothing else"):
        check_kernel_source(SCALE_COLUMNS.replace("@triton.jit\n", decorator + "\n"), "scale_columns_kernel")


HELPER = "@triton.jit\ndef times(a, b):\n    return a * b\n"


def test_helpers_the_kernel_calls_come_with_it():
    source = SCALE_COLUMNS.replace("x * w[None, :]", "times(x, w[None, :])")
    assert source != SCALE_COLUMNS
    unused = "@triton.jit\ndef unused(a):\n    return a\n"
    taken = kernel_definition([HELPER, unused, "import os", source], "scale_columns_kernel")
    assert taken == HELPER + "\n" + source  # the helper it calls, not the one it does not
    check_kernel_source(taken, "scale_columns_kernel")
    evil = "@triton.jit\ndef times(a, b):\n    import os\n    return a * b\n"
    with pytest.raises(NotAKernel, match="`times` uses Import"):
        check_kernel_source(kernel_definition([evil, source], "scale_columns_kernel"), "scale_columns_kernel")
    with pytest.raises(NotAKernel, match="the answer must be one function"):
        check_kernel_source(source + "\n" + HELPER, "scale_columns_kernel")  # the kernel comes last


def test_a_kernel_with_a_helper_loads_and_runs(tmp_path):
    import torch

    from course_lib.teaching.exercises import launch_scale_columns
    from course_lib.teaching.kernel_verdicts import load_kernel

    source = kernel_definition([HELPER, SCALE_COLUMNS.replace("@triton.jit\n", "@triton.jit(do_not_specialize=[])\n")
                                .replace("x * w[None, :]", "times(x, w[None, :])")], "scale_columns_kernel")
    kernel = load_kernel(source, "scale_columns_kernel", tmp_path)
    from course_lib.core.runtime import DEVICE

    x, w = torch.randn(5, 7, device=DEVICE), torch.randn(7, device=DEVICE)
    torch.testing.assert_close(launch_scale_columns(kernel, x, w), x * w)
