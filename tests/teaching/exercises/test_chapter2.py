"""The checkers of chapter 2 (course_lib/teaching/exercises/chapter2.py) pass a right answer and name each typical mistake."""

import pytest
import torch

import course_lib
from course_lib.teaching import exercises
from course_lib.core import references
from course_lib.teaching.checking import ExerciseError


def test_softmax_rows_checker(capsys):
    exercises.check_softmax_rows(lambda x: torch.softmax(x, dim=-1))
    assert capsys.readouterr().out.startswith("Exercise 2.1 passed")
    with pytest.raises(ExerciseError, match="exp overflows"):  # no max subtracted: inf / inf
        exercises.check_softmax_rows(lambda x: x.exp() / x.exp().sum(dim=-1, keepdim=True))
    with pytest.raises(ExerciseError, match="wrong columns"):  # padding lanes counted as exp(0)
        exercises.check_softmax_rows(lambda x: x.exp() / (x.exp().sum(dim=-1, keepdim=True) + 1))
    with pytest.raises(ExerciseError, match="stride_x_row"):  # rows read as if contiguous
        exercises.check_softmax_rows(
            lambda x: torch.softmax(torch.as_strided(x, x.shape, (x.shape[1], 1)), dim=-1))


def _right_causal_mask(scores):
    if scores.shape[-1] != scores.shape[-2]:
        raise ValueError("not square")
    return references.causal_mask(scores.shape[-1], scores.device)


def test_causal_mask_checker(capsys):
    exercises.check_causal_mask(_right_causal_mask)
    assert capsys.readouterr().out.startswith("Exercise 2.2 passed")
    # the scores' own shape is accepted too
    exercises.check_causal_mask(lambda s: _right_causal_mask(s).expand(s.shape))
    assert capsys.readouterr().out.startswith("Exercise 2.2 passed")
    with pytest.raises(ExerciseError, match="diagonal is hidden too"):
        exercises.check_causal_mask(
            lambda s: _right_causal_mask(s) | torch.eye(s.shape[-1], dtype=torch.bool, device=s.device))
    with pytest.raises(ExerciseError, match="swapped"):
        exercises.check_causal_mask(lambda s: ~_right_causal_mask(s))
    with pytest.raises(ExerciseError, match="torch.bool"):
        exercises.check_causal_mask(lambda s: _right_causal_mask(s).float())
    with pytest.raises(ExerciseError, match="not square"):
        exercises.check_causal_mask(lambda s: references.causal_mask(s.shape[-1], s.device))
    with pytest.raises(ExerciseError, match="got None"):
        exercises.check_causal_mask(lambda s: None)


def test_softmax_grad_checker(capsys):
    exercises.check_softmax_grad(lambda y, g: y * (g - (y * g).sum(dim=-1, keepdim=True)))
    assert capsys.readouterr().out.startswith("Exercise 2.3 passed")
    from course_lib.core.references import softmax_backward  # an alias is refused too

    with pytest.raises(ExerciseError, match="answers it outright may not be called"):
        exercises.check_softmax_grad(softmax_backward)
    assert softmax_backward(torch.ones(2), torch.ones(2)).tolist() == [-1.0, -1.0]  # and works again after
    with pytest.raises(ExerciseError, match="y of shape"):  # the sum of grad_y alone, not of y * grad_y
        exercises.check_softmax_grad(lambda y, g: y * (g - g.sum(dim=-1, keepdim=True)))
    with pytest.raises(ExerciseError, match="raised RuntimeError"):  # forgot keepdim: shapes do not broadcast
        exercises.check_softmax_grad(lambda y, g: y * (g - (y * g).sum(dim=-1)))


def _right_online_stats(x, tile):
    running_max = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype)
    running_sum = torch.zeros(x.shape[:-1], dtype=x.dtype)
    for start in range(0, x.shape[-1], tile):
        block = x[..., start:start + tile]
        new_max = torch.maximum(running_max, block.amax(dim=-1))
        shift = torch.where(new_max == float("-inf"), 0.0, new_max)
        running_sum = running_sum * torch.exp(running_max - shift) + torch.exp(block - shift[..., None]).sum(dim=-1)
        running_max = new_max
    return running_max, running_sum


def test_online_softmax_stats_checker(capsys):
    exercises.check_online_softmax_stats(_right_online_stats)
    assert capsys.readouterr().out.startswith("Exercise 2.4 passed")

    def no_rescale(x, tile):
        running_max, running_sum = _right_online_stats(x[..., :tile], tile)
        for start in range(tile, x.shape[-1], tile):
            block = x[..., start:start + tile]
            running_max = torch.maximum(running_max, block.amax(dim=-1))
            running_sum = running_sum + torch.exp(block - running_max[..., None]).sum(dim=-1)
        return running_max, running_sum

    with pytest.raises(ExerciseError, match="rescaled"):
        exercises.check_online_softmax_stats(no_rescale)

    def no_guard(x, tile):
        running_max = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype)
        running_sum = torch.zeros(x.shape[:-1], dtype=x.dtype)
        for start in range(0, x.shape[-1], tile):
            block = x[..., start:start + tile]
            new_max = torch.maximum(running_max, block.amax(dim=-1))
            running_sum = running_sum * torch.exp(running_max - new_max) + torch.exp(block - new_max[..., None]).sum(-1)
            running_max = new_max
        return running_max, running_sum

    with pytest.raises(ExerciseError, match="all -inf"):
        exercises.check_online_softmax_stats(no_guard)
    with pytest.raises(ExerciseError, match="return a tuple"):
        exercises.check_online_softmax_stats(lambda x, tile: x.amax(dim=-1))
