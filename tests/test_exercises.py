"""Each checker passes a right answer and rejects typical wrong ones."""

import pytest
import torch

from course_lib import exercises, references
from course_lib.checking import ExerciseError


def test_scale_columns_checker(capsys):
    exercises.check_scale_columns(lambda x, w: x * w)
    assert capsys.readouterr().out.startswith("Exercise 1.1 passed")
    with pytest.raises(ExerciseError, match="wrong columns"):
        exercises.check_scale_columns(lambda x, w: torch.cat([x[:, :-1] * w[:-1], x[:, -1:]], dim=1))
    with pytest.raises(ExerciseError, match="got None"):
        exercises.check_scale_columns(lambda x, w: None)


def test_weighted_sum_grads_checker(capsys):
    exercises.check_weighted_sum_grads(references.weighted_sum_backward)
    assert capsys.readouterr().out.startswith("Exercise 1.2 passed")
    with pytest.raises(ExerciseError, match="grad_w"):
        exercises.check_weighted_sum_grads(lambda x, w, g: (g[..., None] * w, x.reshape(-1, x.shape[-1]).sum(0)))
    with pytest.raises(ExerciseError, match="return a tuple"):
        exercises.check_weighted_sum_grads(lambda x, w, g: g[..., None] * w)


def test_column_sum_checker(capsys):
    exercises.check_column_sum(lambda p: p.sum(0))
    assert capsys.readouterr().out.startswith("Exercise 1.3 passed")
    with pytest.raises(ExerciseError, match="partial of shape"):
        exercises.check_column_sum(lambda p: p[: 8].sum(0))  # forgot rows past the first tile
