"""LayerNorm over the last dimension: y = (x - mean(x)) * rstd * gamma + beta.

Chapter 3's teaching core: rows held whole in registers. Read top to bottom: the
Triton kernels, the host launchers that pick tiles and grids, the
``torch.autograd.Function``, the operators ``torch.compile`` traces, the public
``layernorm`` and the ``LayerNorm`` module that stands in for ``torch.nn.LayerNorm``.
Rows wider than a tile take the kernels of ``wide_rows`` (the chapter's optional
section); the pieces both use are in ``parts``.

What training saves is one float32 mean and one rstd per row, not whole tensors: the
backward reloads ``x`` and recomputes ``xhat = (x - mean) * rstd``. The backward's
``dgamma`` and ``dbeta`` are column sums over every row, reduced in two deterministic
stages without atomics: a persistent grid whose programs each own a contiguous range of
rows write their dx and one float32 partial row, then ``rows.sum_partial_rows`` adds
the partial rows in a fixed order.

Constant rows. The forward takes each row's mean relative to the row's first value, so
a constant row, of any width and magnitude, has a mean of exactly its value and centres
to exactly 0: y is exactly beta. An ulp left there would be multiplied by
``rstd = 1 / sqrt(eps)``, 316 for the default eps. Every division is ``tl.div_rn``,
rounded correctly as on a CPU: on a GPU Triton compiles float32 ``/`` to an approximate
division (up to 2 ulp off).

``stable=True``, the seed's option, divides each row by its maximum first: z = x / m.
It is not in the kernels: LayerNorm of z is the plain kernels' work, the division and
the gradient's path through m are PyTorch's (StableLayerNormFunction).
"""

import numbers
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl
from torch import nn

from .parts import (backward_config, column_block, first_values, forward_tiles, grad_x_of,
                              load_backward_rows, partial_rows, store_partial_row, stride_of, xhat_of)
from .wide_rows import backward_split_rows, backward_two_stages, can_split_rows, layernorm_forward_looped_kernel
from ...core import references
from ...core.operator import differentiable_op
from ...core.rows import as_rows, known_multiple_of, shaped_like, sum_partial_rows, width_hint
from ...core.runtime import cdiv, is_cooperative_refusal, launch, multiprocessor_count
from ...core.validation import (FLOAT_DTYPES, INT32_LIMIT, PUBLIC_DTYPES, _names, check_index_range, check_like,
                                check_same_device, check_tensor, first_order_only, first_order_only_as,
                                held_for_first_order_only, on_device_of, plain_inputs, runs_reference, by_reference,
                                autocast_as_float32_ops)

# ---------------------------------------------------------------------------- kernels


