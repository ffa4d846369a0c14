"""The checkers of chapter 4 (course_lib/teaching/exercises/chapter4.py) pass a right answer and name each typical mistake."""

import pytest
import torch

import course_lib
from course_lib.teaching import exercises
from course_lib.core import references
from course_lib.teaching.checking import ExerciseError


def _right_coor_descent_step(s, a, logk, eps):
    return eps * logk - eps * torch.logsumexp(torch.minimum(s, -a[..., None]) / eps, dim=-1)


def test_coor_descent_step_checker(capsys):
    exercises.check_coor_descent_step(_right_coor_descent_step)
    assert capsys.readouterr().out.startswith("Exercise 4.1 passed")
    with pytest.raises(ExerciseError, match="not a_t"):  # min(s, a): the sign of a lost
        exercises.check_coor_descent_step(
            lambda s, a, logk, eps: eps * logk - eps * torch.logsumexp(torch.minimum(s, a[..., None]) / eps, dim=-1))
    with pytest.raises(ExerciseError, match="multiplied by eps too"):
        exercises.check_coor_descent_step(
            lambda s, a, logk, eps: eps * logk - torch.logsumexp(torch.minimum(s, -a[..., None]) / eps, dim=-1))
    with pytest.raises(ExerciseError, match="torch.logsumexp"):  # log(sum(exp)) overflows on large scores
        exercises.check_coor_descent_step(
            lambda s, a, logk, eps: eps * logk - eps * torch.exp(torch.minimum(s, -a[..., None]) / eps).sum(-1).log())
    with pytest.raises(ExerciseError, match="got None"):
        exercises.check_coor_descent_step(lambda s, a, logk, eps: None)


def _right_routing_weights(a, s, eps, mask=None):
    y = torch.exp(torch.clamp(s + a[..., None], max=0.0) / eps)
    return y if mask is None else torch.where(mask, y, 0.0)


def test_routing_weights_checker(capsys):
    exercises.check_routing_weights(_right_routing_weights)
    assert capsys.readouterr().out.startswith("Exercise 4.2 passed")
    with pytest.raises(ExerciseError, match="never exceeds 1"):  # no minimum with 0
        exercises.check_routing_weights(lambda a, s, eps, mask=None: torch.exp((s + a[..., None]) / eps))
    with pytest.raises(ExerciseError, match="exactly 0 where mask is False"):  # the mask ignored
        exercises.check_routing_weights(lambda a, s, eps, mask=None: _right_routing_weights(a, s, eps))
    with pytest.raises(ExerciseError, match=r"NaN \* 0 is NaN"):  # y * mask
        exercises.check_routing_weights(lambda a, s, eps, mask=None: _right_routing_weights(a, s, eps) * (
            1.0 if mask is None else mask))
    with pytest.raises(ExerciseError, match="raised"):  # a not given its last axis: shapes do not broadcast
        exercises.check_routing_weights(lambda a, s, eps, mask=None: torch.exp(torch.clamp(s + a, max=0.0) / eps))


def _right_lse_of_min(s, a, eps):
    return torch.logsumexp(torch.minimum(s, -a[:, None]) / eps, dim=-1)


def test_row_logsumexp_of_min_checker(capsys):
    exercises.check_row_logsumexp_of_min(_right_lse_of_min)
    assert capsys.readouterr().out.startswith("Exercise 4.3 passed")

    def padded_with_zeros(s, a, eps):  # lanes past the end loaded as 0, as with other=0.0
        width = 1 << (s.shape[1] - 1).bit_length()
        return _right_lse_of_min(torch.cat([s, s.new_zeros(s.shape[0], width - s.shape[1])], dim=1), a, eps)

    with pytest.raises(ExerciseError, match="past the end of the row"):
        exercises.check_row_logsumexp_of_min(padded_with_zeros)
    with pytest.raises(ExerciseError, match="row max is subtracted"):
        exercises.check_row_logsumexp_of_min(
            lambda s, a, eps: torch.exp(torch.minimum(s, -a[:, None]) / eps).sum(-1).log())
    with pytest.raises(ExerciseError, match="stride_s_row"):  # rows read as if contiguous
        exercises.check_row_logsumexp_of_min(
            lambda s, a, eps: _right_lse_of_min(torch.as_strided(s, s.shape, (s.shape[1], 1)), a, eps))
    with pytest.raises(ExerciseError, match="not a_i"):
        exercises.check_row_logsumexp_of_min(
            lambda s, a, eps: torch.logsumexp(torch.minimum(s, a[:, None]) / eps, dim=-1))


def _right_da_next_da(s, a, eps):
    p = torch.softmax(torch.minimum(s, -a[..., None]) / eps, dim=-1)
    return (p * (s > -a[..., None])).sum(dim=-1)


def test_da_next_da_checker(capsys):
    exercises.check_da_next_da(_right_da_next_da)
    assert capsys.readouterr().out.startswith("Exercise 4.4 passed")
    with pytest.raises(ExerciseError, match="not where it takes s_j"):  # the complement
        exercises.check_da_next_da(lambda s, a, eps: 1 - _right_da_next_da(s, a, eps))
    with pytest.raises(ExerciseError, match="no factor eps"):
        exercises.check_da_next_da(lambda s, a, eps: eps * _right_da_next_da(s, a, eps))
    with pytest.raises(ExerciseError, match="not of s / eps"):
        exercises.check_da_next_da(
            lambda s, a, eps: (torch.softmax(s / eps, dim=-1) * (s > -a[..., None])).sum(dim=-1))
    with pytest.raises(ExerciseError, match="only positions where the minimum takes -a_t count"):
        exercises.check_da_next_da(lambda s, a, eps: torch.ones(s.shape[:-1], dtype=s.dtype))
