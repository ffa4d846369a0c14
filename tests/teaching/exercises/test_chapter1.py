"""The checkers of chapter 1 (course_lib/teaching/exercises/chapter1.py) pass a right answer and name each typical mistake."""

import pytest
import torch

import course_lib
from course_lib.teaching import exercises
from course_lib.core import references
from course_lib.teaching.checking import ExerciseError
from solutions import solution
from hidden_sizes import hidden_sizes  # noqa: F401  (autouse: visible and hidden sizes)


def _scale_columns(mistakes=None):
    return solution("01_weighted_sum", "1.1", mistakes).scale_columns_kernel


def test_scale_columns_checker(capsys):
    exercises.check_scale_columns(_scale_columns())
    out = capsys.readouterr().out
    assert out.startswith("Exercise 1.1 passed") and "speed" in out


@pytest.mark.parametrize("answer, message", [
    (lambda x, w: x * w, "pass the kernel itself"),
    (None, "got None"),
])
def test_scale_columns_refuses_what_is_not_a_kernel(answer, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_scale_columns(answer)


@pytest.mark.parametrize("mistake, message", [
    ({"(cols < n_cols)[None, :]": "(cols <= n_cols)[None, :]"}, "out of bounds"),  # mask one past each row
    ({"w = tl.load(w_ptr + cols, mask=cols < n_cols)": "w = tl.load(w_ptr + cols)"}, "out of bounds"),
    ({"cols[None, :] * stride_x_col": "cols[None, :]"}, "stride_x_col"),  # a transposed x read as row-major
    ({"x * w[None, :]": "x * w[:, None]"}, "Exercise 1.1"),  # broadcast along the wrong axis
])
def test_scale_columns_names_the_mistake(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_scale_columns(_scale_columns(mistake))


def test_weighted_sum_grads_checker(capsys):
    exercises.check_weighted_sum_grads(
        lambda x, w, g: (g[..., None] * w, (x * g[..., None]).reshape(-1, x.shape[-1]).sum(0)))
    assert capsys.readouterr().out.startswith("Exercise 1.2 passed")
    with pytest.raises(ExerciseError, match="answers it outright may not be called"):
        exercises.check_weighted_sum_grads(lambda x, w, g: references.weighted_sum_backward(x, w, g))
    with pytest.raises(ExerciseError, match="grad_w"):
        exercises.check_weighted_sum_grads(lambda x, w, g: (g[..., None] * w, x.reshape(-1, x.shape[-1]).sum(0)))
    with pytest.raises(ExerciseError, match="return a tuple"):
        exercises.check_weighted_sum_grads(lambda x, w, g: g[..., None] * w)


def by_autograd(x, w, g):
    """The gradients from autograd, with grad switched back on inside the answer."""
    with torch.enable_grad():
        x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
        return torch.autograd.grad(references.weighted_sum(x, w), (x, w), g)


def by_autograd_in_a_thread(x, w, g):
    import threading

    found = []
    thread = threading.Thread(target=lambda: found.append(by_autograd(x, w, g)))
    thread.start()
    thread.join()
    return found[0]


def by_a_copy_of_the_reference(x, w, g):
    import types

    copy = types.FunctionType(UNGUARDED_REFERENCE, references.__dict__)
    return copy(x, w, g)


UNGUARDED_REFERENCE = references.weighted_sum_backward.__code__


def by_hiding_from_the_hook(x, w, g):
    import sys

    sys.setprofile(None)
    return by_autograd(x, w, g)


@pytest.mark.parametrize("answer, message", [
    (by_autograd, "it runs autograd"),
    (by_autograd_in_a_thread, "it runs autograd"),
    (by_a_copy_of_the_reference, "it calls course_lib's weighted_sum_backward"),
    (by_hiding_from_the_hook, "replaced the profiling hook"),
])
def test_weighted_sum_grads_must_come_from_the_formula(answer, message):
    """The issue's bypasses of "without autograd": grad switched back on inside the answer
    (in a thread too), the reference's code object copied, the checker's hook removed."""
    with pytest.raises(ExerciseError, match=message):
        exercises.check_weighted_sum_grads(answer)


def _column_sum(mistakes=None):
    return solution("01_weighted_sum", "1.3", mistakes).column_sum_kernel


def test_column_sum_checker(capsys):
    exercises.check_column_sum(_column_sum())
    out = capsys.readouterr().out
    assert out.startswith("Exercise 1.3 passed") and "speed" in out


@pytest.mark.parametrize("answer, message", [
    (lambda partial: partial.sum(0), "pass the kernel itself"),
    (None, "got None"),
])
def test_column_sum_refuses_what_is_not_a_kernel(answer, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_column_sum(answer)


@pytest.mark.parametrize("mistake, message", [
    # no loop: one tile of rows
    ({"range(0, n_rows, BLOCK_ROWS)": "range(0, BLOCK_ROWS, BLOCK_ROWS)"}, "only the first tile of rows"),
    # the loop ends a tile early
    ({"range(0, n_rows, BLOCK_ROWS)": "range(0, n_rows - BLOCK_ROWS, BLOCK_ROWS)"}, "the loop ends early"),
    # the last tile, partly past the end, skipped
    ({"range(0, n_rows, BLOCK_ROWS)": "range(0, n_rows // BLOCK_ROWS * BLOCK_ROWS, BLOCK_ROWS)"}, "the loop ends early"),
    ({"range(0, n_rows, BLOCK_ROWS)": "range(0, n_rows - 64, BLOCK_ROWS)"}, "no row is added"),
    ({"(rows < n_rows)[:, None] & ": ""}, "out of bounds"),  # no mask on the last tile of rows
    ({", other=0.0)": ")"}, "without other="),  # masked lanes added as whatever they hold
    ({"cols[None, :] * stride_col": "cols[None, :]"}, "stride_col"),  # a transposed partial read as row-major
])
def test_column_sum_names_the_mistake(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_column_sum(_column_sum(mistake))


# ---------------------------------------------------------- past the listed cases (issue 54)

STORE_1_1 = "tl.store(out_ptr + rows[:, None] * stride_out_row + cols[None, :], x * w[None, :], mask=mask)"


@pytest.mark.parametrize("mistake, message", [
    # zeros past 100 rows, past 200 columns, past 64 programs: sizes the listed cases never reach
    ({"x * w[None, :]": "tl.where(n_rows > 100, 0.0, x * w[None, :])"}, "past the cases listed"),
    ({"x * w[None, :]": "tl.where(n_cols > 200, 0.0, x * w[None, :])"}, "past the cases listed"),
    ({"x * w[None, :]": "tl.where(tl.program_id(0) > 64, 0.0, x * w[None, :])"}, "past the cases listed"),
    # right values only where the output was filled with NaN, the rest left as it was
    ({STORE_1_1: "old = tl.load(out_ptr + rows[:, None] * stride_out_row + cols[None, :], mask=mask)\n"
                 "    tl.store(out_ptr + rows[:, None] * stride_out_row + cols[None, :],"
                 " tl.where(old != old, x * w[None, :], old), mask=mask)"},
     "still hold what the output held before the launch"),
])
def test_scale_columns_past_the_listed_cases(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_scale_columns(_scale_columns(mistake))


def test_an_answer_that_reads_its_output_is_refused_for_what_it_read():
    """Zeros where the output did not hold NaN: refused on the filled outputs, and not said to
    have kept them (it did not)."""
    reads_its_output = {STORE_1_1: "old = tl.load(out_ptr + rows[:, None] * stride_out_row + cols[None, :], mask=mask)\n"
                                   "    tl.store(out_ptr + rows[:, None] * stride_out_row + cols[None, :],"
                                   " tl.where(old != old, x * w[None, :], 0.0), mask=mask)"}
    with pytest.raises(ExerciseError, match=r"outputs filled with random values before the launch \(right when "
                                            r"they start as NaN\)") as raised:
        exercises.check_scale_columns(_scale_columns(reads_its_output))
    assert "hint" not in str(raised.value)


@pytest.mark.parametrize("mistake, message", [
    ({"tl.store(out_ptr + cols, acc, mask=col_mask)":
      "tl.store(out_ptr + cols, tl.where(n_rows > 1000, 0.0, acc), mask=col_mask)"}, "past the cases listed"),
    ({"tl.store(out_ptr + cols, acc, mask=col_mask)":
      "old = tl.load(out_ptr + cols, mask=col_mask)\n"
      "    tl.store(out_ptr + cols, acc, mask=col_mask & (old != old))"},
     "still hold what the output held before the launch"),
])
def test_column_sum_past_the_listed_cases(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_column_sum(_column_sum(mistake))


def by_autograd_without_enable_grad(x, w, g):
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    return torch.autograd.grad(references.weighted_sum(x, w), (x, w), g)


def by_backward_without_enable_grad(x, w, g):
    x.requires_grad_()
    w.requires_grad_()
    (x * w).sum(-1).backward(g)
    return x.grad, w.grad


@pytest.mark.parametrize("answer, message", [
    (by_autograd_without_enable_grad, "from the formulas you derived, not from autograd.*torch.no_grad"),
    (by_backward_without_enable_grad, "from the formulas you derived, not from autograd.*torch.no_grad"),
    # the sum for grad_w over axis 1, which a 1-D x does not have
    (lambda x, w, g: (g[..., None] * w, (x * g[..., None]).sum(1)), "x may have any number of leading axes"),
    # over axis 0 only: right for a 2-D x, the wrong shape for a 1-D or 3-D one
    (lambda x, w, g: (g[..., None] * w, (x * g[..., None]).sum(0)), "over every axis of x but the last"),
])
def test_weighted_sum_grads_says_python_errors_in_the_exercise_words(answer, message):
    with pytest.raises(ExerciseError, match=message) as raised:
        exercises.check_weighted_sum_grads(answer)
    assert "Traceback" not in str(raised.value)


@pytest.mark.parametrize("decorator", ["@triton.jit(do_not_specialize=[])", "@triton.jit(debug=False)"])
def test_a_right_answer_with_options_of_triton_jit_passes(decorator, capsys):
    exercises.check_scale_columns(_scale_columns({"@triton.jit\n": decorator + "\n"}))
    assert capsys.readouterr().out.startswith("Exercise 1.1 passed")
