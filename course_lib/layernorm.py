"""LayerNorm over the last dimension: y = (z - mean(z)) * rstd * gamma + beta.

Chapter 3. ``z`` is the row ``x``, or with ``stable=True`` the row divided by its
maximum (the seed's option). Read top to bottom: the Triton kernels, the host
launchers that pick tiles and grids, the ``torch.autograd.Function``, the public
``layernorm`` and the ``LayerNorm`` module that stands in for ``torch.nn.LayerNorm``.

What training saves is one float32 mean and one rstd per row (and the row maximum when
``stable``), not whole tensors: the backward reloads ``x`` and recomputes
``xhat = (z - mean) * rstd``. The backward's ``dgamma`` and ``dbeta`` are column sums
over every row, reduced in two deterministic stages, without atomics: a persistent
grid whose programs each own a contiguous range of rows, write their dx and one
float32 partial row, then ``column_sum_kernel`` (from chapter 1) adding the partial
rows in a fixed order. Rows too wide for registers are split across programs: on a GPU
the programs holding one row run at once and exchange their parts of the row's two
sums through memory, so each row is read once (as chapter 4's split rows do); the
interpreter, which runs one program after another, and rows too wide to have all their
programs resident take two kernels instead: a first writes partial rows and each row's
sums over each column block, a second adds up a row's sums and writes its dx.

The gradient of ``stable=True``. With ``z = x / m`` and ``m = max(x)``, the chain rule
gives ``dx = dz / m``, plus, for the maximum itself, ``dL/dm = -sum_j dz_j z_j / m``
(shared equally between tied maxima, as autograd does for ``amax``). Substituting the
LayerNorm backward, ``sum_j dz_j z_j = eps * rstd**2 * sum_j (dy * gamma * xhat)_j``:
without ``eps`` LayerNorm ignores the scale of its input and that term would vanish.
The seed left out both the ``1 / m`` and this term. Like the seed, the row is divided
whatever its maximum: a row whose maximum is 0 becomes NaN, and a negative maximum
flips the row's sign, and with it the sign of ``xhat``.

Constant rows. The forward takes each row's mean relative to the row's first value:
the mean of ``z - z[0]``, plus ``z[0]``. A constant row, of any width and magnitude,
then has a mean of exactly its value and centres to exactly 0, so y is exactly beta;
an ulp left there would be multiplied by ``rstd = 1 / sqrt(eps)``, 316 for the default
eps (summed directly, 257 values of 1e6 + 0.5 have a float32 mean one ulp off, and y
came out +-1). Every division in the kernels is ``tl.div_rn``, rounded correctly as on
a CPU: on a GPU Triton compiles float32 ``/`` to an approximate division
(``div.full.f32``, up to 2 ulp off). So with ``stable=True`` ``z = x / m`` is exactly 1
wherever ``x`` is the maximum, and the same in the forward and the backward.
"""

import functools
import numbers
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl
from torch import nn

from .rows import as_rows, known_multiple_of, sum_partial_rows, width_hint
from .runtime import (ON_GPU, cdiv, kernel_operator, launch, max_shared_memory, multiprocessor_count, next_power_of_2,
                      slots_block)
from .validation import (
    INT32_LIMIT,
    check_index_range,
    check_same_device,
    check_tensor,
    first_order_only,
    on_device_of,
    wants_gradient,
)

# ---------------------------------------------------------------------------- kernels


@triton.jit
def _z(x, row_max, STABLE: tl.constexpr):
    """z = x, or x / max(x) rounded correctly: the same z in every kernel, and exactly 1 at the maximum."""
    return tl.div_rn(x, row_max[:, None]) if STABLE else x


@triton.jit
def _xhat(x, mean, rstd, row_max, mask, STABLE: tl.constexpr):
    """xhat = (z - mean) * rstd; 0 outside the mask. Stats are per row."""
    return tl.where(mask, (_z(x, row_max, STABLE) - mean[:, None]) * rstd[:, None], 0.0)


@triton.jit
def _first_values(x_ptr, rows64, row_mask, stride_x_row):
    """x[rows, 0] in float32: the shift the forward kernels take the mean relative to."""
    return tl.load(x_ptr + rows64 * stride_x_row, mask=row_mask, other=0.0).to(tl.float32)


