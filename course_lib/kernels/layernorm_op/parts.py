"""The pieces ``whole_rows`` (rows held whole in registers) and ``wide_rows`` (rows wider than a tile) share.

What every LayerNorm kernel does with a tile of rows: xhat from the row statistics, the
backward's loads and its formula for dx, a program's partial row of dgamma and dbeta.
And what the launchers share: the tiles, warps and pipelining each kernel runs on, as
benchmarks/tune_layernorm.py's sweep chose them, and the buffer of partial rows they
hand to ``rows.sum_partial_rows``.
"""

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ...core.plans import LaunchPlan, TunedOn, warps_for
from ...core.runtime import cdiv, max_shared_memory, next_power_of_2
from ...core.validation import INT32_LIMIT


@triton.jit
def xhat_of(x, mean, rstd, mask):
    """xhat = (x - mean) * rstd; 0 outside the mask. Stats are per row."""
    return tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)


@triton.jit
def first_values(x_ptr, rows64, row_mask, stride_x_row):
    """x[rows, 0] in float32: the shift the forward kernels take the mean relative to."""
    return tl.load(x_ptr + rows64 * stride_x_row, mask=row_mask, other=0.0).to(tl.float32)


@triton.jit
def grad_x_of(weighted_grad, xhat, rstd, c1, c2):
    """dx from dL/dxhat = dy * gamma and its row means c1 = mean(dL/dxhat), c2 = mean(dL/dxhat * xhat)."""
    return (weighted_grad - c1[:, None] - xhat * c2[:, None]) * rstd[:, None]


