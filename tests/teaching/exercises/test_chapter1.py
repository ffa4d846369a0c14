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
