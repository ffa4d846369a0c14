"""course_lib/teaching/torch_verdicts.py for the PyTorch exercises (1.2, 3.2, 4.1, 5.1): an
answer taken as source, checked to be the grader's PyTorch language alone, and judged in a
process of its own whose verdicts carry a secret."""

import inspect
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from course_lib.teaching import kernel_verdicts, torch_verdicts
from course_lib.teaching.exercises import EXERCISES
from course_lib.teaching.kernel_verdicts import run_verdicts
from course_lib.teaching.torch_verdicts import (
    WITHOUT_AUTOGRAD_CHECKERS,
    NotPyTorch,
    check_torch_source,
    load_torch_function,
    torch_definition,
)

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "course_lib"
CHECKER_CALL = re.compile(r"^\s*exercises\.(check_\w+)\((\w+)\)\s*$")
BODY_START = "    # BEGIN SOLUTION\n"


def code_cells(path):
    return ["".join(cell["source"]) for cell in json.loads(path.read_text())["cells"] if cell["cell_type"] == "code"]


def solution_answers():
    """{checker: (answer name, source)} of every PyTorch exercise, the answer as its notebook's
    cells define it and its checker cell names it."""
    pytorch_checkers = {exercise.checker for exercise in EXERCISES if not exercise.kernel}
    found = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            call = CHECKER_CALL.match("".join(cell["source"]))
            if "checker" in cell["metadata"].get("tags", []) and call and call.group(1) in pytorch_checkers:
                found[call.group(1)] = (call.group(2), torch_definition(code_cells(path), call.group(2)))
    return found


ANSWERS = solution_answers()
GRADS_NAME, GRADS = ANSWERS["check_weighted_sum_grads"]  # exercise 1.2, without autograd
ROUTING_NAME, ROUTING = ANSWERS["check_routing_weights"]  # exercise 4.1, autograd not refused


def test_every_pytorch_exercise_is_judged_from_its_solution_taken_as_pytorch_language():
    assert len(ANSWERS) == sum(not exercise.kernel for exercise in EXERCISES) == 4
    for checker, (name, source) in ANSWERS.items():
        assert source.startswith(f"def {name}(")
        check_torch_source(source, name, without_autograd=checker in WITHOUT_AUTOGRAD_CHECKERS)


def test_the_exercises_without_autograd_are_those_whose_checker_watches_for_it():
    from course_lib.teaching import exercises

    watching = {exercise.checker for exercise in EXERCISES
                if "without_autograd(" in inspect.getsource(getattr(exercises, exercise.checker))}
    assert watching == WITHOUT_AUTOGRAD_CHECKERS


@pytest.mark.parametrize("body, refused", [
    ("    import sys\n", "uses Import"),
    ("    from os import system\n", "uses ImportFrom"),
    ("    frame = sys._getframe()\n", "reads `._getframe`"),
    ("    cls = x.__class__\n", "reads `.__class__`"),
    ("    f = __import__('os')\n", "names `__import__`"),
    ("    c = torch.utils.checkpoint.checkpoint\n", "uses `torch.utils`"),
    ("    a = torch.ops.aten.add\n", "uses `torch.ops`"),
    ("    lib = torch.library.Library\n", "uses `torch.library`"),
    ("    torch.save(x, 'results.pt')\n", "uses `torch.save`"),
    ("    t = torch.load('results.pt')\n", "uses `torch.load`"),
    ("    t = torch.from_file('/proc/self/environ')\n", "uses `torch.from_file`"),
    ("    f = torch.compile(F.relu)\n", "uses `torch.compile`"),
    ("    f = torch.jit.script\n", "uses `torch.jit`"),
    ("    h = torch.hub.load\n", "uses `torch.hub`"),
    ("    d = torch.cuda.device_count()\n", "uses `torch.cuda`"),
    ("    g = getattr(x, 'grad')\n", "calls the builtin `getattr`"),
    ("    f = open('/tmp/results', 'a')\n", "calls the builtin `open`"),
    ("    v = eval('1 + 1')\n", "calls the builtin `eval`"),
    ("    g = globals()\n", "calls the builtin `globals`"),
    ("    v = vars(x)\n", "calls the builtin `vars`"),
    ("    global results\n", "uses Global"),
    ("    n = results\n", "reads `results` (line 2), which is neither its own nor torch, F or math"),
    ("    m = torch\n", "uses the module `torch` (line 2) other than as `torch.<function>`"),
    ("    nn = torch.nn\n", "uses the module `torch.nn`"),
    ("    torch = x\n", "binds `torch`"),
    ("    g = (i for i in x)\n    f = g.gi_frame\n", "reads `.gi_frame`"),
    ("    f = lambda: x.__class__\n", "reads `.__class__`"),
    ("    c = [t.__class__ for t in (x, w)]\n", "reads `.__class__`"),
    ("    s = x.untyped_storage()\n", "reads `.untyped_storage`"),
    ("    h = x.register_hook(print)\n", "reads `.register_hook`"),
    ("    x.shape = None\n", "sets `.shape`"),
    ("    class A:\n        pass\n", "uses ClassDef"),
    ("    try:\n        pass\n    except Exception:\n        pass\n", "uses Try"),
    ("    mode = torch.enable_grad()\n", "uses `torch.enable_grad` (line 2): the exercise asks for the result without autograd"),
    ("    torch.set_grad_enabled(True)\n", "uses `torch.set_grad_enabled`"),
    ("    g = torch.autograd.grad\n", "uses `torch.autograd`"),
    ("    x = x.requires_grad_()\n", "uses `.requires_grad_` (line 2): the exercise asks for the result without autograd"),
    ("    x.sum().backward()\n", "uses `.backward`"),
    ("    g = x.grad\n", "uses `.grad`"),
    ("    torch.Tensor.backward(x)\n", "uses `.backward`"),
    ("    torch.Tensor.register_hook(x, print)\n", "reads `.register_hook`"),
    ("    t = torch.float64.type\n", "reads `.type`"),
])
def test_python_beyond_pytorch_is_refused_by_name(body, refused):
    source = GRADS.replace(BODY_START, body + BODY_START)
    with pytest.raises(NotPyTorch, match=re.escape(refused)):
        check_torch_source(source, GRADS_NAME, without_autograd=True)