@triton.jit
def load_backward_rows(x_ptr, grad_y_ptr, mean_ptr, rstd_ptr, rows, mask, row_mask,
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
def column_block(block, n_cols, stride_x_col, stride_grad_y_col, BLOCK_COLS: tl.constexpr):
    """Column block ``block`` of the rows: its columns, their mask, and their offsets in x and in dy."""
    cols = block * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    col_offsets = cols[None, :].to(tl.int64)
    return cols, cols < n_cols, col_offsets * stride_x_col, col_offsets * stride_grad_y_col


@triton.jit
def store_partial_row(partial_row_ptr, cols, col_mask, n_cols, grad_gamma_acc, grad_beta_acc,
                      HAS_GAMMA: tl.constexpr, HAS_BETA: tl.constexpr):
    """A program's partial row: its column sums of dy * xhat (dgamma's), then of dy (dbeta's)."""
    if HAS_GAMMA:
        tl.store(partial_row_ptr + cols, tl.sum(grad_gamma_acc, axis=0), mask=col_mask)
        partial_row_ptr += n_cols
    if HAS_BETA:
        tl.store(partial_row_ptr + cols, tl.sum(grad_beta_acc, axis=0), mask=col_mask)


# -------------------------------------------------------------------------- launchers


class BackwardConfig(NamedTuple):
    """How the backward is cut up.

    ``tiles.block_cols >= n_cols``: one persistent kernel with whole rows in registers,
    ``programs_per_sm`` programs a multiprocessor. Otherwise (wide_rows), where
    ``split_block`` is set and the split can run (can_split_rows), the split-row kernel
    with ``split_block`` columns a program; else two stages: the partial sums kernel on
    ``tiles`` (about ``programs_per_sm`` programs a multiprocessor), then the dx kernel
    walking rows on ``dx_tiles``.
    """

    tiles: LaunchPlan
    programs_per_sm: int
    dx_tiles: LaunchPlan | None = None
    split_block: int | None = None


# Widest rows held whole in registers (elements); wider rows take wide_rows'
# kernels, with SPLIT_ROW_BLOCK columns a program when split, or walked WIDE_ROW_TILE
# columns a step by the two-stage backward's dx kernel. The backward holds x, dy and two float32 partial sums a column, the forward
# only x, so its rows can be four times as wide.
FORWARD_MAX_BLOCK = 32768
BACKWARD_MAX_BLOCK = 8192
SPLIT_ROW_BLOCK = 4096
WIDE_ROW_TILE = 8192
# Bytes of x a thread holds, from which the tiles' warps follow (see forward_tiles).
# The plans below were chosen by this sweep:
TUNED_ON = TunedOn("NVIDIA H200", "3.6.0", "benchmarks/tune_layernorm.py")
BYTES_A_THREAD = 64
MAX_WARPS = 16
FORWARD_MAX_WARPS = 32  # 1024 threads, the most a program may have: whole rows of 32768 float32
PIPELINE_STAGES = 3  # the whole-row backward's loop over rows, where shared memory allows
# Shared memory the pipelined backward leaves to the compiler (reductions' scratch).
SHARED_MEMORY_RESERVE = 16 * 1024
# The backward's tiles count narrower rows as this wide: their float32 mean and rstd
# are pipelined too, and 4096 rows of one column would otherwise need 160 KiB.
NARROW_ROW_WIDTH = 16


def _warps_for_tile(tile_bytes, max_warps=MAX_WARPS):
    """BYTES_A_THREAD bytes of the tile a thread, 4 to max_warps warps."""
    return warps_for(tile_bytes, 32 * BYTES_A_THREAD, min_warps=4, max_warps=max_warps)


@functools.cache  # called on every launch: keep the host path short
def forward_tiles(n_cols, element_size):
    """The forward's LaunchPlan, as benchmarks/tune_layernorm.py's sweep chose it.

    64 bytes of x a thread, 4 to FORWARD_MAX_WARPS warps (more only add reductions
    across warps); narrow rows share a program, up to 4 KiB of x; whole rows up to
    FORWARD_MAX_BLOCK columns, since looping reads each row twice. Wider rows loop
    (wide_rows) over the largest tile of 16 warps, 64 bytes a thread.
    """
    block_cols = next_power_of_2(n_cols)
    if block_cols > FORWARD_MAX_BLOCK:
        return LaunchPlan(1, MAX_WARPS * 32 * BYTES_A_THREAD // element_size, MAX_WARPS)
    block_rows = max(1, 4096 // (block_cols * element_size))
    return LaunchPlan(block_rows, block_cols, _warps_for_tile(block_rows * block_cols * element_size, FORWARD_MAX_WARPS))


def _counted_width(block_cols):
    """The width the backward's tiles count a row as: at least NARROW_ROW_WIDTH."""
    return max(block_cols, NARROW_ROW_WIDTH)


@functools.cache  # called on every launch: keep the host path short
def backward_config(n_cols, element_size, shared_memory=None):
    """BackwardConfig for rows of ``n_cols`` elements of ``element_size`` bytes, as
    benchmarks/tune_layernorm.py's sweep chose it.

    Whole rows: tiles of up to 4096 values, warps as in the forward, the loop over rows
    pipelined PIPELINE_STAGES deep where ``shared_memory`` (None: this GPU's) holds the
    extra tiles of x and dy, and programs_per_sm such that each multiprocessor loads
    16 KiB of x a stage. Wider rows: wide_rows' split rows, or its two stages on
    chapter 1's partial-sum tiles of 4 x 512 and a dx kernel walking WIDE_ROW_TILE columns.
    """
    block_cols = next_power_of_2(n_cols)
    if block_cols > BACKWARD_MAX_BLOCK:
        return BackwardConfig(LaunchPlan(4, 512, 4), 4, LaunchPlan(1, WIDE_ROW_TILE, MAX_WARPS), SPLIT_ROW_BLOCK)
    row_width = _counted_width(block_cols)
    block_rows = max(1, 4096 // row_width)
    tile_bytes = block_rows * row_width * element_size
    if shared_memory is None:
        shared_memory = max_shared_memory()
    tiles = LaunchPlan(block_rows, block_cols, _warps_for_tile(tile_bytes), PIPELINE_STAGES)
    if pipeline_shared_bytes(tiles, element_size) + SHARED_MEMORY_RESERVE > shared_memory:
        tiles = tiles._replace(num_stages=1)
    return BackwardConfig(tiles, programs_per_sm=max(1, 16384 // tile_bytes))


def pipeline_shared_bytes(tiles, element_size):
    """Shared memory of the backward's pipeline on ``tiles``: num_stages - 1 more tiles of
    x and dy, and of the row stats (_counted_width)."""
    return (tiles.num_stages - 1) * tiles.block_rows * (2 * _counted_width(tiles.block_cols) * element_size + 2 * 4)


def partial_rows(n_rows, block_rows, groups_wanted, partial_width, device):
    """(rows_per_group, partial): row groups of whole row tiles, and one float32 partial row a group.

    No more partial elements than sum_partial_rows's 32-bit offsets reach.
    """
    groups_wanted = max(1, min(groups_wanted, INT32_LIMIT // max(1, partial_width)))
    rows_per_group = block_rows * cdiv(cdiv(n_rows, groups_wanted), block_rows)
    partial = torch.empty((cdiv(n_rows, rows_per_group), partial_width), device=device, dtype=torch.float32)
    return rows_per_group, partial


def stride_of(tensor):
    """The stride of a vector (gamma, beta), or 0 for a missing one."""
    return tensor.stride(0) if tensor is not None else 0
