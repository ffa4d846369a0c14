"""The checkers of chapter 4 (course_lib/teaching/exercises/chapter4.py) pass a right answer and name each typical mistake."""

import pytest
import torch

from course_lib.teaching import exercises
from course_lib.teaching.checking import ExerciseError
from solutions import solution
from hidden_sizes import hidden_sizes  # noqa: F401  (autouse: visible and hidden sizes)


def _right_routing_weights(a, s, eps, mask=None):
    y = torch.exp(torch.clamp(s + a[..., None], max=0.0) / eps)
    return y if mask is None else torch.where(mask, y, 0.0)


def test_routing_weights_checker(capsys):
    exercises.check_routing_weights(_right_routing_weights)
    assert capsys.readouterr().out.startswith("Exercise 4.1 passed")
    with pytest.raises(ExerciseError, match="never exceeds 1"):  # no minimum with 0
        exercises.check_routing_weights(lambda a, s, eps, mask=None: torch.exp((s + a[..., None]) / eps))
    with pytest.raises(ExerciseError, match="exactly 0 where mask is False"):  # the mask ignored
        exercises.check_routing_weights(lambda a, s, eps, mask=None: _right_routing_weights(a, s, eps))
    with pytest.raises(ExerciseError, match=r"NaN \* 0 is NaN"):  # y * mask
        exercises.check_routing_weights(lambda a, s, eps, mask=None: _right_routing_weights(a, s, eps) * (
            1.0 if mask is None else mask))
    with pytest.raises(ExerciseError, match="(?s)raised.*hint: a has one value a row"):  # a without its last axis
        exercises.check_routing_weights(lambda a, s, eps, mask=None: torch.exp(torch.clamp(s + a, max=0.0) / eps))


def _split_exponential(a, s, eps, mask=None):
    """exp((s + a + b) / eps) as exp((s + a) / eps) * exp(b / eps): right while (s + a) / eps stays below
    709, inf * 0 = NaN past it."""
    shifted = s + a[..., None]
    y = torch.exp(shifted / eps) * torch.exp(-torch.relu(shifted) / eps)
    return y if mask is None else torch.where(mask, y, 0.0)


