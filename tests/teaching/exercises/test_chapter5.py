"""The checkers of chapter 5 (course_lib/teaching/exercises/chapter5.py) pass a right answer and name each typical mistake."""

import itertools

import pytest
import torch

import course_lib
from course_lib.core.runtime import ON_GPU
from course_lib.teaching import exercises
from course_lib.teaching.checking import ExerciseError
from solutions import solution, solution_source
from hidden_sizes import hidden_sizes  # noqa: F401  (autouse: visible and hidden sizes)

NOTEBOOK = "05_kernel_to_layer"


def test_without_graph_breaks_checker(capsys):
    exercises.check_without_graph_breaks(solution(NOTEBOOK, "5.1").peak_scaled_softmax)
    assert capsys.readouterr().out.startswith("Exercise 5.1 passed")
    with pytest.raises(ExerciseError, match="breaks the graph 1 time.*item"):
        exercises.check_without_graph_breaks(lambda x: torch.softmax(x / max(x.abs().max().item(), 1.0), dim=-1))
    with pytest.raises(ExerciseError, match="every \\|x\\| < 1"):  # divides by max |x| even below 1
        exercises.check_without_graph_breaks(lambda x: torch.softmax(x / x.abs().max(), dim=-1))


@pytest.mark.parametrize("answer", [
    lambda x: torch.softmax(x / max(x.abs().max(), 1.0), dim=-1),  # Python's max: bool() of a tensor
    lambda x: torch.softmax(x / max(1.0, x.abs().max()), dim=-1),
])
def test_without_graph_breaks_refuses_reading_a_tensor_into_python(answer):
    with pytest.raises(ExerciseError, match="(?s)reads a tensor's value.*hint: the answer must stay in tensor"):
        exercises.check_without_graph_breaks(answer)


# ------------------------------------------------------------------ 5.2
def _backward_kernel(mistakes=None):
    return solution(NOTEBOOK, "5.2", mistakes).scale_columns_backward_kernel


def test_scale_columns_backward_checker(capsys):
    exercises.check_scale_columns_backward(_backward_kernel())
    out = capsys.readouterr().out
    assert out.startswith("Exercise 5.2 passed") and "speed" in out


