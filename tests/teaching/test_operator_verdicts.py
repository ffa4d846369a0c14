"""course_lib/teaching/kernel_verdicts.py for exercise 5.3: two kernels and the cell that makes
them a torch.library operator, taken as source, checked (the kernels as Triton's language, the
cell as the grader's PyTorch language extended by what building the operator needs) and judged
in a process of its own whose verdicts carry a secret."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.teaching.kernel_verdicts import (
    OPERATOR_CHECKERS,
    NotAKernel,
    NotPyTorch,
    check_kernel_source,
    check_operator_source,
    kernel_definition,
    operator_definition,
)

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "course_lib"
NAMES = ("scale_columns_forward_kernel", "scale_columns_backward_kernel", "scale_columns_op")
KERNELS, OPERATOR = NAMES[:2], NAMES[2]


def code_cells(path):
    return ["".join(cell["source"]) for cell in json.loads(path.read_text())["cells"] if cell["cell_type"] == "code"]


SOLUTION_CELLS = code_cells(ROOT / "notebooks" / "05_kernel_to_layer.ipynb")
STUDENT_CELLS = code_cells(ROOT / "student" / "05_kernel_to_layer.ipynb")
CELL = operator_definition(SOLUTION_CELLS, KERNELS, OPERATOR)  # the solution's operator cell, kernels blanked
FORWARD_BODY = "    # BEGIN SOLUTION\n    out = torch.empty("  # where the operator's body begins
TOP_LEVEL = "scale_columns_op.register_autograd("  # a top-level statement of the cell


def entry(grade_id, sources):
    """A spec's entry; its operators in a namespace of their own (one process judges all: a
    namespace that holds operators already is refused)."""
    operator_cell = sources[2].replace('"chapter5::', f'"chapter5_{grade_id}::')
    return {"grade_id": grade_id, "checker": "check_scale_columns_op", "kind": "operator", "name": OPERATOR,
            "names": list(NAMES), "sources": [*sources[:2], operator_cell]}


def test_the_solution_and_the_stub_are_taken_as_two_kernels_and_an_operators_cell():
    assert OPERATOR_CHECKERS == {"check_scale_columns_op"}
    for cells in (SOLUTION_CELLS, STUDENT_CELLS):
        cell = operator_definition(cells, KERNELS, OPERATOR)
        assert "@triton.jit" not in cell and "as_operator = torch.library.triton_op" in cell
        check_operator_source(cell, KERNELS, OPERATOR)
        for name in KERNELS:
            check_kernel_source(kernel_definition(cells, name), name)
    # Its lines keep their numbers in the cell: a refusal names the line the student sees.
    solution_cell = next(cell for cell in SOLUTION_CELLS if "def scale_columns_op(" in cell)
    assert len(CELL.splitlines()) == len(solution_cell.splitlines())
    assert CELL.splitlines()[-1] == solution_cell.splitlines()[-1]


def test_the_operator_is_taken_from_the_last_cell_that_defines_it():
    with pytest.raises(NotPyTorch, match=re.escape("no top-level `def scale_columns_op(...)` in the notebook")):
        operator_definition(SOLUTION_CELLS + ["scale_columns_op = None"], KERNELS, OPERATOR)
    assert operator_definition(SOLUTION_CELLS + ["%%time\nnot python"], KERNELS, OPERATOR) == CELL


@pytest.mark.parametrize("where, code, refused", [
    ("body", "    import sys\n", "uses Import (line"),
    ("body", "    frame = sys._getframe()\n", "reads `._getframe`"),
    ("body", "    frame = sys\n", "reads `sys` (line"),
    ("body", "    f = x.__class__\n", "reads `.__class__`"),
    ("body", "    scale_columns_forward_kernel.run = print\n", "sets `.run`"),
    ("body", "    fn = scale_columns_forward_kernel.fn\n", "reads `.fn`"),
    ("body", "    lib = torch.library.Library('chapter5', 'FRAGMENT')\n", "uses `torch.library.Library`"),
    ("body", "    torch.library.define('chapter5::other', '(Tensor x) -> Tensor')\n", "uses `torch.library.define`"),
    ("body", "    op = torch.ops.aten.mul\n", "uses `torch.ops`"),
    ("body", "    g = triton.runtime\n", "uses `triton.runtime`"),
    ("body", "    r = runtime.launch\n", "uses `runtime.launch`"),
    ("body", "    make = torch.library.custom_op('chapter5::again', mutates_args=())\n",
     "uses `torch.library.custom_op` (line"),
    ("body", "    make = as_operator\n", "uses `as_operator` (line"),
    ("body", "    ctx.shape = x.shape\n", "sets `.shape`"),
    ("body", "    f = getattr(x, 'shape')\n", "calls the builtin `getattr`"),
    ("top", "import os\n", "uses Import (line"),
    ("top", "for i in range(3):\n    pass\n", "uses For (line"),
    ("top", "class A:\n    pass\n", "uses ClassDef (line"),
    ("top", "scale_columns_op.name = 'x'\n", "assigns to scale_columns_op.name"),
    ("top", "scale_columns_forward_kernel = None\n", "binds `scale_columns_forward_kernel`"),
    ("top", "torch = None\n", "binds `torch`"),
    ("top", "maker = print if runtime.ON_GPU else torch.library.custom_op\n", "uses `torch.library.custom_op` (line"),
    ("top", "@as_operator('aten::scale_twice', mutates_args=())\ndef twice(x: torch.Tensor) -> torch.Tensor:\n"
            "    return x * 2\n", "in the namespace 'aten', which holds operators already"),
    ("top", "@as_operator(name, mutates_args=())\ndef twice(x: torch.Tensor) -> torch.Tensor:\n    return x * 2\n",
     "without naming it by one string"),
    ("top", "@as_operator('chapter5::twice', mutates_args=(), device_types='cpu')\n"
            "def twice(x: torch.Tensor) -> torch.Tensor:\n    return x * 2\n", "with `device_types=`"),
    ("top", "maker = lambda name: torch.library.custom_op('aten::twice', mutates_args=())\n",
     "uses `torch.library.custom_op` (line"),
    ("top", "@print\ndef twice(x):\n    return x * 2\n", "is decorated @print"),
    ("top", "def twice(x):\n    @as_operator('chapter5::twice', mutates_args=())\n    def inner(x: torch.Tensor) -> "
            "torch.Tensor:\n        return x\n    return inner\n", "uses `as_operator` (line"),
])
def test_python_beyond_building_the_operator_is_refused_by_name(where, code, refused):
    cell = CELL.replace(FORWARD_BODY, code + FORWARD_BODY) if where == "body" else CELL.replace(TOP_LEVEL,
                                                                                                code + TOP_LEVEL)
    assert cell != CELL
    with pytest.raises(NotPyTorch, match=re.escape(refused)):
        check_operator_source(cell, KERNELS, OPERATOR)


def test_a_refusal_names_the_line_of_the_cell():
    cell = CELL.replace(FORWARD_BODY, "    import sys\n" + FORWARD_BODY)
    line = cell.splitlines().index("    import sys") + 1
    with pytest.raises(NotPyTorch, match=re.escape(f"the cell of `scale_columns_op` uses Import (line {line})")):
        check_operator_source(cell, KERNELS, OPERATOR)


def test_a_kernel_of_the_operator_is_checked_as_a_kernel():
    forward = kernel_definition(SOLUTION_CELLS, KERNELS[0])
    with pytest.raises(NotAKernel, match="uses Import"):
        check_kernel_source(forward.replace("    rows = ", "    import sys\n    rows = ", 1), KERNELS[0])


STACK_FORGER = (
    "    import json, sys\n"
    "    frame = sys._getframe()\n"
    "    while 'results_path' not in frame.f_locals:\n"
    "        frame = frame.f_back\n"
)


def test_verdicts_come_with_the_secret_and_a_forging_operator_is_refused(tmp_path):
    kernels = [kernel_definition(SOLUTION_CELLS, name) for name in KERNELS]
    wrong = CELL.replace("return grad_x, partial.sum(dim=0)", "return grad_x, 2 * partial.sum(dim=0)")
    assert wrong != CELL
    spec = {"seed": 5, "kernels": [
        entry("right", kernels + [CELL]),
        entry("wrong", kernels + [wrong]),
        entry("forger", kernels + [CELL.replace(FORWARD_BODY, STACK_FORGER + FORWARD_BODY)]),
        entry("stub", [kernel_definition(STUDENT_CELLS, name) for name in KERNELS]
              + [operator_definition(STUDENT_CELLS, KERNELS, OPERATOR)]),
    ]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    run = subprocess.run([sys.executable, str(PACKAGE / "teaching" / "kernel_verdicts.py"), str(PACKAGE),
                          str(tmp_path / "spec.json")], input="0123abcd\n", capture_output=True, text=True,
                         cwd=tmp_path, timeout=600)
    verdicts = {json.loads(line[len("0123abcd"):])["grade_id"]: json.loads(line[len("0123abcd"):])
                for line in run.stdout.splitlines() if line.startswith("0123abcd")}
    assert {grade_id: verdict["passed"] for grade_id, verdict in verdicts.items()} == {
        "right": True, "wrong": False, "forger": False, "stub": False}, run.stdout + run.stderr
    assert verdicts["wrong"]["error"].startswith("ExerciseError: Exercise 5.3 (scale_columns_op): the grad of w"), \
        verdicts["wrong"]
    line = CELL.replace(FORWARD_BODY, STACK_FORGER + FORWARD_BODY).splitlines().index("    import json, sys") + 1
    assert verdicts["forger"]["error"] == (f"NotPyTorch: the cell of `scale_columns_op` uses Import (line {line}), "
                                           "which a PyTorch answer does not need")
    assert verdicts["stub"]["error"].startswith("ExerciseError: Exercise 5.3"), verdicts["stub"]
