"""The checkers of chapter 6 (course_lib/teaching/exercises/chapter6.py) pass a right answer and name each typical mistake."""

import pytest
import torch

import course_lib
from course_lib.teaching import exercises
from course_lib.core import references
from course_lib.teaching.checking import ExerciseError


def _scatter_back(routed, indices, seq_len):
    out = routed.new_zeros(routed.shape[0], seq_len, routed.shape[-1])
    return out.scatter(1, indices[..., None].expand(-1, -1, routed.shape[-1]), routed)


def test_scatter_back_checker(capsys):
    exercises.check_scatter_back(_scatter_back)
    assert capsys.readouterr().out.startswith("Exercise 6.1 passed")
    with pytest.raises(ExerciseError, match="first sequence's tokens"):  # row 0's indices for every row
        exercises.check_scatter_back(lambda r, i, n: _scatter_back(r[:1].expand_as(r), i[:1].expand_as(i), n))
    with pytest.raises(ExerciseError, match="not zero"):  # started from ones, not zeros
        exercises.check_scatter_back(lambda r, i, n: _scatter_back(r, i, n) + (_scatter_back(r, i, n) == 0))
    with pytest.raises(ExerciseError, match="does not require grad"):
        exercises.check_scatter_back(lambda r, i, n: _scatter_back(r.detach(), i, n))


def _routed_causal_mask(positions):
    return positions[:, None, :] > positions[:, :, None]


def test_routed_causal_mask_checker(capsys):
    exercises.check_routed_causal_mask(_routed_causal_mask)
    assert capsys.readouterr().out.startswith("Exercise 6.2 passed")
    with pytest.raises(ExerciseError, match="by score, not by position"):
        exercises.check_routed_causal_mask(
            lambda p: torch.ones(p.shape[1], p.shape[1], dtype=torch.bool, device=p.device).triu(1).expand(p.shape[0], -1, -1))
    with pytest.raises(ExerciseError, match="transposed"):
        exercises.check_routed_causal_mask(lambda p: _routed_causal_mask(p).transpose(1, 2))
    with pytest.raises(ExerciseError, match="must see itself"):
        exercises.check_routed_causal_mask(lambda p: p[:, None, :] >= p[:, :, None])
    with pytest.raises(ExerciseError, match="torch.bool"):
        exercises.check_routed_causal_mask(lambda p: _routed_causal_mask(p).float())


def _route(s, mask, num_tokens, *, use_mask=True, zero_padding=True, straight_through=True):
    weights = course_lib.coor_descent(s, n_iters=20, k=min(num_tokens * 9 / 8, s.shape[-1]), eps=0.03, eps_init=4.0,
                                      eps_decay=0.7, mask=mask if use_mask else None)
    weights, indices = weights.topk(num_tokens, dim=-1)
    if straight_through:
        weights = weights + (1.0 - weights).detach()
    else:
        weights = torch.ones_like(weights)
    if zero_padding:
        weights = weights.masked_fill(~mask.gather(1, indices), 0.0)
    return indices, weights


def test_route_checker(capsys):
    exercises.check_route(_route)
    assert capsys.readouterr().out.startswith("Exercise 6.3 passed")
    with pytest.raises(ExerciseError, match="(?i)pass mask to coor_descent"):
        exercises.check_route(lambda s, m, k: _route(s, m, k, use_mask=False))
    with pytest.raises(ExerciseError, match="must be 0"):
        exercises.check_route(lambda s, m, k: _route(s, m, k, zero_padding=False))
    with pytest.raises(ExerciseError, match="do not require grad"):
        exercises.check_route(lambda s, m, k: _route(s, m, k, straight_through=False))
    with pytest.raises(ExerciseError, match="return a tuple"):
        exercises.check_route(lambda s, m, k: _route(s, m, k)[0])
