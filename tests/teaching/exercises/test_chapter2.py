"""The checkers of chapter 2 (course_lib/teaching/exercises/chapter2.py) pass a right answer and name each typical mistake."""

import pytest
import torch

from course_lib.teaching import exercises
from course_lib.teaching.checking import ExerciseError
from solutions import solution
from hidden_sizes import hidden_sizes  # noqa: F401  (autouse: visible and hidden sizes)


def _kernel(exercise, name, mistakes=None):
    return getattr(solution("02_causal_softmax", exercise, mistakes), name)


@pytest.mark.parametrize("exercise, name, checker", [
    ("2.1", "softmax_rows_kernel", exercises.check_softmax_rows),
    ("2.2", "causal_softmax_kernel", exercises.check_causal_softmax),
    ("2.3", "online_softmax_kernel", exercises.check_online_softmax),
])
def test_the_solution_passes(exercise, name, checker, capsys):
    checker(_kernel(exercise, name))
    out = capsys.readouterr().out
    assert out.startswith(f"Exercise {exercise} passed") and "speed" in out


@pytest.mark.parametrize("checker", [exercises.check_softmax_rows, exercises.check_causal_softmax,
                                     exercises.check_online_softmax])
@pytest.mark.parametrize("answer, message", [
    (lambda x: torch.softmax(x, dim=-1), "pass the kernel itself"),
    (None, "got None"),
])
def test_what_is_not_a_kernel_is_refused(checker, answer, message):
    with pytest.raises(ExerciseError, match=message):
        checker(answer)