@pytest.mark.parametrize("answer, message", [
    (lambda x, w, grad_y: (grad_y * w, (grad_y * x).sum(0)), "pass the kernel itself"),
    (None, "got None"),
])
def test_scale_columns_backward_refuses_what_is_not_a_kernel(answer, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_scale_columns_backward(answer)


@pytest.mark.parametrize("mistake, message", [
    ({"tl.sum(grad_y * x, axis=0)": "tl.sum(grad_y * x, axis=1)"}, "along each row \\(axis=1\\)"),
    ({"grad_y * w[None, :]": "grad_y * x"}, "grad_x is grad_y \\* x"),
    # the last program's tiles unmasked past n_rows
    ({"mask = (rows < n_rows)[:, None] & col_mask[None, :]": "mask = col_mask[None, :]"},
     "(?s)out of bounds.*hint: the last row group ends past n_rows"),
    ({"tl.store(partial_ptr + group * stride_partial_row + cols, partial, mask=col_mask)":
      "tl.store(partial_ptr + group * stride_partial_row + cols, partial)"}, "out of bounds"),
    ({"rows[:, None] * stride_x_row + cols[None, :] * stride_x_col": "rows[:, None] * n_cols + cols[None, :]"},
     "x was read as if contiguous"),
    ({"rows[:, None] * stride_grad_y_row + cols[None, :] * stride_grad_y_col": "rows[:, None] * n_cols + cols[None, :]"},
     "grad_y was read as if contiguous"),
    ({"cols * stride_w": "cols"}, "out of bounds.*w_ptr"),  # w read as contiguous
    # grad_y's column stride ignored: the message names grad_y's stride, not x's
    ({"cols[None, :] * stride_grad_y_col": "cols[None, :]"},
     "(?s)grad_y transposed.*stride_grad_y_col\\)\\?.*hint: grad_y's columns were read one element apart"),
    ({"cols[None, :] * stride_x_col": "cols[None, :]"}, "(?s)x transposed.*hint: x's columns were read"),
    # writes grad_x only where it held NaN beforehand
    ({"""tl.store(grad_x_ptr + rows[:, None] * stride_grad_x_row + cols[None, :],
                 grad_y * w[None, :], mask=mask)""":
      """old = tl.load(grad_x_ptr + rows[:, None] * stride_grad_x_row + cols[None, :], mask=mask)
        tl.store(grad_x_ptr + rows[:, None] * stride_grad_x_row + cols[None, :],
                 tl.where(old != old, grad_y * w[None, :], old), mask=mask)"""},
     "still hold what the output held before the launch"),
    # right only up to the printed cases' number of rows
    ({"partial += tl.sum(grad_y * x, axis=0)": "partial += tl.sum(grad_y * x, axis=0) * (n_rows < 200)"},
     "x of shape \\(300, 5\\)"),
])
def test_scale_columns_backward_names_the_mistake(mistake, message):
    with pytest.raises(ExerciseError, match=message) as info:
        exercises.check_scale_columns_backward(_backward_kernel(mistake))
    if "grad_y" in message:
        assert "stride_x_col" not in str(info.value)


# ------------------------------------------------------------------ 5.3
_namespaces = itertools.count()


def _layer(mistakes=None):
    """Exercise 5.3's solution cell, after 5.2's, with its operators in a namespace of their own
    (each wrong answer registers operators too)."""
    renamed = {'"chapter5::': f'"chapter5_test_{next(_namespaces)}::'} | (mistakes or {})
    module = solution(NOTEBOOK, "5.3", renamed, prelude="from course_lib.core import runtime\n"
                      + solution_source(NOTEBOOK, "5.2"))
    return module.scale_columns_forward_kernel, module.scale_columns_backward_kernel, module.scale_columns_op


def test_scale_columns_op_checker(capsys):
    exercises.check_scale_columns_op(*_layer())
    assert capsys.readouterr().out.startswith("Exercise 5.3 passed")


def test_scale_columns_op_refuses_what_is_not_a_kernel_or_an_operator():
    forward_kernel, backward_kernel, op = _layer()
    with pytest.raises(ExerciseError, match="pass the kernel itself"):
        exercises.check_scale_columns_op(lambda x, w: x * w, backward_kernel, op)
    with pytest.raises(ExerciseError, match="got None"):
        exercises.check_scale_columns_op(forward_kernel, None, op)
    with pytest.raises(ExerciseError, match="pass the operator"):
        exercises.check_scale_columns_op(forward_kernel, backward_kernel, lambda x, w: x * w)


@pytest.mark.parametrize("mistake, message", [
    # the backward in PyTorch: right values, but not through the kernel
    ({"return scale_columns_backward_op(x, w, grad_y)": "return grad_y * w, (grad_y * x).sum(0)"},
     "did not launch scale_columns_backward_kernel"),
    # the forward in PyTorch, the kernel never launched (under the interpreter its source says so first)
    ({"torch.library.wrap_triton(scale_columns_forward_kernel)[grid](": "(lambda *args, **kwargs: None)(",
      "    return out\n": "    return x * w\n"}, "wrap_triton\\(scale_columns_forward_kernel\\)"),
    # the same with wrap_triton written, as the launch counter alone finds it
    ({"torch.library.wrap_triton(scale_columns_forward_kernel)[grid](":
      "torch.library.wrap_triton(scale_columns_backward_kernel) and (lambda *args, **kwargs: None)(",
      "    return out\n": "    return x * w\n"}, "did not launch scale_columns_forward_kernel"),
    ({"scale_columns_op.register_autograd(backward, setup_context=setup_context)": ""}, "register_autograd"),
    # the backward in PyTorch beside a token launch of the kernel, whose results it discards
    ({"return scale_columns_backward_op(x, w, grad_y)":
      "gx, gw = scale_columns_backward_op(x, w, grad_y)\n    return grad_y * w + 0 * gx, (grad_y * x).sum(0) + 0 * gw"},
     "gradient of x is not what scale_columns_backward_kernel wrote"),
    # the forward returning x itself (or a copy) when every weight is 1
    ({"    out = torch.empty(x.shape, device=x.device, dtype=x.dtype)\n":
      "    if bool((w == 1).all()):\n        return x\n    out = torch.empty(x.shape, device=x.device, dtype=x.dtype)\n"},
     "returns one of its inputs"),
    ({"    return out\n": "    return x.clone() if bool((w == 1).all()) else out\n"},
     "for every weight 1, the operator's output is not what scale_columns_forward_kernel wrote"),
    # grad_y passed with x's strides
    ({"grad_y.stride(0), grad_y.stride(1)": "x.stride(0), x.stride(1)"}, "passes x's strides .* as grad_y's"),
    # one row group's partial sums taken for grad_w
    ({"partial.sum(dim=0).to(w.dtype)": "partial[0]"}, "grad of w for x of shape \\(517, 9\\)"),
    ({"return scale_columns_backward_op(x, w, grad_y)": "return scale_columns_backward_op(x, w, grad_y)[0]"},
     "raised|grad of w"),
    # outputs allocated in x's layout (transposed) that the kernels write as row-major
    ({"out = torch.empty(x.shape, device=x.device, dtype=x.dtype)": "out = torch.empty_like(x)"},
     "(?s)output for x transposed.*hint: the output has the layout of x"),
    ({"grad_x = torch.empty(x.shape, device=x.device, dtype=x.dtype)": "grad_x = torch.empty_like(x)"},
     "(?s)grad of x for x transposed.*hint: x is not row-major"),
    # a fake whose layout is not the real output's: what opcheck is for (a GPU's triton_op has its body as its fake)
    pytest.param({"scale_columns_op.register_fake(lambda x, w: x.new_empty(x.shape))":
                  "scale_columns_op.register_fake(lambda x, w: x.new_empty(x.shape[::-1]).t())"},
                 "opcheck failed.*Stride", marks=[
                     pytest.mark.skipif(ON_GPU, reason="fakes are registered on CPU only"),
                     pytest.mark.skipif(tuple(map(int, torch.__version__.split(".")[:2])) < (2, 13),
                                        reason="torch's opcheck compares a fake's strides from 2.13 on")]),
])
def test_scale_columns_op_names_the_mistake(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_scale_columns_op(*_layer(mistake))


@pytest.mark.skipif(ON_GPU, reason="a bare kernel[grid] is refused where it would still work: under the interpreter")
def test_scale_columns_op_asks_for_wrap_triton():
    with pytest.raises(ExerciseError, match="wrap_triton"):
        exercises.check_scale_columns_op(*_layer({
            "torch.library.wrap_triton(scale_columns_forward_kernel)": "scale_columns_forward_kernel"}))


@pytest.mark.skipif(ON_GPU, reason="on a GPU a triton_op is what the exercise asks for")
def test_scale_columns_op_refuses_a_triton_op_under_the_interpreter():
    with pytest.raises(ExerciseError, match="under the interpreter a triton_op cannot be traced"):
        exercises.check_scale_columns_op(*_layer({
            "torch.library.triton_op if runtime.ON_GPU else torch.library.custom_op": "torch.library.triton_op"}))


@pytest.mark.skipif(not ON_GPU, reason="under the interpreter a custom_op is what the exercise asks for")
def test_scale_columns_op_asks_for_a_triton_op_on_a_gpu():
    with pytest.raises(ExerciseError, match="make the operator a torch.library.triton_op"):
        exercises.check_scale_columns_op(*_layer({
            "torch.library.triton_op if runtime.ON_GPU else torch.library.custom_op": "torch.library.custom_op"}))
