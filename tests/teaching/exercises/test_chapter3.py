"""The checkers of chapter 3 (course_lib/teaching/exercises/chapter3.py) pass a right answer and name each typical mistake."""

import pytest
import torch

import course_lib
from course_lib.teaching import exercises
from course_lib.core import references
from course_lib.teaching.checking import ExerciseError


def _layernorm_rows_torch(x, gamma, beta, eps, one_pass=False, unbiased=False):
    mean = x.mean(dim=-1)
    if one_pass:
        var = (x * x).mean(dim=-1) - mean * mean
    else:
        var = x.var(dim=-1, unbiased=unbiased)
    rstd = torch.rsqrt(var + eps)
    return (x - mean[:, None]) * rstd[:, None] * gamma + beta, mean, rstd


def test_layernorm_rows_checker(capsys):
    exercises.check_layernorm_rows(_layernorm_rows_torch)
    assert capsys.readouterr().out.startswith("Exercise 3.1 passed")
    with pytest.raises(ExerciseError, match="cancels catastrophically"):
        exercises.check_layernorm_rows(lambda x, g, b, eps: _layernorm_rows_torch(x, g, b, eps, one_pass=True))
    with pytest.raises(ExerciseError, match="divide by N"):  # unbiased variance: N - 1
        exercises.check_layernorm_rows(
            lambda x, g, b, eps: _layernorm_rows_torch(x, g, b, eps, unbiased=x.shape[1] > 1))
    with pytest.raises(ExerciseError, match="stride_x_row"):  # rows read as if contiguous
        exercises.check_layernorm_rows(
            lambda x, g, b, eps: _layernorm_rows_torch(torch.as_strided(x, x.shape, (x.shape[1], 1)), g, b, eps))
    with pytest.raises(ExerciseError, match="elements are NaN"):  # the last row never written
        exercises.check_layernorm_rows(lambda x, g, b, eps: tuple(
            torch.cat([t[:-1], torch.full_like(t[-1:], float("nan"))]) for t in _layernorm_rows_torch(x, g, b, eps)))
    with pytest.raises(ExerciseError, match="return a tuple"):
        exercises.check_layernorm_rows(lambda x, g, b, eps: _layernorm_rows_torch(x, g, b, eps)[0])


def _right_layernorm_dx(x, gamma, dy, mean, rstd):
    xhat = (x - mean[..., None]) * rstd[..., None]
    g = dy * gamma
    return (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True)) * rstd[..., None]


def test_layernorm_dx_checker(capsys):
    exercises.check_layernorm_dx(_right_layernorm_dx)
    assert capsys.readouterr().out.startswith("Exercise 3.2 passed")
    with pytest.raises(ExerciseError, match="multiply dy by gamma"):
        exercises.check_layernorm_dx(lambda x, gamma, dy, mean, rstd: _right_layernorm_dx(x, 1.0, dy, mean, rstd))
    with pytest.raises(ExerciseError, match="is missing"):  # the xhat term left out
        exercises.check_layernorm_dx(lambda x, gamma, dy, mean, rstd: (
            dy * gamma - (dy * gamma).mean(-1, keepdim=True)) * rstd[..., None])

    def summed(x, gamma, dy, mean, rstd):  # sums where the formula has means
        xhat = (x - mean[..., None]) * rstd[..., None]
        g = dy * gamma
        return (g - g.sum(-1, keepdim=True) - xhat * (g * xhat).sum(-1, keepdim=True)) * rstd[..., None]

    with pytest.raises(ExerciseError, match="not sums"):
        exercises.check_layernorm_dx(summed)
    with pytest.raises(ExerciseError, match=r"shape \(3, 3\), expected \(3, 1\)"):  # mean not given a last axis
        exercises.check_layernorm_dx(lambda x, gamma, dy, mean, rstd: (dy * gamma - (dy * gamma).mean(-1, keepdim=True)
                                                                       - (x - mean) * rstd) * rstd)


def _right_partial_sums(x, n_programs):
    rows_per_program = -(-x.shape[0] // n_programs)
    return torch.stack([x[s:s + rows_per_program].sum(0) for s in range(0, x.shape[0], rows_per_program)])


def test_column_partial_sums_checker(capsys):
    exercises.check_column_partial_sums(_right_partial_sums)
    assert capsys.readouterr().out.startswith("Exercise 3.3 passed")

    def past_own_rows(x, n_programs):  # tiles of 4 rows masked with n_rows only
        rows_per_program = -(-x.shape[0] // n_programs)
        return torch.stack([x[s:s + -(-rows_per_program // 4) * 4].sum(0)
                            for s in range(0, x.shape[0], rows_per_program)])

    with pytest.raises(ExerciseError, match="counted twice or not at all"):
        exercises.check_column_partial_sums(past_own_rows)
    with pytest.raises(ExerciseError, match="stride_x_row"):
        exercises.check_column_partial_sums(
            lambda x, p: _right_partial_sums(torch.as_strided(x, x.shape, (x.shape[1], 1)), p))
    with pytest.raises(ExerciseError, match="got None"):
        exercises.check_column_partial_sums(lambda x, p: None)


def _right_grad_through_row_max(x, grad_z):
    m = x.amax(dim=-1, keepdim=True)
    is_max = (x == m).to(x.dtype)
    grad_m = -(grad_z * x).sum(dim=-1, keepdim=True) / (m * m)
    return grad_z / m + is_max * grad_m / is_max.sum(dim=-1, keepdim=True)


def test_grad_through_row_max_checker(capsys):
    exercises.check_grad_through_row_max(_right_grad_through_row_max)
    assert capsys.readouterr().out.startswith("Exercise 3.4 passed")
    with pytest.raises(ExerciseError, match="dL/dm"):  # the seed's mistake, without its factor m
        exercises.check_grad_through_row_max(lambda x, g: g / x.amax(dim=-1, keepdim=True))
    with pytest.raises(ExerciseError, match="share dL/dm equally"):

        def unshared(x, grad_z):
            m = x.amax(dim=-1, keepdim=True)
            return grad_z / m - (x == m) * (grad_z * x).sum(dim=-1, keepdim=True) / (m * m)

        exercises.check_grad_through_row_max(unshared)
    with pytest.raises(ExerciseError, match="grad_z / m"):
        exercises.check_grad_through_row_max(lambda x, g: g)
