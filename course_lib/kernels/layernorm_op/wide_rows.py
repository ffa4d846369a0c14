"""LayerNorm for rows wider than a tile: chapter 3's optional section.

``layernorm`` holds rows whole in registers; this module takes the rows that do not fit.

* The looped forward walks a row in tiles twice: once for the statistics, merged tile
  by tile, once to normalise.
* The split-row backward gives each program one column block of a row. The programs
  holding one row run at once and exchange their parts of the row's two sums through
  ``split_rows``, so each row is read once.
* The two-stage backward is the fallback where they cannot all be resident (and in
  the interpreter, which runs one program after another): a first kernel writes each
  row's sums over each column block, a second adds them up and writes dx.

Both backwards write partial rows of dgamma and dbeta, added up afterwards in a fixed
order, as ``layernorm``'s persistent kernel does.
"""

import torch
import triton
import triton.language as tl

from .parts import (column_block, first_values, grad_x_of, load_backward_rows, partial_rows,
                              store_partial_row, stride_of, xhat_of)
from ...core.rows import known_multiple_of
from ...core.runtime import cdiv, launch, multiprocessor_count, next_power_of_2, spin_waits_allowed
from ...core.split_rows import gather, publish, slots_block

# The split-row backward: SPLIT_ROW_BLOCK columns a program, on SPLIT_ROW_WARPS warps. Four warps
# of at most 255 registers a thread take half of a multiprocessor's 65536 registers (on
# every GPU of compute capability 8.0 or newer), and the kernel little shared memory,
# so SPLIT_PROGRAMS_PER_SM programs always fit on one together.
SPLIT_ROW_WARPS = 4
SPLIT_PROGRAMS_PER_SM = 2


