"""The checkers of chapter 3 (course_lib/teaching/exercises/chapter3/) pass the notebook's
answers and name each typical mistake, made from the answer by a text edit."""

import pytest

from course_lib.teaching import exercises
from course_lib.teaching.checking import ExerciseError
from solutions import solution
from hidden_sizes import hidden_sizes  # noqa: F401  (autouse: visible and hidden sizes)

NOTEBOOK = "03_layernorm"


def _kernel(exercise, name, mistakes=None):
    return getattr(solution(NOTEBOOK, exercise, mistakes), name)


NOT_KERNELS = [(lambda *args: None, "pass the kernel itself"), (None, "got None")]

# ------------------------------------------------------------ Exercise 3.1: the forward


def _layernorm_rows(mistakes=None):
    return _kernel("3.1", "layernorm_rows_kernel", mistakes)


def test_layernorm_rows_checker(capsys):
    exercises.check_layernorm_rows(_layernorm_rows())
    out = capsys.readouterr().out
    assert out.startswith("Exercise 3.1 passed") and "speed" in out


@pytest.mark.parametrize("answer, message", NOT_KERNELS)
def test_layernorm_rows_refuses_what_is_not_a_kernel(answer, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_layernorm_rows(answer)


CENTRED = "centred = tl.where(in_tile, x - mean[:, None], 0.0)"
VAR = "var = tl.sum(centred * centred, axis=1) / n_cols"


@pytest.mark.parametrize("mistake, message", [
    ({VAR: "var = tl.sum(centred * centred, axis=1) / (n_cols - 1)"}, "n_cols - 1 \\(the unbiased estimate"),
    ({VAR: "var = tl.sum(x * x, axis=1) / n_cols - mean * mean"}, "cancels catastrophically"),
    ({CENTRED: "centred = x - mean[:, None]"}, "padding lanes count in the variance"),
    ({"mask=in_tile, other=0.0)": "mask=in_tile)"}, "no other="),  # padding lanes undefined in the sums
    ({"mean = tl.sum(x, axis=1) / n_cols": "mean = tl.sum(x, axis=1) / BLOCK_COLS"}, "divides by BLOCK_COLS"),
    ({"rstd = 1.0 / tl.sqrt(var + eps)": "rstd = 1.0 / (tl.sqrt(var) + eps)"}, "inside the square root"),
    ({"rows[:, None] * stride_x_row": "rows[:, None] * n_cols"}, "right stride"),  # rows read as contiguous
    ({"rows[:, None] * stride_y_row": "rows[:, None] * n_cols"}, "right stride"),
    ({"tl.store(mean_ptr + rows, mean, mask=in_rows)": "tl.store(mean_ptr + rows, mean)"}, "out of bounds"),
    ({"tl.store(rstd_ptr + rows, rstd, mask=in_rows)": ""}, "elements are NaN"),  # rstd never written
])
def test_layernorm_rows_names_the_mistake(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_layernorm_rows(_layernorm_rows(mistake))


# ------------------------------------------------------ Exercise 3.2: dx in PyTorch


def _layernorm_dx(mistakes=None):
    return solution(NOTEBOOK, "3.2", mistakes).layernorm_dx


def test_layernorm_dx_checker(capsys):
    exercises.check_layernorm_dx(_layernorm_dx())
    assert capsys.readouterr().out.startswith("Exercise 3.2 passed")


BRACKET = "g - mean_g - xhat * mean_g_xhat"


@pytest.mark.parametrize("mistake, message", [
    ({"g = gamma * dy": "g = dy"}, "multiply dy by gamma"),
    ({BRACKET: "g - mean_g"}, "xhat \\* mean\\(g \\* xhat\\).*is missing"),
    ({BRACKET: "g - xhat * mean_g_xhat"}, "- mean\\(g\\).*is missing"),
    ({"g.mean(dim=-1": "g.sum(dim=-1", "(g * xhat).mean(dim=-1": "(g * xhat).sum(dim=-1"}, "not sums"),
    ({"return rstd * (": "return ("}, "multiplied by rstd"),
    ({"mean, rstd = mean[..., None], rstd[..., None]": "pass"}, r"shape \(3, 3\), expected \(3, 1\)"),
])
def test_layernorm_dx_names_the_mistake(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_layernorm_dx(_layernorm_dx(mistake))


# --------------------------------------------- Exercise 3.3: partial column sums


def _column_partial_sums(mistakes=None):
    return _kernel("3.3", "column_partial_sums_kernel", mistakes)


def test_column_partial_sums_checker(capsys):
    exercises.check_column_partial_sums(_column_partial_sums())
    out = capsys.readouterr().out
    assert out.startswith("Exercise 3.3 passed") and "speed" in out


@pytest.mark.parametrize("answer, message", NOT_KERNELS)
def test_column_partial_sums_refuses_what_is_not_a_kernel(answer, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_column_partial_sums(answer)


STORE_ROW = "partial_ptr + program * stride_partial_row"


@pytest.mark.parametrize("mistake, message", [
    # the last tile masked with n_rows alone: the next program's rows counted twice
    ({"(rows < last_row)[:, None]": "(rows < n_rows)[:, None]"}, "counted twice"),
    ({"(rows < last_row)[:, None]": "(rows >= 0)[:, None]"}, "out of bounds"),  # no row mask on the last tile
    ({"mask=mask, other=0.0)": "mask=mask)"}, "no other="),  # masked lanes undefined in the sum
    ({STORE_ROW: "partial_ptr + 0 * stride_partial_row"}, "stores its sum as row p"),  # every program on row 0
    ({STORE_ROW: "partial_ptr + first_row * stride_partial_row"}, "out of bounds"),  # its first row's index
    ({STORE_ROW: "partial_ptr + program * n_cols"}, "right stride"),
    ({"rows[:, None] * stride_x_row": "rows[:, None] * n_cols"}, "right stride"),
])
def test_column_partial_sums_names_the_mistake(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_column_partial_sums(_column_partial_sums(mistake))


# ------------------------------------------------- Exercise 3.4: the backward kernel


def _backward_rows(mistakes=None):
    return _kernel("3.4", "layernorm_backward_rows_kernel", mistakes)


def test_layernorm_backward_rows_checker(capsys):
    exercises.check_layernorm_backward_rows(_backward_rows())
    out = capsys.readouterr().out
    assert out.startswith("Exercise 3.4 passed") and "fixed order" in out and "speed" in out


@pytest.mark.parametrize("answer, message", NOT_KERNELS)
def test_layernorm_backward_rows_refuses_what_is_not_a_kernel(answer, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_layernorm_backward_rows(answer)


XHAT = "(x - mean[:, None]) * rstd[:, None], 0.0)"
DGAMMA_ROW, DBETA_ROW = "partial_dgamma_ptr + partial_row", "partial_dbeta_ptr + partial_row"


@pytest.mark.parametrize("mistake, message", [
    ({"dx = (g - mean_g[:, None] - xhat": "dx = (g - xhat"}, "misses the term - mean\\(g\\)"),
    ({" - xhat * mean_g_xhat[:, None]) * rstd": ") * rstd"}, "misses the term - xhat \\* mean\\(g \\* xhat\\)"),
    ({XHAT: "x * rstd[:, None], 0.0)"}, "without the mean"),  # xhat from the wrong statistics
    ({XHAT: "(x - mean[:, None]) / rstd[:, None], 0.0)"}, "dividing by rstd"),
    ({DGAMMA_ROW: "SWAP", DBETA_ROW: DGAMMA_ROW, "SWAP": DBETA_ROW}, "dgamma and dbeta are swapped"),
    ({"mean_g = tl.sum(g, axis=1) / n_cols": "mean_g = tl.sum(g, axis=1) / BLOCK_COLS",
      "mean_g_xhat = tl.sum(g * xhat, axis=1) / n_cols": "mean_g_xhat = tl.sum(g * xhat, axis=1) / BLOCK_COLS"},
     "padding lanes count in them"),
    # the partial row summed along the tile's rows, one number a row
    ({"tl.sum(acc_dgamma, axis=0)": "tl.sum(acc_dgamma, axis=1)"}, "sums down the tile's rows"),
    ({"row_mask = rows < last_row": "row_mask = rows < n_rows"}, "counted twice"),
    ({"mask=col_mask, other=0.0)": "mask=col_mask)"}, "no other="),  # gamma's padding lanes undefined in the means
    ({"acc_dgamma += dy * xhat": "acc_dgamma += g * xhat"}, "without gamma"),
    ({"rows[:, None] * stride_grad_y_row": "rows[:, None] * stride_x_row"}, "right stride"),
    ({"rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)": "rstd = tl.load(rstd_ptr + rows)"},
     "out of bounds"),
])
def test_layernorm_backward_rows_names_the_mistake(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_layernorm_backward_rows(_backward_rows(mistake))


# ---------------------------------------------------------- past the listed cases (issue 54)

XHAT_WHERE = "xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)"


@pytest.mark.parametrize("mistake, message", [
    # mean (rstd) loaded without other=, xhat without tl.where: the lanes of rows past the range reach the sums
    ({XHAT_WHERE: "xhat = (x - mean[:, None]) * rstd[:, None]",
      "mean = tl.load(mean_ptr + rows, mask=row_mask, other=0.0)": "mean = tl.load(mean_ptr + rows, mask=row_mask)"},
     r"tl.load\(mean_ptr \+ rows, mask=row_mask\) has a mask but no other="),
    ({XHAT_WHERE: "xhat = (x - mean[:, None]) * rstd[:, None]",
      "rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)": "rstd = tl.load(rstd_ptr + rows, mask=row_mask)"},
     r"tl.load\(rstd_ptr \+ rows, mask=row_mask\) has a mask but no other="),
    ({"dx = (g - mean_g": "dx = tl.where(n_rows > 100, 0.0, 1.0) * (g - mean_g"}, "past the cases listed"),
    ({"acc_dbeta += dy": "acc_dbeta += tl.where(n_cols > 120, 0.0, 1.0) * dy"}, "past the cases listed"),
    ({"tl.store(partial_dbeta_ptr + partial_row, tl.sum(acc_dbeta, axis=0), mask=col_mask)":
      "old = tl.load(partial_dbeta_ptr + partial_row, mask=col_mask)\n"
      "    tl.store(partial_dbeta_ptr + partial_row, tl.where(old != old, tl.sum(acc_dbeta, axis=0), old),"
      " mask=col_mask)"}, "still hold what the output held before the launch"),
])
def test_layernorm_backward_rows_past_the_listed_cases(mistake, message):
    with pytest.raises(ExerciseError, match=message) as raised:
        exercises.check_layernorm_backward_rows(_backward_rows(mistake))
    assert "counted twice" not in str(raised.value) and "last tile" not in str(raised.value)


@pytest.mark.parametrize("mistake, message", [
    ({"rstd = 1.0 / tl.sqrt(var + eps)": "rstd = tl.where(n_rows > 50, 1.0, 1.0 / tl.sqrt(var + eps))"},
     "past the cases listed"),
    ({"rstd = 1.0 / tl.sqrt(var + eps)": "rstd = tl.where(n_cols > 128, 1.0, 1.0 / tl.sqrt(var + eps))"},
     "past the cases listed"),
    ({"tl.store(mean_ptr + rows, mean, mask=in_rows)":
      "old = tl.load(mean_ptr + rows, mask=in_rows)\n"
      "    tl.store(mean_ptr + rows, tl.where(old != old, mean, old), mask=in_rows)"},
     "still hold what the output held before the launch"),
])
def test_layernorm_rows_past_the_listed_cases(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_layernorm_rows(_layernorm_rows(mistake))


@pytest.mark.parametrize("mistake, message", [
    ({"tl.sum(acc, axis=0)": "tl.sum(acc, axis=0) * tl.where(n_rows > 120, 0.0, 1.0)"}, "past the cases listed"),
    ({"tl.sum(acc, axis=0)": "tl.sum(acc, axis=0) * tl.where(program > 50, 0.0, 1.0)"}, "past the cases listed"),
])
def test_column_partial_sums_past_the_listed_cases(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_column_partial_sums(_column_partial_sums(mistake))


def dx_by_autograd(x, gamma, dy, mean, rstd):
    import torch

    x = x.clone().requires_grad_()
    xhat = (x - mean[..., None]) * rstd[..., None]
    return torch.autograd.grad(xhat * gamma, x, dy)[0]


def dx_with_row_statistics_unbroadcast(x, gamma, dy, mean, rstd):
    g = gamma * dy
    return rstd * (g - g.mean(dim=-1) - (x - mean) * rstd * (g * (x - mean) * rstd).mean(dim=-1))


@pytest.mark.parametrize("answer, message", [
    (dx_by_autograd, "dx from the formula, not from autograd.*torch.no_grad"),
    (dx_with_row_statistics_unbroadcast, "mean and rstd .*a last axis of 1"),
])
def test_layernorm_dx_says_python_errors_in_the_exercise_words(answer, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_layernorm_dx(answer)