@triton.jit
def layernorm_forward_kernel(
    x_ptr, gamma_ptr, beta_ptr, y_ptr, mean_ptr, rstd_ptr,
    n_rows, n_cols, eps,
    stride_x_row, stride_x_col, stride_gamma, stride_beta, stride_y_row,
    HAS_GAMMA: tl.constexpr, HAS_BETA: tl.constexpr, SAVE_STATS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, VEC: tl.constexpr,
):
    """One program normalises BLOCK_ROWS whole rows held in registers (BLOCK_COLS >= n_cols)."""
    eps = tl.cast(eps, tl.float32)  # inductor passes a Python float as float64
    n_cols = known_multiple_of(n_cols, VEC)  # the same numbers, visibly multiples of VEC (width_hint)
    stride_x_row = known_multiple_of(stride_x_row, VEC)
    stride_y_row = known_multiple_of(stride_y_row, VEC)
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_COLS)
    row_mask = rows < n_rows
    col_mask = cols < n_cols
    mask = row_mask[:, None] & col_mask[None, :]
    # 64-bit offsets: rows * stride can pass 2**31 on large inputs.
    rows64 = rows.to(tl.int64)
    x = tl.load(
        x_ptr + rows64[:, None] * stride_x_row + cols[None, :].to(tl.int64) * stride_x_col,
        mask=mask, other=0.0,
    ).to(tl.float32)

    # Statistics in two steps over registers: the mean first, then the variance of
    # x - mean, which cannot cancel the way E[x^2] - E[x]^2 does. The mean is taken of
    # x - shift, shift being the row's first value, so a constant row sums to exactly 0
    # and centres to exactly 0 (module docstring).
    shift = first_values(x_ptr, rows64, row_mask, stride_x_row)
    n_values = n_cols * 1.0  # as a float, for tl.div_rn
    mean = shift + tl.div_rn(tl.sum(tl.where(mask, x - shift[:, None], 0.0), axis=1), n_values)
    centred = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.div_rn(tl.sum(centred * centred, axis=1), n_values)
    rstd = tl.rsqrt(var + eps)

    y = centred * rstd[:, None]
    if HAS_GAMMA:
        y *= tl.load(gamma_ptr + cols.to(tl.int64) * stride_gamma, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    if HAS_BETA:
        y += tl.load(beta_ptr + cols.to(tl.int64) * stride_beta, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rows64[:, None] * stride_y_row + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
    if SAVE_STATS:
        tl.store(mean_ptr + rows, mean, mask=row_mask)
        tl.store(rstd_ptr + rows, rstd, mask=row_mask)


@triton.jit
def layernorm_backward_kernel(
    x_ptr, gamma_ptr, grad_y_ptr, mean_ptr, rstd_ptr, grad_x_ptr, partial_ptr,
    n_rows, n_cols, rows_per_program,
    stride_x_row, stride_x_col, stride_gamma, stride_grad_y_row, stride_grad_y_col,
    stride_grad_x_row, stride_partial_row,
    HAS_GAMMA: tl.constexpr, HAS_BETA: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, NUM_STAGES: tl.constexpr, VEC: tl.constexpr,
):
    """A persistent program: dx for its range of rows, whole rows in registers.

    Along the way it adds dy * xhat and dy into float32 registers and, at the end,
    writes them as its partial row of dgamma (then dbeta): no atomics, and the partial
    rows are added in a fixed order afterwards.
    """
    n_cols = known_multiple_of(n_cols, VEC)  # the same numbers, visibly multiples of VEC (width_hint)
    stride_x_row = known_multiple_of(stride_x_row, VEC)
    stride_grad_y_row = known_multiple_of(stride_grad_y_row, VEC)
    stride_grad_x_row = known_multiple_of(stride_grad_x_row, VEC)
    program = tl.program_id(0)
    cols, col_mask, col_offsets_x, col_offsets_grad_y = column_block(
        0, n_cols, stride_x_col, stride_grad_y_col, BLOCK_COLS)
    if HAS_GAMMA:
        gamma = tl.load(gamma_ptr + cols.to(tl.int64) * stride_gamma, mask=col_mask, other=0.0).to(tl.float32)
    grad_gamma_acc = tl.zeros((BLOCK_ROWS, BLOCK_COLS), dtype=tl.float32)
    grad_beta_acc = tl.zeros((BLOCK_ROWS, BLOCK_COLS), dtype=tl.float32)

    first_row = program * rows_per_program
    last_row = tl.minimum(first_row + rows_per_program, n_rows)
    for row_start in tl.range(first_row, last_row, BLOCK_ROWS, num_stages=NUM_STAGES):
        rows = row_start + tl.arange(0, BLOCK_ROWS)
        row_mask = rows < last_row
        mask = row_mask[:, None] & col_mask[None, :]
        x, grad_y, mean, rstd = load_backward_rows(
            x_ptr, grad_y_ptr, mean_ptr, rstd_ptr, rows, mask, row_mask,
            col_offsets_x, col_offsets_grad_y, stride_x_row, stride_grad_y_row,
        )
        xhat = xhat_of(x, mean, rstd, mask)
        weighted_grad = grad_y * gamma[None, :] if HAS_GAMMA else grad_y
        c1 = tl.div_rn(tl.sum(weighted_grad, axis=1), n_cols * 1.0)
        c2 = tl.div_rn(tl.sum(weighted_grad * xhat, axis=1), n_cols * 1.0)
        # A row of one value normalises to beta whatever x is: its dx is exactly 0, as torch's.
        # weighted_grad - c1 is not: on a GPU the compiler fuses dy * gamma - c1 into an fma,
        # which keeps the product unrounded, and its rounding error times rstd (1e-5) is left.
        grad_x_scale = tl.where(n_cols == 1, 0.0, rstd)
        tl.store(
            grad_x_ptr + rows.to(tl.int64)[:, None] * stride_grad_x_row + cols[None, :],
            grad_x_of(weighted_grad, xhat, grad_x_scale, c1, c2).to(grad_x_ptr.dtype.element_ty),
            mask=mask,
        )
        grad_gamma_acc += grad_y * xhat
        grad_beta_acc += grad_y

    store_partial_row(partial_ptr + program.to(tl.int64) * stride_partial_row, cols, col_mask, n_cols,
                      grad_gamma_acc, grad_beta_acc, HAS_GAMMA, HAS_BETA)


# -------------------------------------------------------------------------- launchers


class RowStats(NamedTuple):
    """What the forward saves for the backward: float32, one value a row."""

    mean: torch.Tensor
    rstd: torch.Tensor


def layernorm_forward(x, gamma, beta, eps, *, save_stats, tiles=None):
    """Launch a forward kernel; return (y, RowStats or None). ``tiles`` overrides forward_tiles."""
    x2d = as_rows(x)
    n_rows, n_cols = x2d.shape
    # In x's shape, not a view of its rows: a caller may change y in place (y += residual).
    y = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    y2d = as_rows(y)
    stats = None
    if save_stats:
        stats = RowStats(*(torch.empty(n_rows, device=x.device, dtype=torch.float32) for _ in range(2)))
    if n_rows == 0:
        return y, stats
    # int(): traced with dynamic shapes, the width is a SymInt, which the cache cannot hash
    block_rows, block_cols, num_warps, num_stages = tiles or forward_tiles(int(n_cols), x.element_size())
    if block_cols >= n_cols:
        kernel, loop_options = layernorm_forward_kernel, {}
    else:
        kernel, loop_options = layernorm_forward_looped_kernel, {"NUM_STAGES": num_stages}
    mean, rstd = stats or (None, None)
    with on_device_of(x):
        launch(kernel, (cdiv(n_rows, block_rows),),
            x2d, gamma, beta, y2d, mean, rstd,
            n_rows, n_cols, eps,
            x2d.stride(0), x2d.stride(1), stride_of(gamma), stride_of(beta), y2d.stride(0),
            HAS_GAMMA=gamma is not None, HAS_BETA=beta is not None, SAVE_STATS=save_stats,
            BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols, VEC=width_hint(x2d, y2d), num_warps=num_warps,
            **loop_options,
        )
    return y, stats


def _backward_whole_rows(x2d, gamma, has_beta, grad_y, grad_x, stats, config, partial_width, vec):
    """The persistent kernel: dx, and the partial rows of dgamma and dbeta it returns."""
    n_rows, n_cols = x2d.shape
    block_rows, block_cols, num_warps, num_stages = config.tiles
    rows_per_group, partial = partial_rows(
        n_rows, block_rows, config.programs_per_sm * multiprocessor_count(), partial_width, x2d.device
    )
    launch(layernorm_backward_kernel, (partial.shape[0],),
        x2d, gamma, grad_y, stats.mean, stats.rstd, grad_x, partial,
        n_rows, n_cols, rows_per_group,
        x2d.stride(0), x2d.stride(1), stride_of(gamma), grad_y.stride(0), grad_y.stride(1),
        grad_x.stride(0), partial.stride(0),
        HAS_GAMMA=gamma is not None, HAS_BETA=has_beta,
        BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols, NUM_STAGES=num_stages, VEC=vec, num_warps=num_warps,
    )
    return partial


def layernorm_backward(grad_y, x, gamma, has_beta, stats, *, param_dtype=None, config=None):
    """Launch the backward; return (grad_x, grad_gamma or None, grad_beta or None).

    ``param_dtype``: the dtype of gamma and beta, and of their gradients (x's if None).
    ``config`` overrides backward_config (a BackwardConfig).
    """
    x2d = as_rows(x)
    n_rows, n_cols = x2d.shape
    grad_y = as_rows(grad_y)
    grad_x = torch.empty((n_rows, n_cols), device=x.device, dtype=x.dtype)
    has_gamma = gamma is not None
    partial_width = (int(has_gamma) + int(has_beta)) * n_cols  # dgamma's partial row, then dbeta's
    param_dtype = param_dtype or x.dtype
    if n_rows == 0:
        sums = torch.zeros(partial_width, device=x.device, dtype=param_dtype)
    else:
        config = config or backward_config(int(n_cols), x.element_size())  # int(): as the forward's
        if config.tiles.block_cols >= n_cols:
            backward, plan = _backward_whole_rows, config
        elif config.split_block and can_split_rows(x2d, config.split_block):
            backward, plan = backward_split_rows, config.split_block
        else:
            backward, plan = backward_two_stages, config
        vec = width_hint(x2d, grad_y, grad_x)
        with on_device_of(x):
            try:
                partial = backward(x2d, gamma, has_beta, grad_y, grad_x, stats, plan, partial_width, vec)
            except RuntimeError as error:
                if backward is not backward_split_rows or not is_cooperative_refusal(error):
                    raise
                # CUDA could not make the row's programs resident together (an MPS share, a MIG slice).
                partial = backward_two_stages(x2d, gamma, has_beta, grad_y, grad_x, stats, config, partial_width, vec)
            sums = sum_partial_rows(partial, param_dtype) if partial_width else None
    grad_gamma = sums[:n_cols] if has_gamma else None
    grad_beta = sums[partial_width - n_cols:] if has_beta else None
    return shaped_like(grad_x, x), grad_gamma, grad_beta


def _param_dtype(x, gamma, beta):
    """The dtype of gamma and beta (_check_inputs made them agree), x's if neither is given."""
    param = gamma if gamma is not None else beta
    return x.dtype if param is None else param.dtype


# -------------------------------------------------------------------- custom operator
# One unit for torch.compile and for eager autograd (core.operator; weighted_sum_op.py
# says how the paths differ). An operator returns tensors only: the row statistics are
# outputs of the forward, and a missing gradient of gamma or beta is an empty tensor.


def _present(tensor):
    return tensor if tensor.numel() else None


def _eager_backward(grad_y, x, gamma, has_beta, mean, rstd, param_dtype):
    """The eager Function's backward: the gradients, dgamma's and dbeta's two views of one buffer."""
    grad_x, grad_gamma, grad_beta = layernorm_backward(
        grad_y, x, gamma, has_beta, RowStats(mean, rstd), param_dtype=param_dtype
    )
    def or_empty(grad):
        return x.new_empty(0, dtype=param_dtype) if grad is None else grad
    return grad_x, or_empty(grad_gamma), or_empty(grad_beta)


def _backward(
    grad_y: torch.Tensor, x: torch.Tensor, gamma: Optional[torch.Tensor], has_beta: bool, mean: torch.Tensor,
    rstd: torch.Tensor, param_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    grad_x, grad_gamma, grad_beta = _eager_backward(grad_y, x, gamma, has_beta, mean, rstd, param_dtype)
    # An operator's outputs may not alias: dbeta gets a buffer of its own (a launch the eager path skips).
    return grad_x, grad_gamma, grad_beta.clone() if gamma is not None and has_beta else grad_beta


def _save_for_backward(ctx, inputs, output):
    x, gamma, beta, _eps = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, gamma, mean, rstd)
    ctx.has_beta, ctx.param_dtype = beta is not None, _param_dtype(x, gamma, beta)


def _gradients(ctx, backward, grad_y):
    x, gamma, mean, rstd = ctx.saved_tensors
    grad_x, grad_gamma, grad_beta = backward(grad_y, x, gamma, ctx.has_beta, mean, rstd, ctx.param_dtype)
    return grad_x, _present(grad_gamma), _present(grad_beta), None


def _inference(x, gamma, beta, eps):
    return layernorm_forward(x, gamma, beta, eps, save_stats=False)[0]  # inference saves no statistics


def _check_backward(grad_y, x, gamma, has_beta, mean, rstd, param_dtype):
    op = "layernorm_backward"
    _check_inputs(op, x, gamma, None, 0.0, any_float_params=True)
    check_like(op, "grad_y", grad_y, x.shape, x, dtype=FLOAT_DTYPES)  # the stable option's x is float32
    rows = x.numel() // x.shape[-1]
    check_like(op, "mean", mean, (rows,), x, dtype=torch.float32, contiguous=True)
    check_like(op, "rstd", rstd, (rows,), x, dtype=torch.float32, contiguous=True)
    if param_dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: param_dtype must be float32, float16 or bfloat16, got {param_dtype}")
    if gamma is not None and param_dtype != gamma.dtype:  # the gradients come back in gamma's dtype
        raise TypeError(f"{op}: param_dtype must be gamma's dtype, {gamma.dtype}, got {param_dtype}")


@differentiable_op(
    "layernorm", backward=_backward, save=_save_for_backward, gradients=_gradients,
    check=lambda x, gamma, beta, eps: _check_inputs("layernorm", x, gamma, beta, eps, any_float_params=True),
    check_backward=_check_backward,
    differentiable={"x": 0, "gamma": 1, "beta": 2}, inference=_inference, eager_backward=_eager_backward,
    function_name="LayerNormFunction",
)
def LAYERNORM(x: torch.Tensor, gamma: Optional[torch.Tensor], beta: Optional[torch.Tensor],
              eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, stats = layernorm_forward(x, gamma, beta, eps, save_stats=True)
    return y, stats.mean, stats.rstd


layernorm_op = LAYERNORM.operator  # the forward operator, which the stable option below calls
layernorm_backward_op = LAYERNORM.backward_operator


# --------------------------------------------------------------------------- stable
# The seed's option, z = x / m with m each row's maximum, kept out of the kernels: the
# plain operators normalise z, and the gradient's path through m is added here. With
# dz LayerNorm's gradient of z, dL/dx = dz / m, plus, where x is the maximum (shared
# between tied maxima, as autograd does for amax), dL/dm = -sum(dz * z) / m. That sum
# cancels almost to 0 (it is 0 without eps: LayerNorm ignores its input's scale), so it
# is taken as eps * rstd**2 * sum(g * zhat), g = dy * gamma, whose terms do not cancel
# (chapter 3 derives it). Only x, m and the row statistics are saved: z is recomputed.


def _divided_by_row_max(x):
    """(z, m) in float32: z rounded to x's 16-bit dtype would add an error of its own."""
    x = x.float()
    row_max = x.amax(dim=-1, keepdim=True)
    return x / row_max, row_max


class StableLayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gamma, beta, eps):
        z, row_max = _divided_by_row_max(x)
        y, mean, rstd = layernorm_op(z, gamma, beta, eps)
        ctx.save_for_backward(x, gamma, row_max, mean, rstd)
        ctx.inputs_needing_grad = held_for_first_order_only(x, gamma, beta)
        ctx.has_beta, ctx.eps, ctx.param_dtype = beta is not None, eps, _param_dtype(x, gamma, beta)
        return y.to(x.dtype)

    @staticmethod
    @first_order_only("layernorm")
    def backward(ctx, grad_y):
        x, gamma, row_max, mean, rstd = ctx.saved_tensors
        z = x.float() / row_max  # the forward's z, from its saved maximum
        grad_z, grad_gamma, grad_beta = layernorm_backward_op(
            grad_y, z, gamma, ctx.has_beta, mean, rstd, ctx.param_dtype)
        stat_shape = row_max.shape
        mean, rstd = mean.reshape(stat_shape), rstd.reshape(stat_shape)
        g = grad_y.float() * gamma.float() if gamma is not None else grad_y.float()
        sum_dz_z = ctx.eps * rstd * rstd * (g * (z - mean) * rstd).sum(dim=-1, keepdim=True)
        is_max = (x.float() == row_max).float()
        share = -sum_dz_z / row_max / is_max.sum(dim=-1, keepdim=True)
        grad_x = grad_z / row_max + is_max * share
        return grad_x.to(x.dtype), _present(grad_gamma), _present(grad_beta), None


# ------------------------------------------------------------------------------ public


def _check_inputs(op, x, gamma, beta, eps, names=("gamma", "beta"), any_float_params=False, dtypes=FLOAT_DTYPES,
                  plain=False, normalized_shape=None):
    """``names``: what the caller calls gamma and beta (the module's weight and bias).
    ``any_float_params``: the operator's check, which takes gamma and beta in any float
    dtype (the stable option hands it x divided by its row maxima, in float32).
    ``dtypes``: the kernels' (the operators' check), or the public functions', float64 too.
    ``plain``: what plain_inputs said of x, gamma and beta (one device, among what it checked).
    ``normalized_shape``: (N, as the caller was given it), where a caller fixes x's last
    dimension (layer_norm, LayerNorm), checked before gamma and beta, whose shapes follow N."""
    check_tensor(op, "x", x, dtypes=dtypes, plain=plain)
    n_cols = x.shape[-1]
    if normalized_shape is not None and n_cols != normalized_shape[0]:
        raise ValueError(_width_mismatch(op, x, *normalized_shape))
    for name, param in zip(names, (gamma, beta)):
        if param is None:
            continue
        check_tensor(op, name, param, dtypes=dtypes, plain=plain)
        if not plain:
            check_same_device(op, x=x, **{name: param})
        if param.dtype not in (FLOAT_DTYPES if any_float_params else (x.dtype, torch.float32)):
            raise TypeError(
                f"{op}: {name} has dtype {param.dtype} but x has {x.dtype}; {name} must have x's dtype, "
                "or be float32 (mixed precision, as torch.nn.LayerNorm accepts)"
            )
        if param.ndim != 1 or param.shape[0] != n_cols:  # not shape != (n_cols,): torch compares that in Python
            raise ValueError(
                f"{op}: {name} must have shape (N,) with N = x.shape[-1] = {n_cols}; "
                f"got {name} of shape {tuple(param.shape)} for x of shape {tuple(x.shape)}"
            )
    if gamma is not None and beta is not None and gamma.dtype != beta.dtype:
        raise TypeError(f"{op}: {names[0]} has dtype {gamma.dtype} but {names[1]} has {beta.dtype}; they must match")
    if n_cols == 0:
        raise ValueError(f"{op}: the last dimension N of x must be at least 1, got x of shape {tuple(x.shape)}")
    _check_eps(op, eps)
    if n_cols > INT32_LIMIT // 2:  # the backward's partial rows hold dgamma and dbeta side by side
        raise ValueError(f"{op}: N = {n_cols} is too large; at most {INT32_LIMIT // 2} is supported")
    check_index_range(op, M=x.numel() // n_cols)


EPS_MAX = torch.finfo(torch.float32).max  # eps is added to a float32 variance


def _width_mismatch(op, x, width, given):
    if op == "LayerNorm":
        return f"LayerNorm: expected x of shape (..., {width}), got {tuple(x.shape)}"
    return (f"{op}: normalized_shape must be the last dimension of x, ({x.shape[-1]},), as the kernels normalise "
            f"over the last dimension only; got {given!r} for x of shape {tuple(x.shape)}")


def _check_eps(op, eps):
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"{op}: eps must be a number, got {type(eps).__name__} {eps!r}")
    if not 0 <= eps <= EPS_MAX:  # NaN and inf too; exact for an int of any size
        raise ValueError(f"{op}: eps must be a non-negative number of at most {EPS_MAX:.3g} (it is added to a "
                         f"float32 variance), got {eps}")


def _check_flag(op, name, flag):
    if not isinstance(flag, bool):
        raise TypeError(f"{op}: {name} must be True or False, got {type(flag).__name__} {flag!r}")


def layernorm(x, gamma, beta=None, eps=1e-5, stable=False):
    """LayerNorm over the last dimension with Triton kernels, differentiable in x, gamma, beta.

    Statistics in float32 (biased variance, as torch); float64 inputs (on any device) are
    computed by the PyTorch reference instead, differentiable to any order. The result
    keeps x's dtype, also under autocast. :func:`layer_norm` takes
    ``F.layer_norm``'s arguments.

    Args:
        x (Tensor): float32, float16, bfloat16 or float64, any strides.
        gamma (Tensor or None): the scale, on x's device, of x's dtype or float32 (mixed
            precision: its gradient keeps its dtype); None for no scale.
        beta (Tensor or None): the shift, as gamma; None for no shift.
        eps (float): added to the variance.
        stable (bool): first divide each row by its maximum, as the seed did (a row whose
            maximum is 0 gives NaN).

    Shape:
        - x: (..., N)
        - gamma, beta: (N,)
        - Output: x's shape

    Returns:
        Tensor: the normalised rows, scaled and shifted, in x's dtype.

    Example::

        >>> x = torch.randn(4, 16)
        >>> y = layernorm(x, torch.ones(16), torch.zeros(16))
        >>> torch.allclose(y, torch.nn.functional.layer_norm(x, (16,)), atol=1e-5)
        True
    """
    return _layernorm("layernorm", ("gamma", "beta"), x, gamma, beta, eps, stable)


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """``torch.nn.functional.layer_norm`` with course_lib's kernels: :func:`layernorm` with
    torch's arguments, over the last dimension only.

    Args:
        x (Tensor): float32, float16, bfloat16 or float64, any strides.
        normalized_shape (int or tuple of one int): the last dimension of x, N; the kernels
            normalise over the last dimension only.
        weight (Tensor or None): the scale (torch's name for gamma), of x's dtype or float32.
        bias (Tensor or None): the shift (beta), as weight.
        eps (float): added to the variance.

    Shape:
        - x: (..., N)
        - weight, bias: (N,)
        - Output: x's shape

    Returns:
        Tensor: the normalised rows, scaled and shifted, in x's dtype.

    Example::

        >>> x = torch.randn(4, 16)
        >>> y = layer_norm(x, (16,), torch.ones(16), torch.zeros(16))
        >>> torch.allclose(y, torch.nn.functional.layer_norm(x, (16,)), atol=1e-5)
        True
    """
    op = "layer_norm"
    width = _normalized_shape(op, normalized_shape)[0]
    return _layernorm(op, ("weight", "bias"), x, weight, bias, eps, False, (width, normalized_shape))


def _normalized_shape(op, normalized_shape):
    """normalized_shape as a 1-tuple: an int or a sequence of one (the last dimension)."""
    is_count = isinstance(normalized_shape, numbers.Integral) and not isinstance(normalized_shape, bool)
    shape = (normalized_shape,) if is_count else normalized_shape
    if not isinstance(shape, (tuple, list, torch.Size)) or any(
            isinstance(n, bool) or not isinstance(n, numbers.Integral) for n in shape):
        raise TypeError(f"{op}: normalized_shape must be an int or a 1-tuple of one; got {normalized_shape!r}")
    if len(shape) != 1:
        raise ValueError(
            f"{op}: normalizes over the last dimension only, so normalized_shape must be "
            f"an int or a 1-tuple; got {normalized_shape!r}"
        )
    return (int(shape[0]),)


def _layernorm(op, names, x, gamma, beta, eps, stable, normalized_shape=None):
    """The public functions' one path; ``normalized_shape`` as _check_inputs takes it."""
    plain = plain_inputs(x, gamma, beta)
    if not plain:
        x, gamma, beta = autocast_as_float32_ops(x, gamma, beta)
    _check_inputs(op, x, gamma, beta, eps, names, dtypes=PUBLIC_DTYPES, plain=plain, normalized_shape=normalized_shape)
    _check_flag(op, "stable", stable)
    eps = float(eps)
    if not plain and runs_reference(x, gamma, beta):
        return by_reference(references.layernorm_by_torch, x, gamma, beta, eps, stable)
    if torch.compiler.is_compiling():
        # With stable, inductor differentiates the division itself: traced by it,
        # StableLayerNormFunction's backward gave wrong float32 gradients of x (torch 2.11).
        z = _divided_by_row_max(x)[0] if stable else x
        return layernorm_op(z, gamma, beta, eps)[0].to(x.dtype)
    if stable:
        function = StableLayerNormFunction if op == "layernorm" else first_order_only_as(StableLayerNormFunction, op)
        return function.apply(x, gamma, beta, eps)
    return LAYERNORM(x, gamma, beta, eps, error_name=op, input_names=("x", *names))


class LayerNorm(nn.Module):
    """A stand-in for ``torch.nn.LayerNorm`` over the last dimension, on course_lib's kernels.

    Same arguments, parameters (``weight``, ``bias``) and state dict as torch's, plus
    ``stable`` (the seed's division by the row maximum). In float64 (``dtype=`` or
    ``.double()``) it computes with the PyTorch reference, differentiable to any order.

    Args:
        normalized_shape (int or tuple of one int): the last dimension N of the input.
        eps (float): added to the variance.
        elementwise_affine (bool): learn ``weight`` (ones) and ``bias`` (zeros).
        bias (bool): learn ``bias`` too (with elementwise_affine).
        device, dtype: of the parameters (float32, float16, bfloat16 or float64).
        stable (bool): divide each row by its maximum first.

    Shape:
        - Input: (..., N)
        - Output: the input's shape and dtype

    Returns:
        LayerNorm: the module; call it on x.

    Example::

        >>> norm = LayerNorm(16)
        >>> norm(torch.randn(4, 16)).shape
        torch.Size([4, 16])
    """

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                 device=None, dtype=None, stable=False):
        super().__init__()
        op = "LayerNorm"
        shape = _normalized_shape(op, normalized_shape)
        if shape[0] < 1:
            raise ValueError(f"{op}: normalized_shape must be at least 1, got {shape[0]}")
        _check_eps(op, eps)
        for name, flag in (("stable", stable), ("elementwise_affine", elementwise_affine), ("bias", bias)):
            _check_flag(op, name, flag)
        if dtype is not None and dtype not in PUBLIC_DTYPES:
            raise TypeError(f"{op}: dtype must be {_names(PUBLIC_DTYPES)} (float64 computed by PyTorch), got {dtype}")
        self.normalized_shape = shape
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.stable = stable
        factory = {"device": device, "dtype": dtype}
        def parameter(wanted):
            return nn.Parameter(torch.empty(shape, **factory)) if wanted else None

        self.register_parameter("weight", parameter(elementwise_affine))
        self.register_parameter("bias", parameter(elementwise_affine and bias))
        self.reset_parameters()

    def reset_parameters(self):
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x):
        """Normalise ``x`` over its last dimension.

        x: (..., normalized_shape) float32, float16 or bfloat16, on the parameters' device,
        any strides. Returns a tensor of x's shape and dtype; gradients flow to x, ``weight``
        and ``bias``. Bad input raises naming what was wrong.
        """
        width = self.normalized_shape[0]
        return _layernorm("LayerNorm", ("weight", "bias"), x, self.weight, self.bias, self.eps, self.stable,
                          (width, width))

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
                f"stable={self.stable}")