@pytest.mark.parametrize("mistake, message", [
    ({"(cols < n_cols)[None, :]": "(cols <= n_cols)[None, :]"}, "out of bounds"),  # reads one past each row
    ({"tl.exp(x - tl.max(x, axis=1)[:, None])": "tl.exp(x)"}, r"hint: exp\(x\) overflows float32"),  # no max subtracted: inf / inf
    ({'other=float("-inf")': "other=0.0"}, "count in the sum as exp"),  # padding counted as exp(0)
    ({"tl.max(x, axis=1)[:, None]": "tl.max(x, axis=0)[None, :]",
      "tl.sum(numerator, axis=1)[:, None]": "tl.sum(numerator, axis=0)[None, :]"}, "reduce along axis=1"),
    ({"rows[:, None] * stride_x_row": "rows[:, None] * n_cols"}, "stride_x_row"),  # rows read as if contiguous
])
def test_softmax_rows_names_the_mistake(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_softmax_rows(_kernel("2.1", "softmax_rows_kernel", mistake))


VISIBLE = "visible = (keys[None, :] <= queries[:, None]) & query_exists"


@pytest.mark.parametrize("mistake, message", [
    ({"keys[None, :] <= queries[:, None]": "keys[None, :] < queries[:, None]"}, "the diagonal is hidden"),
    ({"keys[None, :] <= queries[:, None]": "keys[None, :] >= queries[:, None]"}, "the wrong triangle"),
    ({'other=float("-inf")': "other=0.0"}, "the hidden keys count in the sum"),
    ({", other=float(\"-inf\")": ""}, "the hidden keys count in the sum: loaded without other="),
    ({VISIBLE: VISIBLE + " & (keys < n - 1)[None, :]"}, "only the last query of each matrix"),
    ({"mask=query_exists & (keys < n)[None, :])": "mask=visible)"}, "never written above the diagonal"),
    ({VISIBLE: "visible = keys[None, :] <= queries[:, None]"}, "out of bounds"),  # queries past n read
    ({"keys[None, :] * stride_x_col": "keys[None, :]"}, "stride_x_col"),  # transposed scores read as row-major
])
def test_causal_softmax_names_the_mistake(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_causal_softmax(_kernel("2.2", "causal_softmax_kernel", mistake))


@pytest.mark.parametrize("mistake, message", [
    ({"row_sum * tl.exp(row_max - grown_max)": "row_sum"}, "not rescaled"),
    ({"grown_max = tl.maximum(row_max, tl.max(tile, axis=0))": "grown_max = tl.max(tile, axis=0)"},
     "the maximum is the last tile's only"),
    ({'other=float("-inf")': "other=0.0"}, "past the end of the row count in the sum"),
    ({"(row_sum * tl.exp(row_max - grown_max) + tl.sum": "(tl.sum"},
     "the sum is the last tile's only"),
    ({"tile = tl.load(x_row + cols, mask=cols < n_cols)\n": "tile = tl.load(x_row + cols)\n"}, "out of bounds"),
])
def test_online_softmax_names_the_mistake(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_online_softmax(_kernel("2.3", "online_softmax_kernel", mistake))


# ---------------------------------------------------------- past the listed cases (issue 54)

ONLY_WHERE_NAN = {"tl.store(y_ptr + rows[:, None] * stride_y_row + cols[None, :], y, mask=mask)":
                  "old = tl.load(y_ptr + rows[:, None] * stride_y_row + cols[None, :], mask=mask)\n"
                  "    tl.store(y_ptr + rows[:, None] * stride_y_row + cols[None, :], y,"
                  " mask=mask & (old != old))"}


@pytest.mark.parametrize("mistake, message", [
    (ONLY_WHERE_NAN, "still hold what the output held before the launch"),  # writes only where the output held NaN
    ({"numerator = tl.exp(": "numerator = tl.where(n_rows > 500, 0.0, 1.0) * tl.exp("}, "past the cases listed"),
    ({'other=float("-inf")': "other=-100.0"}, "finite stand-in for -inf"),  # wins the max of scores near -200
    ({"numerator = tl.exp(": "numerator = tl.where(n_cols > 200, 0.0, 1.0) * tl.exp("}, "past the cases listed"),
])
def test_softmax_rows_past_the_listed_cases(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_softmax_rows(_kernel("2.1", "softmax_rows_kernel", mistake))


HIDDEN_READ = {'mask=visible, other=float("-inf"))': 'mask=query_exists & (keys < n)[None, :], other=float("-inf"))',
               "numerator = tl.exp(scores": 'scores = tl.where(visible, scores, float("-inf"))\n'
                                            "    numerator = tl.exp(scores"}


@pytest.mark.parametrize("mistake, message", [
    (HIDDEN_READ, "reads scores it must not.*hidden scores .keys j > i"),  # whole row loaded, masked afterwards
    ({'other=float("-inf")': "other=-100.0"}, "finite stand-in for -inf"),  # wins the max of scores near -200
    ({"weights, mask=query_exists": "tl.where(visible, weights, 1e-30), mask=query_exists"},
     "exactly 0 at the hidden keys"),
    ({"numerator = tl.exp(": "numerator = tl.where(n > 40, 0.0, 1.0) * tl.exp("}, "past the cases listed"),
])
def test_causal_softmax_past_the_listed_cases(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_causal_softmax(_kernel("2.2", "causal_softmax_kernel", mistake))


THREE_PASSES = {"row_sum = (row_sum * tl.exp(row_max - grown_max) + tl.sum(tl.exp(tile - grown_max), axis=0)) "
                "row_max = grown_max":
                "row_max = grown_max\n"
                "    for start in range(0, n_cols, BLOCK_COLS):\n"
                "        cols = start + tl.arange(0, BLOCK_COLS)\n"
                '        tile = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf"))\n'
                "        row_sum += tl.sum(tl.exp(tile - row_max), axis=0)"}


@pytest.mark.parametrize("mistake, message", [
    ({'row_max = tl.full((), float("-inf"), tl.float32)': "row_max = tl.full((), 0.0, tl.float32)"},
     "maximum start(s|ed) at 0"),
    (THREE_PASSES, "loaded up to 3 times.*online softmax"),
    ({'other=float("-inf")': "other=-100.0"}, "finite stand-in for -inf"),  # padding wins the max near -200
    ({"tl.store(y_row + cols, tl.exp(tile - row_max) / row_sum, mask=cols < n_cols)":
      # wrong past 1000 columns: beyond every listed case, hidden ones (up to 200) included
      "tl.store(y_row + cols, tl.where(n_cols > 1000, 0.0, tl.exp(tile - row_max) / row_sum), mask=cols < n_cols)"},
     "past the cases listed"),
])
def test_online_softmax_past_the_listed_cases(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_online_softmax(_kernel("2.3", "online_softmax_kernel", mistake))