@triton.jit
def layernorm_forward_kernel(
    x_ptr, gamma_ptr, beta_ptr, y_ptr, mean_ptr, rstd_ptr, row_max_ptr,
    n_rows, n_cols, eps,
    stride_x_row, stride_x_col, stride_gamma, stride_beta, stride_y_row,
    HAS_GAMMA: tl.constexpr, HAS_BETA: tl.constexpr, STABLE: tl.constexpr, SAVE_STATS: tl.constexpr,
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

    row_max = tl.max(tl.where(mask, x, float("-inf")), axis=1) if STABLE else None
    z = _z(x, row_max, STABLE)

    # Statistics of z, in two steps over registers: the mean first, then the variance
    # of z - mean, which cannot cancel the way E[z^2] - E[z]^2 does. The mean is taken
    # of z - shift, shift being the row's first value, so a constant row sums to exactly
    # 0 and centres to exactly 0 (module docstring).
    shift = _first_values(x_ptr, rows64, row_mask, stride_x_row)
    shift = tl.div_rn(shift, row_max) if STABLE else shift  # z's first value, as _z gives it
    n_values = n_cols * 1.0  # as a float, for tl.div_rn
    mean = shift + tl.div_rn(tl.sum(tl.where(mask, z - shift[:, None], 0.0), axis=1), n_values)
    centred = tl.where(mask, z - mean[:, None], 0.0)
    var = tl.div_rn(tl.sum(centred * centred, axis=1), n_values)
    rstd = tl.rsqrt(var + eps)

    y = centred * rstd[:, None]
    if HAS_GAMMA:
        y *= tl.load(gamma_ptr + cols * stride_gamma, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    if HAS_BETA:
        y += tl.load(beta_ptr + cols * stride_beta, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rows64[:, None] * stride_y_row + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
    if SAVE_STATS:
        tl.store(mean_ptr + rows, mean, mask=row_mask)
        tl.store(rstd_ptr + rows, rstd, mask=row_mask)
        if STABLE:
            tl.store(row_max_ptr + rows, row_max, mask=row_mask)


@triton.jit
def layernorm_forward_looped_kernel(
    x_ptr, gamma_ptr, beta_ptr, y_ptr, mean_ptr, rstd_ptr, row_max_ptr,
    n_rows, n_cols, eps,
    stride_x_row, stride_x_col, stride_gamma, stride_beta, stride_y_row,
    HAS_GAMMA: tl.constexpr, HAS_BETA: tl.constexpr, STABLE: tl.constexpr, SAVE_STATS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, NUM_STAGES: tl.constexpr, VEC: tl.constexpr,
):
    """Rows wider than a block: one pass over tiles for the statistics, one to normalise."""
    eps = tl.cast(eps, tl.float32)  # inductor passes a Python float as float64
    n_cols = known_multiple_of(n_cols, VEC)  # the same numbers, visibly multiples of VEC (width_hint)
    stride_x_row = known_multiple_of(stride_x_row, VEC)
    stride_y_row = known_multiple_of(stride_y_row, VEC)
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_mask = rows < n_rows
    rows64 = rows.to(tl.int64)
    x_row_ptrs = x_ptr + rows64[:, None] * stride_x_row

    # Pass 1. Each tile's own mean and sum of squared deviations, merged into the
    # running ones (Chan et al.): as safe from cancellation as the two-step version.
    # They are those of x - shift, the row's first value, so that a constant row has
    # a mean of exactly shift (module docstring).
    shift = _first_values(x_ptr, rows64, row_mask, stride_x_row)
    mean = tl.zeros((BLOCK_ROWS,), dtype=tl.float32)
    sum_sq_dev = tl.zeros((BLOCK_ROWS,), dtype=tl.float32)
    row_max = tl.full((BLOCK_ROWS,), float("-inf"), dtype=tl.float32)
    for col_start in tl.range(0, n_cols, BLOCK_COLS, num_stages=NUM_STAGES):
        cols = col_start + tl.arange(0, BLOCK_COLS)
        mask = row_mask[:, None] & (cols < n_cols)[None, :]
        # Lanes outside the row load the shift itself, so x - shift is 0 there with no
        # select (x's dtype holds the shift exactly: it is one of x's values).
        x = tl.load(x_row_ptrs + cols[None, :].to(tl.int64) * stride_x_col, mask=mask,
                    other=shift[:, None].to(x_ptr.dtype.element_ty)).to(tl.float32)
        if STABLE:
            row_max = tl.maximum(row_max, tl.max(tl.where(mask, x, float("-inf")), axis=1))
        x -= shift[:, None]
        seen = col_start * 1.0  # as a float
        tile_count = tl.minimum(n_cols - col_start, BLOCK_COLS) * 1.0
        tile_weight = tl.div_rn(tile_count, seen + tile_count)
        tile_mean = tl.div_rn(tl.sum(x, axis=1), tile_count)
        deviation = tl.where(mask, x - tile_mean[:, None], 0.0)
        delta = tile_mean - mean
        mean += delta * tile_weight
        sum_sq_dev += tl.sum(deviation * deviation, axis=1) + delta * delta * seen * tile_weight
    var = tl.div_rn(sum_sq_dev, n_cols * 1.0)
    mean += shift
    if STABLE:
        # Those of z = x / max, known only now. Dividing var twice: max**2 can overflow.
        mean = tl.div_rn(mean, row_max)
        var = tl.div_rn(tl.div_rn(var, row_max), row_max)
    rstd = tl.rsqrt(var + eps)

    # Pass 2 walks back: the tiles read last are the likeliest to still be in L2.
    n_tiles = tl.cdiv(n_cols, BLOCK_COLS)
    for tile in tl.range(0, n_tiles, num_stages=NUM_STAGES):
        cols = (n_tiles - 1 - tile) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
        col_mask = cols < n_cols
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(x_row_ptrs + cols[None, :].to(tl.int64) * stride_x_col, mask=mask, other=0.0).to(tl.float32)
        y = _xhat(x, mean, rstd, row_max, mask, STABLE)
        if HAS_GAMMA:
            y *= tl.load(gamma_ptr + cols * stride_gamma, mask=col_mask, other=0.0).to(tl.float32)[None, :]
        if HAS_BETA:
            y += tl.load(beta_ptr + cols * stride_beta, mask=col_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + rows64[:, None] * stride_y_row + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
    if SAVE_STATS:
        tl.store(mean_ptr + rows, mean, mask=row_mask)
        tl.store(rstd_ptr + rows, rstd, mask=row_mask)
        if STABLE:
            tl.store(row_max_ptr + rows, row_max, mask=row_mask)


@triton.jit
def _grad_x(weighted_grad, xhat, x, rstd, row_max, c1, c2, n_max, mask, n_cols, eps, STABLE: tl.constexpr):
    """dx from dL/dxhat = dy * gamma and its row means c1 = mean(dL/dxhat), c2 = mean(dL/dxhat * xhat)."""
    grad = (weighted_grad - c1[:, None] - xhat * c2[:, None]) * rstd[:, None]
    if STABLE:
        # Through z = x / m (module docstring): dz / m, and the n_max maxima share dL/dm.
        grad_max = tl.div_rn(-eps * rstd * rstd * c2 * n_cols, row_max)
        share = tl.div_rn(grad_max, tl.maximum(n_max, 1.0))
        is_max = mask & (x == row_max[:, None])
        grad = tl.div_rn(grad, row_max[:, None]) + tl.where(is_max, share[:, None], 0.0)
    return grad


@triton.jit
def _load_backward_rows(x_ptr, grad_y_ptr, mean_ptr, rstd_ptr, rows, mask, row_mask,
                        col_offsets_x, col_offsets_grad_y, stride_x_row, stride_grad_y_row):
    """A tile of rows for a backward kernel: x and dy in float32, and the rows' mean and rstd."""
    rows64 = rows.to(tl.int64)
    x = tl.load(x_ptr + rows64[:, None] * stride_x_row + col_offsets_x, mask=mask, other=0.0).to(tl.float32)
    grad_y = tl.load(
        grad_y_ptr + rows64[:, None] * stride_grad_y_row + col_offsets_grad_y, mask=mask, other=0.0
    ).to(tl.float32)
    mean = tl.load(mean_ptr + rows, mask=row_mask, other=0.0)
    rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
    return x, grad_y, mean, rstd


@triton.jit
def _store_partial_row(partial_row_ptr, cols, col_mask, n_cols, grad_gamma_acc, grad_beta_acc,
                       HAS_GAMMA: tl.constexpr, HAS_BETA: tl.constexpr):
    """A program's partial row: its column sums of dy * xhat (dgamma's), then of dy (dbeta's)."""
    if HAS_GAMMA:
        tl.store(partial_row_ptr + cols, tl.sum(grad_gamma_acc, axis=0), mask=col_mask)
        partial_row_ptr += n_cols
    if HAS_BETA:
        tl.store(partial_row_ptr + cols, tl.sum(grad_beta_acc, axis=0), mask=col_mask)


@triton.jit
def _column_block(block, n_cols, stride_x_col, stride_grad_y_col, BLOCK_COLS: tl.constexpr):
    """Column block ``block`` of the rows: its columns, their mask, and their offsets in x and in dy."""
    cols = block * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    col_offsets = cols[None, :].to(tl.int64)
    return cols, cols < n_cols, col_offsets * stride_x_col, col_offsets * stride_grad_y_col


@triton.jit
def layernorm_backward_kernel(
    x_ptr, gamma_ptr, grad_y_ptr, mean_ptr, rstd_ptr, row_max_ptr, grad_x_ptr, partial_ptr,
    n_rows, n_cols, rows_per_program, eps,
    stride_x_row, stride_x_col, stride_gamma, stride_grad_y_row, stride_grad_y_col,
    stride_grad_x_row, stride_partial_row,
    HAS_GAMMA: tl.constexpr, HAS_BETA: tl.constexpr, STABLE: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, NUM_STAGES: tl.constexpr, VEC: tl.constexpr,
):
    """A persistent program: dx for its range of rows, whole rows in registers.

    Along the way it adds dy * xhat and dy into float32 registers and, at the end,
    writes them as its partial row of dgamma (then dbeta): no atomics, and the partial
    rows are added in a fixed order afterwards.
    """
    eps = tl.cast(eps, tl.float32)  # inductor passes a Python float as float64
    n_cols = known_multiple_of(n_cols, VEC)  # the same numbers, visibly multiples of VEC (width_hint)
    stride_x_row = known_multiple_of(stride_x_row, VEC)
    stride_grad_y_row = known_multiple_of(stride_grad_y_row, VEC)
    stride_grad_x_row = known_multiple_of(stride_grad_x_row, VEC)
    program = tl.program_id(0)
    cols, col_mask, col_offsets_x, col_offsets_grad_y = _column_block(
        0, n_cols, stride_x_col, stride_grad_y_col, BLOCK_COLS)
    if HAS_GAMMA:
        gamma = tl.load(gamma_ptr + cols * stride_gamma, mask=col_mask, other=0.0).to(tl.float32)
    grad_gamma_acc = tl.zeros((BLOCK_ROWS, BLOCK_COLS), dtype=tl.float32)
    grad_beta_acc = tl.zeros((BLOCK_ROWS, BLOCK_COLS), dtype=tl.float32)

    first_row = program * rows_per_program
    last_row = tl.minimum(first_row + rows_per_program, n_rows)
    for row_start in tl.range(first_row, last_row, BLOCK_ROWS, num_stages=NUM_STAGES):
        rows = row_start + tl.arange(0, BLOCK_ROWS)
        row_mask = rows < last_row
        mask = row_mask[:, None] & col_mask[None, :]
        x, grad_y, mean, rstd = _load_backward_rows(
            x_ptr, grad_y_ptr, mean_ptr, rstd_ptr, rows, mask, row_mask,
            col_offsets_x, col_offsets_grad_y, stride_x_row, stride_grad_y_row,
        )
        row_max = tl.load(row_max_ptr + rows, mask=row_mask, other=1.0) if STABLE else None
        n_max = tl.sum((mask & (x == row_max[:, None])).to(tl.float32), axis=1) if STABLE else None

        xhat = _xhat(x, mean, rstd, row_max, mask, STABLE)
        weighted_grad = grad_y * gamma[None, :] if HAS_GAMMA else grad_y
        c1 = tl.div_rn(tl.sum(weighted_grad, axis=1), n_cols * 1.0)
        c2 = tl.div_rn(tl.sum(weighted_grad * xhat, axis=1), n_cols * 1.0)
        grad_x = _grad_x(weighted_grad, xhat, x, rstd, row_max, c1, c2, n_max, mask, n_cols, eps, STABLE)
        tl.store(
            grad_x_ptr + rows.to(tl.int64)[:, None] * stride_grad_x_row + cols[None, :],
            grad_x.to(grad_x_ptr.dtype.element_ty),
            mask=mask,
        )
        grad_gamma_acc += grad_y * xhat
        grad_beta_acc += grad_y

    _store_partial_row(partial_ptr + program.to(tl.int64) * stride_partial_row, cols, col_mask, n_cols,
                       grad_gamma_acc, grad_beta_acc, HAS_GAMMA, HAS_BETA)


@triton.jit
def layernorm_backward_partials_kernel(
    x_ptr, gamma_ptr, grad_y_ptr, mean_ptr, rstd_ptr, row_max_ptr, row_sums_ptr, partial_ptr,
    n_rows, n_cols, rows_per_program,
    stride_x_row, stride_x_col, stride_gamma, stride_grad_y_row, stride_grad_y_col,
    stride_sums_plane, stride_partial_row,
    HAS_GAMMA: tl.constexpr, HAS_BETA: tl.constexpr, STABLE: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, NUM_STAGES: tl.constexpr, VEC: tl.constexpr,
):
    """Rows wider than a block, stage 1: program (c, g) owns column block c and the rows of group g.

    A row's dx needs sums over the whole row, which one program no longer holds; so
    this kernel only writes, for each of its rows, the sums over its columns of
    dy * gamma and dy * gamma * xhat (and the count of maxima), into row_sums[q, row, c].
    Its partial dgamma and dbeta stay in registers down the rows, as in chapter 1.
    """
    n_cols = known_multiple_of(n_cols, VEC)  # the same numbers, visibly multiples of VEC (width_hint)
    stride_x_row = known_multiple_of(stride_x_row, VEC)
    stride_grad_y_row = known_multiple_of(stride_grad_y_row, VEC)
    col_block = tl.program_id(0)
    row_group = tl.program_id(1)
    n_col_blocks = tl.num_programs(0)
    cols, col_mask, col_offsets_x, col_offsets_grad_y = _column_block(
        col_block, n_cols, stride_x_col, stride_grad_y_col, BLOCK_COLS)
    if HAS_GAMMA:
        gamma = tl.load(gamma_ptr + cols * stride_gamma, mask=col_mask, other=0.0).to(tl.float32)
    grad_gamma_acc = tl.zeros((BLOCK_ROWS, BLOCK_COLS), dtype=tl.float32)
    grad_beta_acc = tl.zeros((BLOCK_ROWS, BLOCK_COLS), dtype=tl.float32)

    first_row = row_group * rows_per_program
    last_row = tl.minimum(first_row + rows_per_program, n_rows)
    for row_start in tl.range(first_row, last_row, BLOCK_ROWS, num_stages=NUM_STAGES):
        rows = row_start + tl.arange(0, BLOCK_ROWS)
        row_mask = rows < last_row
        mask = row_mask[:, None] & col_mask[None, :]
        x, grad_y, mean, rstd = _load_backward_rows(
            x_ptr, grad_y_ptr, mean_ptr, rstd_ptr, rows, mask, row_mask,
            col_offsets_x, col_offsets_grad_y, stride_x_row, stride_grad_y_row,
        )
        row_max = tl.load(row_max_ptr + rows, mask=row_mask, other=1.0) if STABLE else None

        xhat = _xhat(x, mean, rstd, row_max, mask, STABLE)
        weighted_grad = grad_y * gamma[None, :] if HAS_GAMMA else grad_y
        sums_ptrs = row_sums_ptr + rows.to(tl.int64) * n_col_blocks + col_block
        tl.store(sums_ptrs, tl.sum(weighted_grad, axis=1), mask=row_mask)
        tl.store(sums_ptrs + stride_sums_plane, tl.sum(weighted_grad * xhat, axis=1), mask=row_mask)
        if STABLE:
            n_max = tl.sum((mask & (x == row_max[:, None])).to(tl.float32), axis=1)
            tl.store(sums_ptrs + 2 * stride_sums_plane, n_max, mask=row_mask)
        grad_gamma_acc += grad_y * xhat
        grad_beta_acc += grad_y

    _store_partial_row(partial_ptr + row_group.to(tl.int64) * stride_partial_row, cols, col_mask, n_cols,
                       grad_gamma_acc, grad_beta_acc, HAS_GAMMA, HAS_BETA)


@triton.jit
def layernorm_backward_dx_kernel(
    x_ptr, gamma_ptr, grad_y_ptr, mean_ptr, rstd_ptr, row_max_ptr, row_sums_ptr, grad_x_ptr,
    n_rows, n_cols, n_col_blocks, eps,
    stride_x_row, stride_x_col, stride_gamma, stride_grad_y_row, stride_grad_y_col,
    stride_grad_x_row, stride_sums_plane,
    HAS_GAMMA: tl.constexpr, STABLE: tl.constexpr, VEC: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, BLOCK_SUMS: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    """Rows wider than a block, stage 2: add up each row's sums in a fixed order, then walk the row writing dx."""
    eps = tl.cast(eps, tl.float32)  # inductor passes a Python float as float64
    n_cols = known_multiple_of(n_cols, VEC)  # the same numbers, visibly multiples of VEC (width_hint)
    stride_x_row = known_multiple_of(stride_x_row, VEC)
    stride_grad_y_row = known_multiple_of(stride_grad_y_row, VEC)
    stride_grad_x_row = known_multiple_of(stride_grad_x_row, VEC)
    # Rows in reverse: stage 1 read the last rows last, so they are the likeliest still in L2.
    rows = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_mask = rows < n_rows
    rows64 = rows.to(tl.int64)

    sum_weighted_grad = tl.zeros((BLOCK_ROWS, BLOCK_SUMS), dtype=tl.float32)
    sum_weighted_grad_xhat = tl.zeros((BLOCK_ROWS, BLOCK_SUMS), dtype=tl.float32)
    count_max = tl.zeros((BLOCK_ROWS, BLOCK_SUMS), dtype=tl.float32)
    for block_start in range(0, n_col_blocks, BLOCK_SUMS):
        blocks = block_start + tl.arange(0, BLOCK_SUMS)
        sums_mask = row_mask[:, None] & (blocks < n_col_blocks)[None, :]
        sums_ptrs = row_sums_ptr + rows64[:, None] * n_col_blocks + blocks[None, :]
        sum_weighted_grad += tl.load(sums_ptrs, mask=sums_mask, other=0.0)
        sum_weighted_grad_xhat += tl.load(sums_ptrs + stride_sums_plane, mask=sums_mask, other=0.0)
        if STABLE:
            count_max += tl.load(sums_ptrs + 2 * stride_sums_plane, mask=sums_mask, other=0.0)
    c1 = tl.div_rn(tl.sum(sum_weighted_grad, axis=1), n_cols * 1.0)
    c2 = tl.div_rn(tl.sum(sum_weighted_grad_xhat, axis=1), n_cols * 1.0)
    n_max = tl.sum(count_max, axis=1) if STABLE else None

    mean = tl.load(mean_ptr + rows, mask=row_mask, other=0.0)
    rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
    row_max = tl.load(row_max_ptr + rows, mask=row_mask, other=1.0) if STABLE else None
    x_row_ptrs = x_ptr + rows64[:, None] * stride_x_row
    grad_y_row_ptrs = grad_y_ptr + rows64[:, None] * stride_grad_y_row
    for col_start in tl.range(0, n_cols, BLOCK_COLS, num_stages=NUM_STAGES):
        cols = col_start + tl.arange(0, BLOCK_COLS)
        col_mask = cols < n_cols
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(x_row_ptrs + cols[None, :].to(tl.int64) * stride_x_col, mask=mask, other=0.0).to(tl.float32)
        grad_y = tl.load(
            grad_y_row_ptrs + cols[None, :].to(tl.int64) * stride_grad_y_col, mask=mask, other=0.0
        ).to(tl.float32)
        if HAS_GAMMA:
            gamma = tl.load(gamma_ptr + cols * stride_gamma, mask=col_mask, other=0.0).to(tl.float32)
        weighted_grad = grad_y * gamma[None, :] if HAS_GAMMA else grad_y
        xhat = _xhat(x, mean, rstd, row_max, mask, STABLE)
        grad_x = _grad_x(weighted_grad, xhat, x, rstd, row_max, c1, c2, n_max, mask, n_cols, eps, STABLE)
        tl.store(
            grad_x_ptr + rows64[:, None] * stride_grad_x_row + cols[None, :],
            grad_x.to(grad_x_ptr.dtype.element_ty),
            mask=mask,
        )


PUBLISHED = tl.constexpr(1 << 32)  # the high half of a slot's word: this tile's part is there


@triton.jit
def _publish(slot_ptr, part):
    """Write a tile's float32 ``part`` of a row sum into its slot, flagged as published, in
    one 64-bit word: a reader sees both or neither. Relaxed, because the word is all a
    reader needs; the default (acq_rel) would also make the program wait until its
    earlier stores, the previous row's dx, had reached memory."""
    tl.atomic_xchg(slot_ptr, part.to(tl.uint32, bitcast=True).to(tl.int64) | PUBLISHED, sem="relaxed")


@triton.jit
def _row_vector(value):
    """A row's scalar as a vector of one, to broadcast over a tile of one row."""
    return tl.zeros((1,), tl.float32) + value


@triton.jit
def _add_published(published_a, sum_a, sum_g_xhat_a, n_max_a, published_b, sum_b, sum_g_xhat_b, n_max_b):
    return tl.minimum(published_a, published_b), sum_a + sum_b, sum_g_xhat_a + sum_g_xhat_b, n_max_a + n_max_b


@triton.jit
def _wait_for_row_sums(row_slots_ptr, n_tiles, N_SUMS: tl.constexpr, TILES_BLOCK: tl.constexpr):
    """Spin until every tile of the row has published its N_SUMS parts; return the sums
    (Σg, Σg·xhat, the count of maxima or 0), each added up over the tiles in a fixed
    order: the same totals in every program, on every run.

    Each pass reads every slot and gets, from one reduction, both whether all are
    published and the sums. Two reductions, one for the check and one for the sums, are
    not safe: where several threads hold copies of a word, loaded at different moments,
    the check may see one copy and the sum add up another, still empty, and dx would
    change from run to run. TILES_BLOCK, from runtime.slots_block, keeps copies within
    a warp.
    """
    word = tl.arange(0, 4 * TILES_BLOCK)
    which, tiles = word // TILES_BLOCK, word % TILES_BLOCK  # sum, tile
    present = (which < N_SUMS) & (tiles < n_tiles)
    slot_ptrs = row_slots_ptr + which * n_tiles + tiles
    published = tl.full((), 0, tl.int64)
    sum_g = tl.full((), 0.0, tl.float32)
    sum_g_xhat = tl.full((), 0.0, tl.float32)
    n_max = tl.full((), 0.0, tl.float32)
    while published == 0:
        words = tl.load(slot_ptrs, mask=present, other=PUBLISHED, volatile=True)
        parts = words.to(tl.uint32).to(tl.float32, bitcast=True)  # the low 32 bits
        published, sum_g, sum_g_xhat, n_max = tl.reduce(
            (words >> 32, tl.where(which == 0, parts, 0.0), tl.where(which == 1, parts, 0.0),
             tl.where(which == 2, parts, 0.0)),
            0, _add_published,
        )
    return _row_vector(sum_g), _row_vector(sum_g_xhat), _row_vector(n_max)


@triton.jit
def _load_split_row(x_ptr, grad_y_ptr, mean_ptr, rstd_ptr, row_max_ptr, row, n_rows, col_mask,
                    col_offsets_x, col_offsets_grad_y, stride_x_row, stride_grad_y_row, STABLE: tl.constexpr):
    """A program's tile of one row (as a tile of one row), its statistics; nothing past the last row."""
    rows = row + tl.arange(0, 1)
    row_mask = rows < n_rows
    mask = row_mask[:, None] & col_mask[None, :]
    x, grad_y, mean, rstd = _load_backward_rows(
        x_ptr, grad_y_ptr, mean_ptr, rstd_ptr, rows, mask, row_mask,
        col_offsets_x, col_offsets_grad_y, stride_x_row, stride_grad_y_row,
    )
    if STABLE:
        row_max = tl.load(row_max_ptr + rows, mask=row_mask, other=1.0)
    else:
        row_max = tl.full((1,), 1.0, tl.float32)  # unused, but a jitted function cannot return None
    return x, grad_y, mean, rstd, row_max


@triton.jit
def layernorm_backward_split_rows_kernel(
    x_ptr, gamma_ptr, grad_y_ptr, mean_ptr, rstd_ptr, row_max_ptr, grad_x_ptr, partial_ptr, slots_ptr,
    n_rows, n_cols, eps,
    stride_x_row, stride_x_col, stride_gamma, stride_grad_y_row, stride_grad_y_col,
    stride_grad_x_row, stride_partial_row,
    HAS_GAMMA: tl.constexpr, HAS_BETA: tl.constexpr, STABLE: tl.constexpr,
    BLOCK_COLS: tl.constexpr, TILES_BLOCK: tl.constexpr, PREFETCH: tl.constexpr, VEC: tl.constexpr,
):
    """Rows wider than a block, read once: program (g, c) holds column block c of rows
    g, g + num_programs(0), ... one row at a time, with its partial dgamma and dbeta in
    registers down the rows, as the persistent kernel does.

    A row's dx needs two sums over the whole row. Each program publishes its block's
    parts into the row's slots (rows, N_SUMS, tiles), waits until every block of the row
    has, and adds them up: all programs of the row must be resident at once (the
    launcher sees to it). With PREFETCH the next row's tile is loaded before the wait,
    so the load runs during it; that takes registers for a second tile.
    """
    eps = tl.cast(eps, tl.float32)  # inductor passes a Python float as float64
    n_cols = known_multiple_of(n_cols, VEC)  # the same numbers, visibly multiples of VEC (width_hint)
    stride_x_row = known_multiple_of(stride_x_row, VEC)
    stride_grad_y_row = known_multiple_of(stride_grad_y_row, VEC)
    stride_grad_x_row = known_multiple_of(stride_grad_x_row, VEC)
    N_SUMS: tl.constexpr = 3 if STABLE else 2  # sum of g, of g * xhat, and the count of maxima
    group = tl.program_id(0)
    tile = tl.program_id(1)
    n_groups = tl.num_programs(0)
    n_tiles = tl.num_programs(1)
    cols, col_mask, col_offsets_x, col_offsets_grad_y = _column_block(
        tile, n_cols, stride_x_col, stride_grad_y_col, BLOCK_COLS)
    if HAS_GAMMA:
        gamma = tl.load(gamma_ptr + cols * stride_gamma, mask=col_mask, other=0.0).to(tl.float32)
    grad_gamma_acc = tl.zeros((1, BLOCK_COLS), dtype=tl.float32)
    grad_beta_acc = tl.zeros((1, BLOCK_COLS), dtype=tl.float32)

    x, grad_y, mean, rstd, row_max = _load_split_row(
        x_ptr, grad_y_ptr, mean_ptr, rstd_ptr, row_max_ptr, group, n_rows, col_mask,
        col_offsets_x, col_offsets_grad_y, stride_x_row, stride_grad_y_row, STABLE)
    for row in range(group, n_rows, n_groups):
        if PREFETCH:
            next_row = _load_split_row(
                x_ptr, grad_y_ptr, mean_ptr, rstd_ptr, row_max_ptr, row + n_groups, n_rows, col_mask,
                col_offsets_x, col_offsets_grad_y, stride_x_row, stride_grad_y_row, STABLE)
        mask = col_mask[None, :]
        xhat = _xhat(x, mean, rstd, row_max, mask, STABLE)
        weighted_grad = grad_y * gamma[None, :] if HAS_GAMMA else grad_y
        row_slots = slots_ptr + tl.cast(row, tl.int64) * N_SUMS * n_tiles
        _publish(row_slots + tile, tl.sum(weighted_grad))
        _publish(row_slots + n_tiles + tile, tl.sum(weighted_grad * xhat))
        if STABLE:
            _publish(row_slots + 2 * n_tiles + tile, tl.sum((mask & (x == row_max[:, None])).to(tl.float32)))
        sum_g, sum_g_xhat, n_max = _wait_for_row_sums(row_slots, n_tiles, N_SUMS, TILES_BLOCK)
        c1 = tl.div_rn(sum_g, n_cols * 1.0)
        c2 = tl.div_rn(sum_g_xhat, n_cols * 1.0)
        grad_x = _grad_x(weighted_grad, xhat, x, rstd, row_max, c1, c2, n_max, mask, n_cols, eps, STABLE)
        tl.store(grad_x_ptr + tl.cast(row, tl.int64) * stride_grad_x_row + cols[None, :],
                 grad_x.to(grad_x_ptr.dtype.element_ty), mask=mask)
        grad_gamma_acc += grad_y * xhat
        grad_beta_acc += grad_y
        if PREFETCH:
            x, grad_y, mean, rstd, row_max = next_row
        else:
            x, grad_y, mean, rstd, row_max = _load_split_row(
                x_ptr, grad_y_ptr, mean_ptr, rstd_ptr, row_max_ptr, row + n_groups, n_rows, col_mask,
                col_offsets_x, col_offsets_grad_y, stride_x_row, stride_grad_y_row, STABLE)

    _store_partial_row(partial_ptr + group.to(tl.int64) * stride_partial_row, cols, col_mask, n_cols,
                       grad_gamma_acc, grad_beta_acc, HAS_GAMMA, HAS_BETA)


# -------------------------------------------------------------------------- launchers


class Tiles(NamedTuple):
    """A program's tile: BLOCK_ROWS rows of BLOCK_COLS columns, its warps, and how many
    iterations of its loop are in flight (tl.range's software pipelining: the next
    tiles load into shared memory while this one is computed; 1 is none)."""

    block_rows: int
    block_cols: int
    num_warps: int
    num_stages: int = 1


class BackwardConfig(NamedTuple):
    """How the backward is cut up.

    ``tiles.block_cols >= n_cols``: one persistent kernel with whole rows in registers,
    ``programs_per_sm`` programs a multiprocessor. Otherwise, where ``split_block`` is
    set and the split can run (_can_split_rows), the split-row kernel with
    ``split_block`` columns a program; else two stages: the partial sums kernel on
    ``tiles`` (about ``programs_per_sm`` programs a multiprocessor), then the dx kernel
    walking rows on ``dx_tiles``.
    """

    tiles: Tiles
    programs_per_sm: int
    dx_tiles: Tiles | None = None
    split_block: int | None = None


class RowStats(NamedTuple):
    """What the forward saves for the backward: float32, one value a row."""

    mean: torch.Tensor
    rstd: torch.Tensor
    row_max: torch.Tensor | None  # only with stable=True


# Widest rows held whole in registers (elements); wider rows take the looped forward
# and the two-stage backward. The backward holds x, dy and two float32 partial sums a
# column, the forward only x, so its rows can be four times as wide.
FORWARD_MAX_BLOCK = 32768
BACKWARD_MAX_BLOCK = 8192
WIDE_ROW_TILE = 8192  # columns a step when the dx kernel walks a wide row
# The split-row backward: columns a program holds, on SPLIT_ROW_WARPS warps. Four warps
# of at most 255 registers a thread take half of a multiprocessor's 65536 registers (on
# every GPU of compute capability 8.0 or newer), and the kernel little shared memory,
# so SPLIT_PROGRAMS_PER_SM programs always fit on one together.
SPLIT_ROW_BLOCK = 4096
SPLIT_ROW_WARPS = 4
SPLIT_PROGRAMS_PER_SM = 2
# Bytes of x a thread holds, from which the tiles' warps follow (see forward_tiles).
BYTES_A_THREAD = 64
MAX_WARPS = 16
FORWARD_MAX_WARPS = 32  # 1024 threads, the most a program may have: whole rows of 32768 float32
PIPELINE_STAGES = 3  # the whole-row backward's loop over rows, where shared memory allows
# Shared memory the pipelined backward leaves to the compiler (reductions' scratch).
SHARED_MEMORY_RESERVE = 16 * 1024
# The backward's tiles count narrower rows as this wide (backward_config's docstring).
NARROW_ROW_WIDTH = 16


def _warps_for_tile(tile_bytes, max_warps=MAX_WARPS):
    """BYTES_A_THREAD bytes of the tile a thread, 4 to max_warps warps."""
    return max(4, min(max_warps, tile_bytes // (32 * BYTES_A_THREAD)))


@functools.cache  # called on every launch: keep the host path short
def forward_tiles(n_cols, element_size):
    """Tiles for the forward: the looped kernel runs when block_cols < n_cols.

    The choices of benchmarks/tune_layernorm.py's sweep (1024 to 131072 columns,
    float32 and bfloat16), where this comes within a few percent of the best tile:

    * warps: 64 bytes of x a thread (16 float32 or 32 bfloat16 values), 4 to
      FORWARD_MAX_WARPS warps: more warps than that only add reductions across them.
    * narrow rows share a program, up to 4 KiB of x.
    * whole rows up to 32768 columns, on up to 32 warps: better than looping, which
      reads each row twice.
    * rows wider than FORWARD_MAX_BLOCK loop over the largest tile of 16 warps, 64
      bytes a thread (32 KiB: 8192 float32 or 16384 bfloat16 columns), without
      pipelining.
    """
    block_cols = next_power_of_2(n_cols)
    if block_cols > FORWARD_MAX_BLOCK:
        return Tiles(1, MAX_WARPS * 32 * BYTES_A_THREAD // element_size, MAX_WARPS)
    block_rows = max(1, 4096 // (block_cols * element_size))
    return Tiles(block_rows, block_cols, _warps_for_tile(block_rows * block_cols * element_size, FORWARD_MAX_WARPS))


def _counted_width(block_cols):
    """The width the backward's tiles count a row as: at least NARROW_ROW_WIDTH."""
    return max(block_cols, NARROW_ROW_WIDTH)


@functools.cache  # called on every launch: keep the host path short
def backward_config(n_cols, element_size, shared_memory=None):
    """BackwardConfig for rows of ``n_cols`` elements of ``element_size`` bytes.

    ``shared_memory``: the bytes a program may use; None for this GPU's
    (runtime.max_shared_memory). The choices of benchmarks/tune_layernorm.py's sweep:

    * whole rows: tiles of up to 4096 values, warps as in the forward; the loop over
      rows pipelined PIPELINE_STAGES deep, with programs_per_sm such that each
      multiprocessor loads 16 KiB of x (and as much of dy) a stage.
    * pipelining keeps two more tiles of x and of dy in shared memory: 64 KiB for
      16 KiB tiles, which every GPU Triton runs on has (L4 and RTX GPUs give a
      program 99 KiB). The 32 KiB tiles of float32 rows of 8192 need 128 KiB: they
      are pipelined where the GPU has it (A100, H100, H200) and run unpipelined
      elsewhere. The rows' float32 mean, rstd and maximum are pipelined too, 12 bytes a
      row: rows count as at least 16 columns wide, or 4096 rows of one column would
      need 160 KiB.
    * wide rows, split across programs that exchange the row's sums (on a GPU): blocks
      of SPLIT_ROW_BLOCK columns on 4 warps, SPLIT_PROGRAMS_PER_SM a multiprocessor,
      each row read once; in 2-byte dtypes the next row's tile loads during the wait
      (float32 has no registers to spare for it: at 4096 columns it spills).
      Publishing relaxed (_publish) rather than acq_rel matters here.
    * otherwise (the interpreter, or rows too wide to have all their programs
      resident), two stages: chapter 1's partial-sum tiles of 4 x 512, 4 programs a
      multiprocessor, then the dx kernel walking WIDE_ROW_TILE columns a step on 16
      warps.
    """
    block_cols = next_power_of_2(n_cols)
    if block_cols > BACKWARD_MAX_BLOCK:
        return BackwardConfig(Tiles(4, 512, 4), 4, Tiles(1, WIDE_ROW_TILE, MAX_WARPS), SPLIT_ROW_BLOCK)
    row_width = _counted_width(block_cols)
    block_rows = max(1, 4096 // row_width)
    tile_bytes = block_rows * row_width * element_size
    if shared_memory is None:
        shared_memory = max_shared_memory()
    tiles = Tiles(block_rows, block_cols, _warps_for_tile(tile_bytes), PIPELINE_STAGES)
    if pipeline_shared_bytes(tiles, element_size) + SHARED_MEMORY_RESERVE > shared_memory:
        tiles = tiles._replace(num_stages=1)
    return BackwardConfig(tiles, programs_per_sm=max(1, 16384 // tile_bytes))


def pipeline_shared_bytes(tiles, element_size):
    """Shared memory of the backward's pipeline on ``tiles``: num_stages - 1 more tiles of
    x and dy, and of the row stats (_counted_width)."""
    return (tiles.num_stages - 1) * tiles.block_rows * (2 * _counted_width(tiles.block_cols) * element_size + 3 * 4)


def _stride(tensor):
    return tensor.stride(0) if tensor is not None else 0


def layernorm_forward(x, gamma, beta, eps, stable, *, save_stats, tiles=None):
    """Launch a forward kernel; return (y, RowStats or None). ``tiles`` overrides forward_tiles."""
    x2d = as_rows(x)
    n_rows, n_cols = x2d.shape
    y = torch.empty((n_rows, n_cols), device=x.device, dtype=x.dtype)
    stats = None
    if save_stats:
        def per_row():
            return torch.empty(n_rows, device=x.device, dtype=torch.float32)
        stats = RowStats(per_row(), per_row(), per_row() if stable else None)
    if n_rows == 0:
        return y.reshape(x.shape), stats
    # int(): traced with dynamic shapes, the width is a SymInt, which the cache cannot hash
    block_rows, block_cols, num_warps, num_stages = tiles or forward_tiles(int(n_cols), x.element_size())
    if block_cols >= n_cols:
        kernel, loop_options = layernorm_forward_kernel, {}
    else:
        kernel, loop_options = layernorm_forward_looped_kernel, {"NUM_STAGES": num_stages}
    mean, rstd, row_max = stats or (None, None, None)
    with on_device_of(x):
        launch(kernel, (cdiv(n_rows, block_rows),),
            x2d, gamma, beta, y, mean, rstd, row_max,
            n_rows, n_cols, eps,
            x2d.stride(0), x2d.stride(1), _stride(gamma), _stride(beta), y.stride(0),
            HAS_GAMMA=gamma is not None, HAS_BETA=beta is not None, STABLE=stable, SAVE_STATS=save_stats,
            BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols, VEC=width_hint(x2d, y), num_warps=num_warps,
            **loop_options,
        )
    return y.reshape(x.shape), stats


def _partial_rows(n_rows, block_rows, groups_wanted, partial_width, device):
    """(rows_per_group, partial): row groups of whole row tiles, and one float32 partial row a group.

    No more partial elements than sum_partial_rows's 32-bit offsets reach.
    """
    groups_wanted = max(1, min(groups_wanted, INT32_LIMIT // max(1, partial_width)))
    rows_per_group = block_rows * cdiv(cdiv(n_rows, groups_wanted), block_rows)
    partial = torch.empty((cdiv(n_rows, rows_per_group), partial_width), device=device, dtype=torch.float32)
    return rows_per_group, partial


def _backward_whole_rows(x2d, gamma, has_beta, grad_y, grad_x, stats, eps, stable, config, partial_width, vec):
    """The persistent kernel: dx, and the partial rows of dgamma and dbeta it returns."""
    n_rows, n_cols = x2d.shape
    block_rows, block_cols, num_warps, num_stages = config.tiles
    rows_per_group, partial = _partial_rows(
        n_rows, block_rows, config.programs_per_sm * multiprocessor_count(), partial_width, x2d.device
    )
    launch(layernorm_backward_kernel, (partial.shape[0],),
        x2d, gamma, grad_y, stats.mean, stats.rstd, stats.row_max, grad_x, partial,
        n_rows, n_cols, rows_per_group, eps,
        x2d.stride(0), x2d.stride(1), _stride(gamma), grad_y.stride(0), grad_y.stride(1),
        grad_x.stride(0), partial.stride(0),
        HAS_GAMMA=gamma is not None, HAS_BETA=has_beta, STABLE=stable,
        BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols, NUM_STAGES=num_stages, VEC=vec, num_warps=num_warps,
    )
    return partial


def _backward_two_stages(x2d, gamma, has_beta, grad_y, grad_x, stats, eps, stable, config, partial_width, vec):
    """Rows wider than a block: the partial sums kernel, then the dx kernel."""
    n_rows, n_cols = x2d.shape
    block_rows, block_cols, num_warps, num_stages = config.tiles
    col_blocks = cdiv(n_cols, block_cols)
    rows_per_group, partial = _partial_rows(
        n_rows, block_rows, config.programs_per_sm * multiprocessor_count() // col_blocks, partial_width, x2d.device
    )
    n_sums = 3 if stable else 2  # sums of dy * gamma and dy * gamma * xhat, count of maxima
    row_sums = torch.empty((n_sums, n_rows, col_blocks), device=x2d.device, dtype=torch.float32)
    launch(layernorm_backward_partials_kernel, (col_blocks, partial.shape[0]),
        x2d, gamma, grad_y, stats.mean, stats.rstd, stats.row_max, row_sums, partial,
        n_rows, n_cols, rows_per_group,
        x2d.stride(0), x2d.stride(1), _stride(gamma), grad_y.stride(0), grad_y.stride(1),
        row_sums.stride(0), partial.stride(0),
        HAS_GAMMA=gamma is not None, HAS_BETA=has_beta, STABLE=stable,
        BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols, NUM_STAGES=num_stages, VEC=vec, num_warps=num_warps,
    )
    dx_rows, dx_cols, dx_warps, dx_stages = config.dx_tiles
    launch(layernorm_backward_dx_kernel, (cdiv(n_rows, dx_rows),),
        x2d, gamma, grad_y, stats.mean, stats.rstd, stats.row_max, row_sums, grad_x,
        n_rows, n_cols, col_blocks, eps,
        x2d.stride(0), x2d.stride(1), _stride(gamma), grad_y.stride(0), grad_y.stride(1),
        grad_x.stride(0), row_sums.stride(0),
        HAS_GAMMA=gamma is not None, STABLE=stable, VEC=vec,
        BLOCK_ROWS=dx_rows, BLOCK_COLS=dx_cols, BLOCK_SUMS=min(next_power_of_2(col_blocks), 256),
        NUM_STAGES=dx_stages, num_warps=dx_warps,
    )
    return partial


def _can_split_rows(n_cols, split_block):
    """Whether the split-row kernel can run: the programs of a row wait on each other, so
    all of them must be resident at once. On a GPU at most SPLIT_PROGRAMS_PER_SM a
    multiprocessor always are (SPLIT_ROW_WARPS); the interpreter runs one program after
    another, so there only a row of one block can be split."""
    n_tiles = cdiv(n_cols, split_block)
    return n_tiles <= SPLIT_PROGRAMS_PER_SM * multiprocessor_count() if ON_GPU else n_tiles == 1


def _backward_split_rows(x2d, gamma, has_beta, grad_y, grad_x, stats, eps, stable, block_cols, partial_width, vec):
    """The split-row kernel: dx, and the partial rows of dgamma and dbeta it returns."""
    n_rows, n_cols = x2d.shape
    n_tiles = cdiv(n_cols, block_cols)
    n_groups = min(n_rows, max(1, SPLIT_PROGRAMS_PER_SM * multiprocessor_count() // n_tiles))
    # One 64-bit word per row, sum and tile; zero means "not published yet".
    slots = torch.zeros((n_rows, 3 if stable else 2, n_tiles), device=x2d.device, dtype=torch.int64)
    partial = torch.empty((n_groups, partial_width), device=x2d.device, dtype=torch.float32)
    launch(layernorm_backward_split_rows_kernel, (n_groups, n_tiles),
        x2d, gamma, grad_y, stats.mean, stats.rstd, stats.row_max, grad_x, partial, slots,
        n_rows, n_cols, eps,
        x2d.stride(0), x2d.stride(1), _stride(gamma), grad_y.stride(0), grad_y.stride(1),
        grad_x.stride(0), partial.stride(0),
        HAS_GAMMA=gamma is not None, HAS_BETA=has_beta, STABLE=stable,
        BLOCK_COLS=block_cols, TILES_BLOCK=slots_block(n_tiles, SPLIT_ROW_WARPS, words_a_tile=4), PREFETCH=x2d.element_size() < 4,
        VEC=vec, num_warps=SPLIT_ROW_WARPS,
    )
    return partial


def layernorm_backward(grad_y, x, gamma, has_beta, stats, eps, stable, *, param_dtype=None, config=None):
    """Launch the backward; return (grad_x, grad_gamma or None, grad_beta or None).

    ``param_dtype``: the dtype of gamma and beta, and of their gradients (x's if None).
    ``config`` overrides backward_config (a BackwardConfig).
    """
    x2d = as_rows(x)
    n_rows, n_cols = x2d.shape
    grad_y = grad_y.reshape(n_rows, n_cols)
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
        elif config.split_block and _can_split_rows(n_cols, config.split_block):
            backward, plan = _backward_split_rows, config.split_block
        else:
            backward, plan = _backward_two_stages, config
        vec = width_hint(x2d, grad_y, grad_x)
        with on_device_of(x):
            partial = backward(x2d, gamma, has_beta, grad_y, grad_x, stats, eps, stable, plan, partial_width, vec)
            sums = sum_partial_rows(partial, param_dtype) if partial_width else None
    grad_gamma = sums[:n_cols] if has_gamma else None
    grad_beta = sums[partial_width - n_cols:] if has_beta else None
    return grad_x.reshape(x.shape), grad_gamma, grad_beta


# --------------------------------------------------------------------------- autograd


def _param_dtype(x, gamma, beta):
    """The dtype of gamma and beta (_check_inputs made them agree), x's if neither is given."""
    param = gamma if gamma is not None else beta
    return x.dtype if param is None else param.dtype


class LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gamma, beta, eps, stable):
        y, stats = layernorm_forward(x, gamma, beta, eps, stable, save_stats=True)
        ctx.save_for_backward(x, gamma, *stats)
        ctx.has_beta, ctx.eps, ctx.stable = beta is not None, eps, stable
        ctx.param_dtype = _param_dtype(x, gamma, beta)
        return y

    @staticmethod
    @first_order_only("layernorm")
    def backward(ctx, grad_y):
        x, gamma, mean, rstd, row_max = ctx.saved_tensors
        grad_x, grad_gamma, grad_beta = layernorm_backward(
            grad_y, x, gamma, ctx.has_beta, RowStats(mean, rstd, row_max), ctx.eps, ctx.stable,
            param_dtype=ctx.param_dtype,
        )
        return grad_x, grad_gamma, grad_beta, None, None


# -------------------------------------------------------------------- custom operator
# What torch.compile traces: operators whose bodies inductor sees through on a GPU
# (see weighted_sum.py's operators for how, and why eager calls keep the
# autograd.Function). An operator returns tensors only: the row statistics are outputs
# of the forward (row_max empty unless ``stable``), and a missing gradient of gamma or
# beta is an empty tensor.


def _present(tensor):
    return tensor if tensor.numel() else None


@kernel_operator("course_lib::layernorm")
def layernorm_op(x: torch.Tensor, gamma: Optional[torch.Tensor], beta: Optional[torch.Tensor], eps: float,
                 stable: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    y, stats = layernorm_forward(x, gamma, beta, eps, stable, save_stats=True)
    return y, stats.mean, stats.rstd, stats.row_max if stable else x.new_empty(0, dtype=torch.float32)


@kernel_operator("course_lib::layernorm_backward")
def layernorm_backward_op(
    grad_y: torch.Tensor, x: torch.Tensor, gamma: Optional[torch.Tensor], has_beta: bool, mean: torch.Tensor,
    rstd: torch.Tensor, row_max: torch.Tensor, eps: float, stable: bool, param_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    grad_x, grad_gamma, grad_beta = layernorm_backward(
        grad_y, x, gamma, has_beta, RowStats(mean, rstd, _present(row_max)), eps, stable, param_dtype=param_dtype
    )
    # The two gradients share one buffer; an operator's outputs may not alias.
    grad_beta = grad_beta.clone() if gamma is not None and has_beta else grad_beta
    def or_empty(grad):
        return x.new_empty(0, dtype=param_dtype) if grad is None else grad
    return grad_x, or_empty(grad_gamma), or_empty(grad_beta)


def _save_for_layernorm_backward(ctx, inputs, output):
    x, gamma, beta, eps, stable = inputs
    _, mean, rstd, row_max = output
    ctx.save_for_backward(x, gamma, mean, rstd, row_max)
    ctx.has_beta, ctx.eps, ctx.stable = beta is not None, eps, stable
    ctx.param_dtype = _param_dtype(x, gamma, beta)


def _layernorm_op_backward(ctx, grad_y, *_grad_stats):
    x, gamma, mean, rstd, row_max = ctx.saved_tensors
    grad_x, grad_gamma, grad_beta = layernorm_backward_op(
        grad_y, x, gamma, ctx.has_beta, mean, rstd, row_max, ctx.eps, ctx.stable, ctx.param_dtype
    )
    return grad_x, _present(grad_gamma), _present(grad_beta), None, None


layernorm_op.register_autograd(_layernorm_op_backward, setup_context=_save_for_layernorm_backward)


# ------------------------------------------------------------------------------ public


def _check_inputs(op, x, gamma, beta, eps, names=("gamma", "beta")):
    """``names``: what the caller calls gamma and beta (the module's weight and bias)."""
    check_tensor(op, "x", x)
    n_cols = x.shape[-1]
    for name, param in zip(names, (gamma, beta)):
        if param is None:
            continue
        check_tensor(op, name, param)
        check_same_device(op, x=x, **{name: param})
        if param.dtype not in (x.dtype, torch.float32):
            raise TypeError(
                f"{op}: {name} has dtype {param.dtype} but x has {x.dtype}; {name} must have x's dtype, "
                "or be float32 (mixed precision, as torch.nn.LayerNorm accepts)"
            )
        if param.shape != (n_cols,):
            raise ValueError(
                f"{op}: {name} must have shape (N,) with N = x.shape[-1] = {n_cols}; "
                f"got {name} of shape {tuple(param.shape)} for x of shape {tuple(x.shape)}"
            )
    if gamma is not None and beta is not None and gamma.dtype != beta.dtype:
        raise TypeError(f"{op}: {names[0]} has dtype {gamma.dtype} but {names[1]} has {beta.dtype}; they must match")
    if n_cols == 0:
        raise ValueError(f"{op}: the last dimension N of x must be at least 1, got x of shape {tuple(x.shape)}")
    if not isinstance(eps, numbers.Real):
        raise TypeError(f"{op}: eps must be a number, got {type(eps).__name__}")
    if not eps >= 0:  # also catches NaN
        raise ValueError(f"{op}: eps must be a non-negative number, got {eps}")
    if n_cols > INT32_LIMIT // 2:  # the backward's partial rows hold dgamma and dbeta side by side
        raise ValueError(f"{op}: N = {n_cols} is too large; at most {INT32_LIMIT // 2} is supported")
    check_index_range(op, M=x.numel() // n_cols)


def layernorm(x, gamma, beta=None, eps=1e-5, stable=False):
    """LayerNorm over the last dimension with Triton kernels, differentiable in x, gamma, beta.

    x: (..., N) float32, float16 or bfloat16, any strides. gamma, beta: (N,) on x's
    device, of x's dtype or float32 (mixed precision: their gradients keep their dtype),
    or None for no scale or no shift. Statistics in float32 (biased variance, as torch);
    returns x's shape and dtype, also under autocast. ``stable=True`` first divides each
    row by its maximum, as the seed did (a row whose maximum is 0 gives NaN).
    """
    return _layernorm("layernorm", ("gamma", "beta"), x, gamma, beta, eps, stable)


def _layernorm(op, names, x, gamma, beta, eps, stable):
    _check_inputs(op, x, gamma, beta, eps, names)
    eps, stable = float(eps), bool(stable)
    if torch.compiler.is_compiling():
        return layernorm_op(x, gamma, beta, eps, stable)[0]
    if wants_gradient(op, x=x, **dict(zip(names, (gamma, beta)))):
        return LayerNormFunction.apply(x, gamma, beta, eps, stable)
    y, _ = layernorm_forward(x, gamma, beta, eps, stable, save_stats=False)  # inference saves nothing
    return y


class LayerNorm(nn.Module):
    """A stand-in for ``torch.nn.LayerNorm`` over the last dimension, on course_lib's kernels.

    Same arguments, parameters (``weight``, ``bias``) and state dict as torch's, plus
    ``stable`` (the seed's division by the row maximum).
    """

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                 device=None, dtype=None, stable=False):
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, numbers.Integral) else tuple(normalized_shape)
        if len(shape) != 1:
            raise ValueError(
                f"LayerNorm: normalizes over the last dimension only, so normalized_shape must be "
                f"an int or a 1-tuple; got {normalized_shape!r}"
            )
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
        check_tensor("LayerNorm", "x", x)
        if x.shape[-1] != self.normalized_shape[0]:
            raise ValueError(
                f"LayerNorm: expected x of shape (..., {self.normalized_shape[0]}), got {tuple(x.shape)}"
            )
        return _layernorm("LayerNorm", ("weight", "bias"), x, self.weight, self.bias, self.eps, self.stable)

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
                f"stable={self.stable}")