@pytest.mark.parametrize("answer, message", [
    (_split_exponential, r"(?s)near [-+]\d+.*hint: y is NaN or inf where \(s \+ a\) / eps lies far above 0"),
    # right only up to the sizes the listed cases reach
    (lambda a, s, eps, mask=None: _right_routing_weights(a, s, eps, mask) if s.shape[-1] <= 100 else torch.ones_like(s),
     "(?s)2 rows of 3000 scores.*hint: this case lies past the cases listed above"),
    (lambda a, s, eps, mask=None: _right_routing_weights(a, s, eps, mask) if s.numel() <= 500 else torch.ones_like(s),
     "(?s)300 rows of 3 scores.*hint: this case lies past the cases listed above"),
])
def test_routing_weights_past_the_listed_cases(answer, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_routing_weights(answer)


def test_routing_weights_solution_passes(capsys):
    exercises.check_routing_weights(solution("04_coordinate_descent", "4.1").routing_weights)
    assert capsys.readouterr().out.startswith("Exercise 4.1 passed")


# ------------------------------------------------------ Exercise 4.2: row_logsumexp_of_min_kernel


def _row_logsumexp_of_min(mistakes=None):
    return solution("04_coordinate_descent", "4.2", mistakes).row_logsumexp_of_min_kernel


def test_row_logsumexp_of_min_checker(capsys):
    exercises.check_row_logsumexp_of_min(_row_logsumexp_of_min())
    out = capsys.readouterr().out
    assert out.startswith("Exercise 4.2 passed") and "speed" in out


@pytest.mark.parametrize("answer, message", [
    (lambda s, a, eps: torch.logsumexp(torch.minimum(s, -a[:, None]) / eps, dim=-1), "pass the kernel itself"),
    (None, "got None"),
])
def test_row_logsumexp_of_min_refuses_what_is_not_a_kernel(answer, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_row_logsumexp_of_min(answer)


@pytest.mark.parametrize("mistake, message", [
    ({'other=float("-inf")': "other=0.0"}, "past the end of the row"),  # padding lanes counted
    ({"tl.exp(z - z_max)": "tl.exp(z)", "z_max + tl.log(total)": "tl.log(total)"}, "exp overflowed"),
    ({"mask=cols < n_cols": "mask=cols <= n_cols"}, "out of bounds"),  # one lane past each row
    ({"row * stride_s_row": "row * n_cols"}, "right stride"),  # a sliced s read as contiguous: between its rows
    ({"cols * stride_s_col": "cols"}, "stride_s_col"),  # a transposed s read as row-major
    ({"tl.minimum(s, -a)": "tl.minimum(s, a)"}, "not a_i"),
    ({"tl.minimum(s, -a) / eps": "tl.minimum(s, -a)"}, "divide min"),
    # shifted by a value that is the largest term only on one side of the scores
    ({"z_max = tl.max(z, axis=0)": "z_max = -a / eps"}, r"(?s)-a above every score.*hint: .* -a_i / eps"),
    ({"z_max = tl.max(z, axis=0)": "z_max = tl.max(s, axis=0) / eps"}, "the largest score over eps"),
    # writes only where the output was NaN beforehand
    ({"tl.store(out_ptr + row, z_max + tl.log(total))":
      "old = tl.load(out_ptr + row)\n    tl.store(out_ptr + row, tl.where(old != old, z_max + tl.log(total), old))"},
     "still hold what the output held before the launch"),
    # right only up to the sizes the printed cases reach
    ({"tl.store(out_ptr + row, z_max + tl.log(total))":
      "tl.store(out_ptr + row, tl.where(row < 100, z_max + tl.log(total), 0.0))"}, "300 rows of 3 scores"),
])
def test_row_logsumexp_of_min_names_the_mistake(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_row_logsumexp_of_min(_row_logsumexp_of_min(mistake))


# --------------------------------------------------------- Exercise 4.3: coor_descent_row_kernel


def _coor_descent_row(mistakes=None):
    return solution("04_coordinate_descent", "4.3", mistakes).coor_descent_row_kernel


def test_coor_descent_row_checker(capsys):
    exercises.check_coor_descent_row(_coor_descent_row())
    out = capsys.readouterr().out
    assert out.startswith("Exercise 4.3 passed") and "speed" in out


@pytest.mark.parametrize("answer, message", [
    (lambda s, k, n_iters, eps=0.1, eps_init=None, eps_decay=1.0: s, "pass the kernel itself"),
    (None, "got None"),
])
def test_coor_descent_row_refuses_what_is_not_a_kernel(answer, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_coor_descent_row(answer)


@pytest.mark.parametrize("mistake, message", [
    # a reset each iteration: every step starts from a_1
    ({"s_max = tl.max(s, axis=0)": "s_max = tl.max(s, axis=0)\n    a_first = a",
      "tl.minimum(s_max, -a)": "tl.minimum(s_max, -a_first)",
      "tl.minimum(s, -a) - z_max": "tl.minimum(s, -a_first) - z_max"}, "the state is not carried"),
    ({"tl.minimum(s, -a) - z_max": "tl.maximum(s, -a) - z_max"}, r"max\(s_j, -a_t\) where"),  # max for min
    ({"tl.minimum(s_max, -a)": "tl.minimum(s_max, a)", "tl.minimum(s, -a) - z_max": "tl.minimum(s, a) - z_max"},
     "not a_t"),  # clipped at the wrong bound
    ({"tl.minimum(s, -a) - z_max": "tl.minimum(s + a, 0.0) - z_max"}, r"not min\(s_j \+ a_t, 0\)"),
    ({'mask=in_row, other=float("-inf")': "mask=in_row, other=0.0"}, "past the end of the row count"),
    ({"tl.sum(in_row.to(tl.float32), axis=0)": "tl.sum(tl.full((BLOCK,), 1.0, tl.float32), axis=0)"},
     "not BLOCK"),  # padding lanes counted in n
    ({"(tl.minimum(s, -a) - z_max) / eps": "tl.minimum(s, -a) / eps",
      "a = eps * logk - (z_max + eps * tl.log(total))": "a = eps * logk - eps * tl.log(total)"}, "exp overflowed"),
    ({"range(1, n_iters)": "range(2, n_iters)"}, "one iteration fewer"),
    ({"range(1, n_iters)": "range(0, n_iters)"}, "one iteration more"),
    ({"    # y divides by the eps after the last decay\n    eps = tl.maximum(eps * eps_decay, eps_min)\n":
      "    # y divides by the eps after the last decay\n"}, "decay once more"),
    ({"a = eps * (logk - tl.log(tl.sum(in_row.to(tl.float32), axis=0)))": "a = 0.0 * eps",
      "range(1, n_iters)": "range(0, n_iters)"}, "starts from b = -s"),  # iteration 0 run from a = 0
    ({"in_row = cols < n_cols": "in_row = cols <= n_cols"}, "out of bounds"),  # one lane past each row
    ({"row * stride_s_row": "row * n_cols"}, "right stride"),  # a sliced s read as contiguous: between its rows
    ({"cols * stride_s_col": "cols"}, "stride_s_col"),  # a transposed s read as row-major
    # shifted by a value that is the largest term only on one side of the scores
    ({"z_max = tl.minimum(s_max, -a)": "z_max = -a"}, "subtracted before the exponential is -a_t"),
    ({"z_max = tl.minimum(s_max, -a)": "z_max = s_max"}, "subtracted before the exponential is the largest score"),
    ({"tl.store(y_ptr + row * stride_y_row + cols, y, mask=in_row)":
      "old = tl.load(y_ptr + row * stride_y_row + cols, mask=in_row)\n"
      "    tl.store(y_ptr + row * stride_y_row + cols, tl.where(old != old, y, old), mask=in_row)"},
     "still hold what the output held before the launch"),
    ({"tl.store(y_ptr + row * stride_y_row + cols, y, mask=in_row)":
      "if n_cols < 1000:\n        tl.store(y_ptr + row * stride_y_row + cols, y, mask=in_row)"},
     "(?s)of 1000 scores.*still hold what the output held"),
])
def test_coor_descent_row_names_the_mistake(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_coor_descent_row(_coor_descent_row(mistake))


def test_coor_descent_row_without_the_shift_is_wrong_on_every_element_of_a_far_case():
    """Scores far from 0: the unshifted exponential is inf or 0 on every row, not on one element."""
    kernel = _coor_descent_row({"(tl.minimum(s, -a) - z_max) / eps": "tl.minimum(s, -a) / eps",
                                "a = eps * logk - (z_max + eps * tl.log(total))": "a = eps * logk - eps * tl.log(total)"})
    from course_lib.teaching.exercises import chapter4
    s, k, n_iters, schedule, _ = chapter4._adversarial_coor_descent_cases()[0]
    from course_lib.teaching.student_kernels import run_interpreted
    got = run_interpreted("4.3", exercises.launch_coor_descent_row, kernel, s, k, n_iters,
                          *chapter4._launch_schedule(schedule))
    expected = chapter4.references.coor_descent(s.double(), n_iters=n_iters, k=k, **schedule)
    wrong = ~torch.isclose(got.double(), expected, rtol=5e-4, atol=5e-4)
    assert wrong.any(dim=1).all() and wrong.double().mean() > 0.9, wrong.sum()