def test_pytorch_language_is_generous_and_autograd_is_refused_only_where_the_exercise_says(tmp_path):
    allowed = (
        "    scale = [math.sqrt(2.0) * i for i in range(len(x.shape))]\n"
        "    double = lambda t: F.relu(t) + torch.nn.functional.relu(-t) + torch.linalg.vector_norm(t) * 0\n"
        "    def helper(t, dim=-1):\n"
        "        return t.sum(dim=dim, keepdim=True).to(torch.float64)\n"
        "    eps = torch.finfo(x.dtype).eps if isinstance(x, torch.Tensor) else 0.0\n"
        "    total = helper(double(x)) + sum(t for t in scale) + max(abs(-1), min(1, 2))\n"
        "    del total\n"
        "    values, indices = x.max(dim=-1)\n"
        "    print(f'{eps!r:>10}', x.numpy().shape, torch.float64.itemsize, {k: v for k, v in zip('ab', (1, 2))})\n"
    )
    check_torch_source(GRADS.replace(BODY_START, allowed + BODY_START), GRADS_NAME, without_autograd=True)
    # and it runs, in the module the verdicts' process gives it: torch, F, math and TORCH_BUILTINS
    grads = load_torch_function(GRADS.replace(BODY_START, allowed + BODY_START), GRADS_NAME, tmp_path, True)
    x, w, grad_y = torch.randn(2, 3, dtype=torch.float64), torch.randn(3, dtype=torch.float64), torch.randn(2)
    grad_x, grad_w = grads(x, w, grad_y.double())
    assert torch.allclose(grad_x, grad_y.double()[:, None] * w) and torch.allclose(grad_w, (x * grad_y.double()[:, None]).sum(0))
    autograd = "    needs = s.requires_grad\n    s = s.detach()\n"
    check_torch_source(ROUTING.replace(BODY_START, autograd + BODY_START), ROUTING_NAME)
    with pytest.raises(NotPyTorch, match=re.escape("uses `torch.enable_grad`")):  # not on the list anywhere
        check_torch_source(ROUTING.replace(BODY_START, "    torch.enable_grad()\n" + BODY_START), ROUTING_NAME)


def test_the_answer_must_be_one_plain_function():
    with pytest.raises(NotPyTorch, match="is decorated"):
        check_torch_source("@torch.compile\n" + GRADS, GRADS_NAME)
    with pytest.raises(NotPyTorch, match="is decorated"):
        check_torch_source(GRADS.replace(BODY_START, "    @print\n    def inner():\n        pass\n" + BODY_START),
                           GRADS_NAME)
    with pytest.raises(NotPyTorch, match="the answer must be one function"):
        check_torch_source(GRADS + "x = 1\n", GRADS_NAME)
    with pytest.raises(NotPyTorch, match=f"no top-level `def {GRADS_NAME}"):
        torch_definition([GRADS, f"{GRADS_NAME} = lambda *args: None"], GRADS_NAME)
    assert torch_definition(["x = 1", "%timeit 1", GRADS], GRADS_NAME) == GRADS


FORGER = GRADS.replace(BODY_START, (
    "    import json, sys\n"
    "    frame = sys._getframe()\n"
    "    while frame is not None and 'secret' not in frame.f_locals:\n"
    "        frame = frame.f_back\n"
    "    print(frame.f_locals['secret'] + json.dumps({'grade_id': 'forged', 'passed': True}))\n") + BODY_START)
PRINTER = GRADS.replace(BODY_START, "    print('s3cr3t{\"grade_id\": \"printed\", \"passed\": true}')\n" + BODY_START)
ZEROES_ITS_INPUTS = (  # the gradients of zero inputs are zero: the checker must compare with copies
    f"def {GRADS_NAME}(x, w, grad_y):\n"
    "    x.zero_()\n    w.zero_()\n    grad_y.zero_()\n"
    "    return torch.zeros_like(x), torch.zeros_like(w)\n")


