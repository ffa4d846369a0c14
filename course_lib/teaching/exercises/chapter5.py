"""Checkers of chapter 5, from kernel to layer: one function an exercise."""

import torch

from ...core.runtime import DEVICE
from ..checking import ExerciseError, compare, run_student_code
from .common import Exercise, hidden_case, random_size

__all__ = ["check_scale_columns_op", "check_scale_columns_autograd", "check_without_graph_breaks"]
# The chapter's exercises, in order, for the instructors' notes.
EXERCISES = (
    Exercise('5.1', 'a custom operator', 'check_scale_columns_op', kernel=False, skills='torch.library custom operators, fake tensors', difficulty=2, minutes=20),
    Exercise('5.2', 'its backward', 'check_scale_columns_autograd', kernel=False, skills='register_autograd', difficulty=2, minutes=20),
    Exercise('5.3', 'remove a graph break', 'check_without_graph_breaks', kernel=False, skills='torch.compile graph breaks', difficulty=2, minutes=20),
)



def _require_custom_op(name, op):
    if not isinstance(op, torch._library.custom_ops.CustomOpDef):
        raise ExerciseError(f"{name}: pass the operator that @torch.library.custom_op made, got {type(op).__name__}")


def _opcheck(name, op, args, what):
    """torch.library.opcheck, its failure told as which of its tests failed and why."""
    try:
        torch.library.opcheck(op, args)
    except torch.testing._internal.optests.OpCheckError as error:
        first_line = str(error).strip().splitlines()[0]
        raise ExerciseError(f"{name}: torch.library.opcheck failed {what}: {first_line}") from error


def check_scale_columns_op(scale_columns_op):
    """Exercise 5.1: a custom operator out = x * w[None, :] with a fake implementation."""
    name = "Exercise 5.1 (scale_columns_op)"
    _require_custom_op(name, scale_columns_op)
    cases = [(1, 1), (5, 3), (37, 130)] + hidden_case(lambda: (random_size(2, 60), random_size(2, 150)))
    for shape in cases:
        x = torch.randn(shape, device=DEVICE)
        w = torch.randn(shape[1], device=DEVICE)
        got = run_student_code(name, scale_columns_op, x, w)
        compare(f"{name}, x of shape {shape}", got, x.double() * w.double(), rtol=1e-6, atol=1e-6)
    from torch._subclasses.fake_tensor import FakeTensorMode

    real = run_student_code(name, scale_columns_op, torch.randn(6, 7, device=DEVICE), torch.randn(7, device=DEVICE))
    with FakeTensorMode() as mode:
        x, w = mode.from_tensor(torch.randn(6, 7, device=DEVICE)), mode.from_tensor(torch.randn(7, device=DEVICE))
        try:
            fake = scale_columns_op(x, w)
        except Exception as error:  # no fake registered, or one that fails
            raise ExerciseError(f"{name}: on fake tensors (what torch.compile traces with) the operator raised "
                                f"{type(error).__name__}: register a fake implementation with "
                                "@scale_columns_op.register_fake") from error
        if not isinstance(fake, torch.Tensor) or (fake.shape, fake.dtype, fake.device) != (x.shape, x.dtype, x.device):
            got = (tuple(fake.shape), fake.dtype, fake.device) if isinstance(fake, torch.Tensor) else fake
            raise ExerciseError(f"{name}: the fake implementation must return an empty tensor like the real "
                                f"output, shape {tuple(x.shape)}, {x.dtype}, on {x.device}; got {got}")
        # Checked here too: opcheck before torch 2.12 lets a fake with other strides through.
        if fake.stride() != real.stride():
            raise ExerciseError(f"{name}: the fake implementation's output has strides {fake.stride()}, the real "
                                f"one's {real.stride()} (shape {tuple(x.shape)}): compiled code would read the "
                                "real output laid out as the fake says; give both the same layout")
    x = torch.randn(9, 5, device=DEVICE)
    _opcheck(name, scale_columns_op, (x, torch.randn(5, device=DEVICE)), "on x of shape (9, 5)")
    print(f"Exercise 5.1 passed: {len(cases)} shapes, the fake implementation's shapes, and every opcheck test.")