@triton.jit
def layernorm_forward_looped_kernel(
    x_ptr, gamma_ptr, beta_ptr, y_ptr, mean_ptr, rstd_ptr,
    n_rows, n_cols, eps,
    stride_x_row, stride_x_col, stride_gamma, stride_beta, stride_y_row,
    HAS_GAMMA: tl.constexpr, HAS_BETA: tl.constexpr, SAVE_STATS: tl.constexpr,
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
    # a mean of exactly shift (as in layernorm_forward_kernel).
    shift = first_values(x_ptr, rows64, row_mask, stride_x_row)
    mean = tl.zeros((BLOCK_ROWS,), dtype=tl.float32)
    sum_sq_dev = tl.zeros((BLOCK_ROWS,), dtype=tl.float32)
    for col_start in tl.range(0, n_cols, BLOCK_COLS, num_stages=NUM_STAGES):
        cols = col_start + tl.arange(0, BLOCK_COLS)
        mask = row_mask[:, None] & (cols < n_cols)[None, :]
        # Lanes outside the row load the shift itself, so x - shift is 0 there with no
        # select (x's dtype holds the shift exactly: it is one of x's values).
        x = tl.load(x_row_ptrs + cols[None, :].to(tl.int64) * stride_x_col, mask=mask,
                    other=shift[:, None].to(x_ptr.dtype.element_ty)).to(tl.float32)
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
    rstd = tl.rsqrt(var + eps)

    # Pass 2 walks back: the tiles read last are the likeliest to still be in L2.
    n_tiles = tl.cdiv(n_cols, BLOCK_COLS)
    for tile in tl.range(0, n_tiles, num_stages=NUM_STAGES):
        cols = (n_tiles - 1 - tile) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
        col_mask = cols < n_cols
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(x_row_ptrs + cols[None, :].to(tl.int64) * stride_x_col, mask=mask, other=0.0).to(tl.float32)
        y = xhat_of(x, mean, rstd, mask)
        if HAS_GAMMA:
            y *= tl.load(gamma_ptr + cols.to(tl.int64) * stride_gamma, mask=col_mask, other=0.0).to(tl.float32)[None, :]
        if HAS_BETA:
            y += tl.load(beta_ptr + cols.to(tl.int64) * stride_beta, mask=col_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + rows64[:, None] * stride_y_row + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
    if SAVE_STATS:
        tl.store(mean_ptr + rows, mean, mask=row_mask)
        tl.store(rstd_ptr + rows, rstd, mask=row_mask)


@triton.jit
def _load_split_row(x_ptr, grad_y_ptr, mean_ptr, rstd_ptr, row, n_rows, col_mask,
                    col_offsets_x, col_offsets_grad_y, stride_x_row, stride_grad_y_row):
    """A program's tile of one row (as a tile of one row), its statistics; nothing past the last row."""
    rows = row + tl.arange(0, 1)
    row_mask = rows < n_rows
    return load_backward_rows(
        x_ptr, grad_y_ptr, mean_ptr, rstd_ptr, rows, row_mask[:, None] & col_mask[None, :], row_mask,
        col_offsets_x, col_offsets_grad_y, stride_x_row, stride_grad_y_row,
    )


@triton.jit
def _row_vector(value):
    """A row's scalar as a vector of one, to broadcast over a tile of one row."""
    return tl.zeros((1,), tl.float32) + value


@triton.jit
def layernorm_backward_split_rows_kernel(
    x_ptr, gamma_ptr, grad_y_ptr, mean_ptr, rstd_ptr, grad_x_ptr, partial_ptr, slots_ptr,
    n_rows, n_cols,
    stride_x_row, stride_x_col, stride_gamma, stride_grad_y_row, stride_grad_y_col,
    stride_grad_x_row, stride_partial_row,
    HAS_GAMMA: tl.constexpr, HAS_BETA: tl.constexpr,
    BLOCK_COLS: tl.constexpr, TILES_BLOCK: tl.constexpr, PREFETCH: tl.constexpr, VEC: tl.constexpr,
):
    """Rows wider than a block, read once: program (g, c) holds column block c of rows
    g, g + num_programs(0), ... one row at a time, with its partial dgamma and dbeta in
    registers down the rows, as the persistent kernel does.

    A row's dx needs two sums over the whole row. Each program publishes its block's
    parts into the row's slots (rows, 2, tiles), waits until every block of the row
    has, and adds them up: all programs of the row must be resident at once (the
    launcher sees to it). With PREFETCH the next row's tile is loaded before the wait,
    so the load runs during it; that takes registers for a second tile.
    """
    n_cols = known_multiple_of(n_cols, VEC)  # the same numbers, visibly multiples of VEC (width_hint)
    stride_x_row = known_multiple_of(stride_x_row, VEC)
    stride_grad_y_row = known_multiple_of(stride_grad_y_row, VEC)
    stride_grad_x_row = known_multiple_of(stride_grad_x_row, VEC)
    group = tl.program_id(0)
    tile = tl.program_id(1)
    n_groups = tl.num_programs(0)
    n_tiles = tl.num_programs(1)
    cols, col_mask, col_offsets_x, col_offsets_grad_y = column_block(
        tile, n_cols, stride_x_col, stride_grad_y_col, BLOCK_COLS)
    if HAS_GAMMA:
        gamma = tl.load(gamma_ptr + cols.to(tl.int64) * stride_gamma, mask=col_mask, other=0.0).to(tl.float32)
    grad_gamma_acc = tl.zeros((1, BLOCK_COLS), dtype=tl.float32)
    grad_beta_acc = tl.zeros((1, BLOCK_COLS), dtype=tl.float32)

    x, grad_y, mean, rstd = _load_split_row(
        x_ptr, grad_y_ptr, mean_ptr, rstd_ptr, group, n_rows, col_mask,
        col_offsets_x, col_offsets_grad_y, stride_x_row, stride_grad_y_row)
    for row in range(group, n_rows, n_groups):
        if PREFETCH:
            next_row = _load_split_row(
                x_ptr, grad_y_ptr, mean_ptr, rstd_ptr, row + n_groups, n_rows, col_mask,
                col_offsets_x, col_offsets_grad_y, stride_x_row, stride_grad_y_row)
        mask = col_mask[None, :]
        xhat = xhat_of(x, mean, rstd, mask)
        weighted_grad = grad_y * gamma[None, :] if HAS_GAMMA else grad_y
        row_slots = slots_ptr + tl.cast(row, tl.int64) * 2 * n_tiles
        publish(row_slots + tile, tl.sum(weighted_grad), 1)
        publish(row_slots + n_tiles + tile, tl.sum(weighted_grad * xhat), 1)
        sum_g, sum_g_xhat, _ = gather(row_slots, 1, n_tiles, 2, TILES_BLOCK)
        c1 = _row_vector(tl.div_rn(sum_g, n_cols * 1.0))
        c2 = _row_vector(tl.div_rn(sum_g_xhat, n_cols * 1.0))
        tl.store(grad_x_ptr + tl.cast(row, tl.int64) * stride_grad_x_row + cols[None, :],
                 grad_x_of(weighted_grad, xhat, rstd, c1, c2).to(grad_x_ptr.dtype.element_ty), mask=mask)
        grad_gamma_acc += grad_y * xhat
        grad_beta_acc += grad_y
        if PREFETCH:
            x, grad_y, mean, rstd = next_row
        else:
            x, grad_y, mean, rstd = _load_split_row(
                x_ptr, grad_y_ptr, mean_ptr, rstd_ptr, row + n_groups, n_rows, col_mask,
                col_offsets_x, col_offsets_grad_y, stride_x_row, stride_grad_y_row)

    store_partial_row(partial_ptr + group.to(tl.int64) * stride_partial_row, cols, col_mask, n_cols,
                      grad_gamma_acc, grad_beta_acc, HAS_GAMMA, HAS_BETA)


@triton.jit
def layernorm_backward_partials_kernel(
    x_ptr, gamma_ptr, grad_y_ptr, mean_ptr, rstd_ptr, row_sums_ptr, partial_ptr,
    n_rows, n_cols, rows_per_program,
    stride_x_row, stride_x_col, stride_gamma, stride_grad_y_row, stride_grad_y_col,
    stride_sums_plane, stride_partial_row,
    HAS_GAMMA: tl.constexpr, HAS_BETA: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, NUM_STAGES: tl.constexpr, VEC: tl.constexpr,
):
    """Two stages, stage 1: program (c, g) owns column block c and the rows of group g.

    A row's dx needs sums over the whole row, which one program no longer holds; so
    this kernel only writes, for each of its rows, the sums over its columns of
    dy * gamma and dy * gamma * xhat into row_sums[q, row, c]. Its partial dgamma and
    dbeta stay in registers down the rows, as in chapter 1.
    """
    n_cols = known_multiple_of(n_cols, VEC)  # the same numbers, visibly multiples of VEC (width_hint)
    stride_x_row = known_multiple_of(stride_x_row, VEC)
    stride_grad_y_row = known_multiple_of(stride_grad_y_row, VEC)
    col_block = tl.program_id(0)
    row_group = tl.program_id(1)
    n_col_blocks = tl.num_programs(0)
    cols, col_mask, col_offsets_x, col_offsets_grad_y = column_block(
        col_block, n_cols, stride_x_col, stride_grad_y_col, BLOCK_COLS)
    if HAS_GAMMA:
        gamma = tl.load(gamma_ptr + cols.to(tl.int64) * stride_gamma, mask=col_mask, other=0.0).to(tl.float32)
    grad_gamma_acc = tl.zeros((BLOCK_ROWS, BLOCK_COLS), dtype=tl.float32)
    grad_beta_acc = tl.zeros((BLOCK_ROWS, BLOCK_COLS), dtype=tl.float32)

    first_row = row_group * rows_per_program
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
        sums_ptrs = row_sums_ptr + rows.to(tl.int64) * n_col_blocks + col_block
        tl.store(sums_ptrs, tl.sum(weighted_grad, axis=1), mask=row_mask)
        tl.store(sums_ptrs + stride_sums_plane, tl.sum(weighted_grad * xhat, axis=1), mask=row_mask)
        grad_gamma_acc += grad_y * xhat
        grad_beta_acc += grad_y

    store_partial_row(partial_ptr + row_group.to(tl.int64) * stride_partial_row, cols, col_mask, n_cols,
                      grad_gamma_acc, grad_beta_acc, HAS_GAMMA, HAS_BETA)


@triton.jit
def layernorm_backward_dx_kernel(
    x_ptr, gamma_ptr, grad_y_ptr, mean_ptr, rstd_ptr, row_sums_ptr, grad_x_ptr,
    n_rows, n_cols, n_col_blocks,
    stride_x_row, stride_x_col, stride_gamma, stride_grad_y_row, stride_grad_y_col,
    stride_grad_x_row, stride_sums_plane,
    HAS_GAMMA: tl.constexpr, VEC: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, BLOCK_SUMS: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    """Two stages, stage 2: add up each row's sums in a fixed order, then walk the row writing dx."""
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
    for block_start in range(0, n_col_blocks, BLOCK_SUMS):
        blocks = block_start + tl.arange(0, BLOCK_SUMS)
        sums_mask = row_mask[:, None] & (blocks < n_col_blocks)[None, :]
        sums_ptrs = row_sums_ptr + rows64[:, None] * n_col_blocks + blocks[None, :]
        sum_weighted_grad += tl.load(sums_ptrs, mask=sums_mask, other=0.0)
        sum_weighted_grad_xhat += tl.load(sums_ptrs + stride_sums_plane, mask=sums_mask, other=0.0)
    c1 = tl.div_rn(tl.sum(sum_weighted_grad, axis=1), n_cols * 1.0)
    c2 = tl.div_rn(tl.sum(sum_weighted_grad_xhat, axis=1), n_cols * 1.0)

    mean = tl.load(mean_ptr + rows, mask=row_mask, other=0.0)
    rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
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
            gamma = tl.load(gamma_ptr + cols.to(tl.int64) * stride_gamma, mask=col_mask, other=0.0).to(tl.float32)
        weighted_grad = grad_y * gamma[None, :] if HAS_GAMMA else grad_y
        grad_x = grad_x_of(weighted_grad, xhat_of(x, mean, rstd, mask), rstd, c1, c2)
        tl.store(grad_x_ptr + rows64[:, None] * stride_grad_x_row + cols[None, :],
                 grad_x.to(grad_x_ptr.dtype.element_ty), mask=mask)


# -------------------------------------------------------------------------- launchers


def can_split_rows(x, split_block):
    """Whether the split-row kernel can run on ``x``'s rows: the programs of a row wait on
    each other, so all of them must be resident at once. The grid holds at most
    SPLIT_PROGRAMS_PER_SM a multiprocessor, which always fit (SPLIT_ROW_WARPS), and the launch
    is cooperative, so CUDA starts it only with all of them resident, whatever else runs on
    the GPU (spin_waits_allowed: not in the interpreter, nor under torch.compile). A row of
    one block waits on nobody: that runs anywhere."""
    n_tiles = cdiv(x.shape[-1], split_block)
    return n_tiles == 1 or (spin_waits_allowed(x) and n_tiles <= SPLIT_PROGRAMS_PER_SM * multiprocessor_count())


def backward_split_rows(x2d, gamma, has_beta, grad_y, grad_x, stats, block_cols, partial_width, vec):
    """The split-row kernel: dx, and the partial rows of dgamma and dbeta it returns."""
    n_rows, n_cols = x2d.shape
    n_tiles = cdiv(n_cols, block_cols)
    n_groups = min(n_rows, max(1, SPLIT_PROGRAMS_PER_SM * multiprocessor_count() // n_tiles))
    # One 64-bit word per row, sum and tile; zero means "not published yet".
    slots = x2d.new_zeros((n_rows, 2, n_tiles), dtype=torch.int64)
    partial = x2d.new_empty((n_groups, partial_width), dtype=torch.float32)
    launch(layernorm_backward_split_rows_kernel, (n_groups, n_tiles),
        x2d, gamma, grad_y, stats.mean, stats.rstd, grad_x, partial, slots,
        n_rows, n_cols,
        x2d.stride(0), x2d.stride(1), stride_of(gamma), grad_y.stride(0), grad_y.stride(1),
        grad_x.stride(0), partial.stride(0),
        HAS_GAMMA=gamma is not None, HAS_BETA=has_beta,
        BLOCK_COLS=block_cols, TILES_BLOCK=slots_block(n_tiles, SPLIT_ROW_WARPS), PREFETCH=x2d.element_size() < 4,
        VEC=vec, num_warps=SPLIT_ROW_WARPS, cooperative=n_tiles > 1,
    )
    return partial


def backward_two_stages(x2d, gamma, has_beta, grad_y, grad_x, stats, config, partial_width, vec):
    """The partial sums kernel, then the dx kernel; returns the partial rows of dgamma and dbeta."""
    n_rows, n_cols = x2d.shape
    block_rows, block_cols, num_warps, num_stages = config.tiles
    col_blocks = cdiv(n_cols, block_cols)
    rows_per_group, partial = partial_rows(
        n_rows, block_rows, config.programs_per_sm * multiprocessor_count() // col_blocks, partial_width, x2d.device
    )
    row_sums = x2d.new_empty((2, n_rows, col_blocks), dtype=torch.float32)  # sums of dy*gamma, dy*gamma*xhat
    launch(layernorm_backward_partials_kernel, (col_blocks, partial.shape[0]),
        x2d, gamma, grad_y, stats.mean, stats.rstd, row_sums, partial,
        n_rows, n_cols, rows_per_group,
        x2d.stride(0), x2d.stride(1), stride_of(gamma), grad_y.stride(0), grad_y.stride(1),
        row_sums.stride(0), partial.stride(0),
        HAS_GAMMA=gamma is not None, HAS_BETA=has_beta,
        BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols, NUM_STAGES=num_stages, VEC=vec, num_warps=num_warps,
    )
    dx_rows, dx_cols, dx_warps, dx_stages = config.dx_tiles
    launch(layernorm_backward_dx_kernel, (cdiv(n_rows, dx_rows),),
        x2d, gamma, grad_y, stats.mean, stats.rstd, row_sums, grad_x,
        n_rows, n_cols, col_blocks,
        x2d.stride(0), x2d.stride(1), stride_of(gamma), grad_y.stride(0), grad_y.stride(1),
        grad_x.stride(0), row_sums.stride(0),
        HAS_GAMMA=gamma is not None, VEC=vec,
        BLOCK_ROWS=dx_rows, BLOCK_COLS=dx_cols, BLOCK_SUMS=min(next_power_of_2(col_blocks), 256),
        NUM_STAGES=dx_stages, num_warps=dx_warps,
    )
    return partial