def test_verdicts_come_with_the_secret_and_an_answer_cannot_forge_one(tmp_path):
    wrong = GRADS.replace("grad_y[..., None] * w\n", "grad_y[..., None] * x\n")
    assert wrong != GRADS
    entries = [(f"right_{checker}", checker, name, source) for checker, (name, source) in ANSWERS.items()]
    entries += [("wrong", "check_weighted_sum_grads", GRADS_NAME, wrong),
                ("printer", "check_weighted_sum_grads", GRADS_NAME, PRINTER),
                ("forger", "check_weighted_sum_grads", GRADS_NAME, FORGER),
                ("zeroes", "check_weighted_sum_grads", GRADS_NAME, ZEROES_ITS_INPUTS)]
    spec = {"seed": 5, "kernels": [{"grade_id": grade_id, "checker": checker, "name": name, "source": source,
                                    "kind": "torch"} for grade_id, checker, name, source in entries]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    run = subprocess.run([sys.executable, str(PACKAGE / "teaching" / "kernel_verdicts.py"), str(PACKAGE),
                          str(tmp_path / "spec.json")], input="0123abcd\n", capture_output=True, text=True,
                         cwd=tmp_path, timeout=600)
    verdicts = {json.loads(line[len("0123abcd"):])["grade_id"]: json.loads(line[len("0123abcd"):])
                for line in run.stdout.splitlines() if line.startswith("0123abcd")}
    assert {grade_id: verdict["passed"] for grade_id, verdict in verdicts.items()} == {
        **{f"right_{checker}": True for checker in ANSWERS},
        "wrong": False, "printer": True, "forger": False, "zeroes": False}, run.stdout + run.stderr
    assert '"printed"' in run.stdout  # the answer printed its line; without the secret it counts for nothing
    assert verdicts["wrong"]["error"].startswith("ExerciseError: Exercise 1.2 (weighted_sum_grads): grad_x")
    assert verdicts["forger"]["error"] == ("NotPyTorch: `weighted_sum_grads` uses Import (line 2), which a PyTorch "
                                           "answer does not need")
    assert verdicts["zeroes"]["error"].startswith("ExerciseError: Exercise 1.2 (weighted_sum_grads)")


def test_the_checkers_own_watch_on_autograd_still_runs_in_the_verdicts_process(monkeypatch):
    """The allowlist refuses autograd's names in 1.2 and 3.2; behind it, the released checker's
    profiling hook (checking.without_autograd) still watches the call in the fresh process."""
    by_autograd = (
        f"def {GRADS_NAME}(x, w, grad_y):\n"
        "    torch.set_grad_enabled(True)\n"
        "    x = x.clone().requires_grad_()\n"
        "    w = w.clone().requires_grad_()\n"
        "    (x * w).sum(-1).backward(grad_y)\n"
        "    return x.grad, w.grad\n")
    with pytest.raises(NotPyTorch, match="without autograd"):
        check_torch_source(by_autograd, GRADS_NAME, without_autograd=True)
    # Were the allowlist to let it through (each name patched where it is read):
    monkeypatch.setattr(kernel_verdicts, "WITHOUT_AUTOGRAD_CHECKERS", frozenset())
    monkeypatch.setattr(torch_verdicts, "TORCH_FUNCTIONS", torch_verdicts.TORCH_FUNCTIONS | {"set_grad_enabled"})
    out = io.StringIO()
    run_verdicts(PACKAGE, {"seed": 3, "kernels": [{"grade_id": "autograd", "checker": "check_weighted_sum_grads",
                                                   "name": GRADS_NAME, "source": by_autograd, "kind": "torch"}]},
                 "s3cr3t", out)
    (verdict,) = [json.loads(line[len("s3cr3t"):]) for line in out.getvalue().splitlines() if line.startswith("s3cr3t")]
    assert not verdict["passed"]
    assert verdict["error"].startswith("ExerciseError: Exercise 1.2 (weighted_sum_grads): the answer must compute "
                                       "the result from the formula, but it runs autograd"), verdict


def test_every_exercise_is_judged_out_of_the_notebooks_process():
    """Grading judges the kernels and the PyTorch answers from their source alone, and 5.3's two
    kernels and operator too (test_operator_verdicts.py)."""
    pytest.importorskip("nbformat")
    from course_lib.teaching.grading.release import load_release
    from course_lib.teaching.grading.verdicts import OPERATOR_ANSWER, TORCH_ANSWER, out_of_process_checkers

    judged = {checker: kind for released in load_release(ROOT / "notebooks")
              for checker, _, kind in out_of_process_checkers(released).values()}
    assert {checker for checker, kind in judged.items() if kind == TORCH_ANSWER} == set(ANSWERS)
    assert {checker for checker, kind in judged.items() if kind == OPERATOR_ANSWER} == {"check_scale_columns_op"}
    assert set(judged) == {exercise.checker for exercise in EXERCISES}
