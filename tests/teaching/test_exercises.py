"""Each checker passes a right answer and rejects typical wrong ones."""

import pytest
import torch

import course_lib
from course_lib.teaching import exercises
from course_lib.core import references
from course_lib.teaching.checking import ExerciseError


@pytest.fixture(autouse=True, params=[False, True], ids=["visible sizes", "hidden sizes"])
def hidden_sizes(request, monkeypatch):
    """Every checker as a student runs it, and as grading runs it: with one more case of
    random size (exercises.common.HIDDEN_SIZES), which right answers must pass too."""
    monkeypatch.setattr(exercises.common, "HIDDEN_SIZES", request.param)
    return request.param


def test_scale_columns_checker(capsys):
    exercises.check_scale_columns(lambda x, w: x * w)
    assert capsys.readouterr().out.startswith("Exercise 1.1 passed")
    with pytest.raises(ExerciseError, match="wrong columns"):
        exercises.check_scale_columns(lambda x, w: torch.cat([x[:, :-1] * w[:-1], x[:, -1:]], dim=1))
    with pytest.raises(ExerciseError, match="got None"):
        exercises.check_scale_columns(lambda x, w: None)


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


def test_column_sum_checker(capsys):
    exercises.check_column_sum(lambda p: p.sum(0))
    assert capsys.readouterr().out.startswith("Exercise 1.3 passed")
    with pytest.raises(ExerciseError, match="partial of shape"):
        exercises.check_column_sum(lambda p: p[: 8].sum(0))  # forgot rows past the first tile


# ----------------------------------------------------------- chapter 2: causal softmax


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


# --------------------------------------------------------------- chapter 3: LayerNorm


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


# ------------------------------------------------------ chapter 4: coordinate descent


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


# ---------------------------------------------------- chapter 5: from kernel to layer

_op_names = iter(range(10**6))


def scale_columns_test_op(body, fake=lambda x, w: x.new_empty(x.shape)):
    """A custom operator of a name not used before, with ``body`` and (unless None) ``fake``."""
    @torch.library.custom_op(f"course_lib_tests::scale_columns_{next(_op_names)}", mutates_args=())
    def op(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return body(x, w)

    if fake is not None:
        op.register_fake(fake)
    return op


def test_scale_columns_op_checker(capsys):
    exercises.check_scale_columns_op(scale_columns_test_op(lambda x, w: x * w))
    assert capsys.readouterr().out.startswith("Exercise 5.1 passed")
    with pytest.raises(ExerciseError, match="custom_op made"):
        exercises.check_scale_columns_op(lambda x, w: x * w)
    with pytest.raises(ExerciseError, match="register a fake"):
        exercises.check_scale_columns_op(scale_columns_test_op(lambda x, w: x * w, fake=None))
    with pytest.raises(ExerciseError, match="shape \\(6, 7\\)"):
        exercises.check_scale_columns_op(scale_columns_test_op(lambda x, w: x * w, fake=lambda x, w: x.new_empty(7)))
    with pytest.raises(ExerciseError, match="x of shape"):
        exercises.check_scale_columns_op(scale_columns_test_op(lambda x, w: x * w.flip(0)))
    with pytest.raises(ExerciseError, match="may not alias"):  # returns its input, changed in place
        exercises.check_scale_columns_op(scale_columns_test_op(lambda x, w: x.mul_(w)))
    with pytest.raises(ExerciseError, match="strides \\(7, 1\\), the real one's \\(1, 6\\)"):  # fake row-major
        exercises.check_scale_columns_op(scale_columns_test_op(lambda x, w: (x * w).t().contiguous().t()))


def test_scale_columns_autograd_checker(capsys):
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def backward(ctx, grad_out):
        x, w = ctx.saved_tensors
        return grad_out * w, (grad_out * x).sum(0)

    def backward_forgets_the_sum(ctx, grad_out):
        x, w = ctx.saved_tensors
        return grad_out * w, (grad_out * x)[0]

    op = scale_columns_test_op(lambda x, w: x * w)
    op.register_autograd(backward, setup_context=setup_context)
    exercises.check_scale_columns_autograd(op)
    assert capsys.readouterr().out.startswith("Exercise 5.2 passed")
    with pytest.raises(ExerciseError, match="register_autograd"):
        exercises.check_scale_columns_autograd(scale_columns_test_op(lambda x, w: x * w))
    wrong = scale_columns_test_op(lambda x, w: x * w)
    wrong.register_autograd(backward_forgets_the_sum, setup_context=setup_context)
    with pytest.raises(ExerciseError, match="grad of w"):
        exercises.check_scale_columns_autograd(wrong)


def test_without_graph_breaks_checker(capsys):
    exercises.check_without_graph_breaks(lambda x: torch.softmax(x / x.abs().max().clamp(min=1.0), dim=-1))
    assert capsys.readouterr().out.startswith("Exercise 5.3 passed")
    with pytest.raises(ExerciseError, match="breaks the graph 1 time.*item"):
        exercises.check_without_graph_breaks(lambda x: torch.softmax(x / max(x.abs().max().item(), 1.0), dim=-1))
    with pytest.raises(ExerciseError, match="every \\|x\\| < 1"):  # divides by max |x| even below 1
        exercises.check_without_graph_breaks(lambda x: torch.softmax(x / x.abs().max(), dim=-1))


# ------------------------------------------------------------ chapter 6: routed block


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
