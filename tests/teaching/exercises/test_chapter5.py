"""The checkers of chapter 5 (course_lib/teaching/exercises/chapter5.py) pass a right answer and name each typical mistake."""

import pytest
import torch

import course_lib
from course_lib.teaching import exercises
from course_lib.core import references
from course_lib.teaching.checking import ExerciseError


_op_names = iter(range(10**6))


def scale_columns_test_op(body, fake=lambda x, w: x.new_empty(x.shape)):
    """A custom operator of a name not used before, with ``body`` and (unless None) ``fake``."""
    @torch.library.custom_op(f"course_lib_tests::scale_columns_{next(_op_names)}", mutates_args=())
    def op(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return body(x, w)

    if fake is not None:
        op.register_fake(fake)
    return op


def test_scale_columns_op_checker(capsys):
    exercises.check_scale_columns_op(scale_columns_test_op(lambda x, w: x * w))
    assert capsys.readouterr().out.startswith("Exercise 5.1 passed")
    with pytest.raises(ExerciseError, match="custom_op made"):
        exercises.check_scale_columns_op(lambda x, w: x * w)
    with pytest.raises(ExerciseError, match="register a fake"):
        exercises.check_scale_columns_op(scale_columns_test_op(lambda x, w: x * w, fake=None))
    with pytest.raises(ExerciseError, match="shape \\(6, 7\\)"):
        exercises.check_scale_columns_op(scale_columns_test_op(lambda x, w: x * w, fake=lambda x, w: x.new_empty(7)))
    with pytest.raises(ExerciseError, match="x of shape"):
        exercises.check_scale_columns_op(scale_columns_test_op(lambda x, w: x * w.flip(0)))
    with pytest.raises(ExerciseError, match="may not alias"):  # returns its input, changed in place
        exercises.check_scale_columns_op(scale_columns_test_op(lambda x, w: x.mul_(w)))
    with pytest.raises(ExerciseError, match="strides \\(7, 1\\), the real one's \\(1, 6\\)"):  # fake row-major
        exercises.check_scale_columns_op(scale_columns_test_op(lambda x, w: (x * w).t().contiguous().t()))


def test_scale_columns_autograd_checker(capsys):
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def backward(ctx, grad_out):
        x, w = ctx.saved_tensors
        return grad_out * w, (grad_out * x).sum(0)

    def backward_forgets_the_sum(ctx, grad_out):
        x, w = ctx.saved_tensors
        return grad_out * w, (grad_out * x)[0]

    op = scale_columns_test_op(lambda x, w: x * w)
    op.register_autograd(backward, setup_context=setup_context)
    exercises.check_scale_columns_autograd(op)
    assert capsys.readouterr().out.startswith("Exercise 5.2 passed")
    with pytest.raises(ExerciseError, match="register_autograd"):
        exercises.check_scale_columns_autograd(scale_columns_test_op(lambda x, w: x * w))
    wrong = scale_columns_test_op(lambda x, w: x * w)
    wrong.register_autograd(backward_forgets_the_sum, setup_context=setup_context)
    with pytest.raises(ExerciseError, match="grad of w"):
        exercises.check_scale_columns_autograd(wrong)


def test_without_graph_breaks_checker(capsys):
    exercises.check_without_graph_breaks(lambda x: torch.softmax(x / x.abs().max().clamp(min=1.0), dim=-1))
    assert capsys.readouterr().out.startswith("Exercise 5.3 passed")
    with pytest.raises(ExerciseError, match="breaks the graph 1 time.*item"):
        exercises.check_without_graph_breaks(lambda x: torch.softmax(x / max(x.abs().max().item(), 1.0), dim=-1))
    with pytest.raises(ExerciseError, match="every \\|x\\| < 1"):  # divides by max |x| even below 1
        exercises.check_without_graph_breaks(lambda x: torch.softmax(x / x.abs().max(), dim=-1))