def check_scale_columns_autograd(scale_columns_op):
    """Exercise 5.2: the operator of 5.2 with autograd registered: grads of x and w."""
    name = "Exercise 5.2 (scale_columns_trainable)"
    _require_custom_op(name, scale_columns_op)
    for shape in [(1, 1), (4, 3), (33, 17)] + hidden_case(lambda: (random_size(2, 40), random_size(2, 40))):
        x = torch.randn(shape, device=DEVICE, requires_grad=True)
        w = torch.randn(shape[1], device=DEVICE, requires_grad=True)
        grad_out = torch.randn(shape, device=DEVICE)
        out = run_student_code(name, scale_columns_op, x, w)
        if not out.requires_grad:
            raise ExerciseError(f"{name}: the output does not require grad; register the backward with "
                                "scale_columns_op.register_autograd(backward, setup_context=setup_context)")
        run_student_code(name, out.backward, grad_out)
        x64, w64 = x.detach().double(), w.detach().double()
        for what, got, expected in (("grad of x", x.grad, grad_out.double() * w64),
                                    ("grad of w", w.grad, (grad_out.double() * x64).sum(0))):
            if got is None:
                raise ExerciseError(f"{name}: the {what} is None for x of shape {shape}: backward must return "
                                    "(grad_x, grad_w), one gradient for each input")
            compare(f"{name}: the {what} for x of shape {shape}", got, expected, rtol=1e-5, atol=1e-5 * shape[0])
    x = torch.randn(6, 4, device=DEVICE, requires_grad=True)
    _opcheck(name, scale_columns_op, (x, torch.randn(4, device=DEVICE, requires_grad=True)), "with inputs that need grad")
    print("Exercise 5.2 passed: the grads of x and w for 3 shapes, and opcheck's autograd tests.")


def check_without_graph_breaks(peak_scaled_softmax):
    """Exercise 5.3: softmax(x / max(max|x|, 1)) over the last dimension, traced in one graph."""
    import logging

    name = "Exercise 5.3 (peak_scaled_softmax)"
    torch._dynamo.reset()
    for shape in [(1, 1), (4, 7), (3, 5, 33)] + hidden_case(lambda: (random_size(1, 5), random_size(1, 40))):
        x = torch.randn(shape, device=DEVICE) * 3
        x64 = x.double()
        expected = torch.softmax(x64 / x64.abs().max().clamp(min=1.0), dim=-1)
        compare(f"{name}, x of shape {shape}", run_student_code(name, peak_scaled_softmax, x), expected,
                rtol=1e-5, atol=1e-6)
    small = torch.rand(4, 7, device=DEVICE) * 0.5  # max |x| below 1: divided by 1
    compare(f"{name}, x with every |x| < 1", run_student_code(name, peak_scaled_softmax, small),
            torch.softmax(small.double(), dim=-1), rtol=1e-5, atol=1e-6)
    dynamo_log = logging.getLogger("torch._dynamo")
    level = dynamo_log.level
    dynamo_log.setLevel(logging.ERROR)  # the breaks are reported below, once
    try:
        explanation = run_student_code(name, torch._dynamo.explain(peak_scaled_softmax), torch.randn(8, 16, device=DEVICE))
    finally:
        dynamo_log.setLevel(level)
        torch._dynamo.reset()
    if explanation.graph_break_count:
        reasons = "; ".join(str(b.reason).strip().splitlines()[0] for b in explanation.break_reasons)
        raise ExerciseError(f"{name}: torch.compile still breaks the graph {explanation.graph_break_count} time(s): "
                            f"{reasons}")
    print("Exercise 5.3 passed: the values of 4 inputs, and torch._dynamo.explain finds one graph, no break.")
