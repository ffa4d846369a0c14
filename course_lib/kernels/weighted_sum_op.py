"""Weighted sum over the last dimension: y[..., ] = sum_d x[..., d] * weight[d].

Chapter 1. Read top to bottom: the Triton kernels, the host launchers that pick tiles
and grids, the ``torch.autograd.Function``, and the public ``weighted_sum``.
"""

import functools

import torch
import triton
import triton.language as tl

from ..core import references
from ..core.operator import differentiable_op
from ..core.plans import LaunchPlan, TunedOn, warps_for
from ..core.rows import as_rows, known_multiple_of, shaped_like, sum_partial_rows, vector_width, width_hint
from ..core.runtime import cdiv, launch, multiprocessor_count, next_power_of_2
from ..core.validation import (
    check_index_range,
    check_like,
    check_same_device_and_dtype,
    check_tensor,
    FLOAT_DTYPES,
    on_device_of,
    plain_inputs,
    PUBLIC_DTYPES,
    runs_reference,
    by_reference,
)

# ---------------------------------------------------------------------------- kernels


@triton.jit
def weighted_tile(x_row_ptrs, weight_ptr, cols, n_cols, row_mask, stride_x_col, stride_weight,
                   X_EVICTION: tl.constexpr):
    """x[rows, cols] * weight[cols] in float32, zero outside the matrix."""
    col_mask = cols < n_cols
    x = tl.load(
        x_row_ptrs + cols[None, :].to(tl.int64) * stride_x_col,
        mask=row_mask[:, None] & col_mask[None, :],
        other=0.0,
        eviction_policy=X_EVICTION,
    )
    w = tl.load(weight_ptr + cols.to(tl.int64) * stride_weight, mask=col_mask, other=0.0)
    return x.to(tl.float32) * w.to(tl.float32)[None, :]


@triton.jit
def weighted_sum_forward_kernel(
    x_ptr, weight_ptr, y_ptr,
    n_rows, n_cols,
    stride_x_row, stride_x_col, stride_weight, stride_y,
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, NUM_STAGES: tl.constexpr,
    WHOLE_ROWS: tl.constexpr, VEC: tl.constexpr,
):
    """One program computes BLOCK_ROWS outputs.

    WHOLE_ROWS (the launcher sets it when BLOCK_COLS >= n_cols): one tile holds the
    program's rows, loaded once, with no loop. Otherwise the program walks the
    columns a tile at a time.
    """
    n_cols = known_multiple_of(n_cols, VEC)
    stride_x_row = known_multiple_of(stride_x_row, VEC)
    row_block = tl.program_id(0)
    rows = row_block * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_mask = rows < n_rows
    # 64-bit row offsets: rows * stride can pass 2**31 on large inputs.
    x_row_ptrs = x_ptr + rows.to(tl.int64)[:, None] * stride_x_row
    if WHOLE_ROWS:
        # x is read once: "evict_first" lets its lines be the first to leave the
        # cache. Across several column tiles it did not pay, so the loop below keeps
        # the default (benchmarks/tune_weighted_sum.py).
        acc = weighted_tile(x_row_ptrs, weight_ptr, tl.arange(0, BLOCK_COLS), n_cols, row_mask,
                             stride_x_col, stride_weight, "evict_first")
    else:
        # Accumulate a whole tile in float32 and reduce once at the end: one
        # reduction per program instead of one per column tile.
        acc = tl.zeros((BLOCK_ROWS, BLOCK_COLS), dtype=tl.float32)
        # num_stages > 1 lets the compiler issue the next tiles' loads before this one is used.
        for col_start in tl.range(0, n_cols, BLOCK_COLS, num_stages=NUM_STAGES):
            acc += weighted_tile(x_row_ptrs, weight_ptr, col_start + tl.arange(0, BLOCK_COLS), n_cols, row_mask,
                                  stride_x_col, stride_weight, "")
    y = tl.sum(acc, axis=1)
    tl.store(y_ptr + rows.to(tl.int64) * stride_y, y.to(y_ptr.dtype.element_ty), mask=row_mask)


@triton.jit
def weighted_sum_backward_kernel(
    x_ptr, weight_ptr, grad_y_ptr, grad_x_ptr, partial_grad_weight_ptr,
    n_rows, n_cols, rows_per_program,
    stride_x_row, stride_x_col, stride_weight, stride_grad_y,
    stride_grad_x_row, stride_grad_x_col, stride_partial_row,
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, NUM_STAGES: tl.constexpr, VEC: tl.constexpr,
):
    """Program (c, g) owns columns block c and the rows of group g.

    grad_x[m, d] = grad_y[m] * weight[d] is an outer product, written tile by tile.
    grad_weight[d] = sum_m x[m, d] * grad_y[m] needs every row: each program adds up
    its own rows and writes one partial row; the launcher sums the partials in a
    fixed order, so the result is the same from run to run (no atomics).
    """
    n_cols = known_multiple_of(n_cols, VEC)
    stride_x_row = known_multiple_of(stride_x_row, VEC)
    stride_grad_x_row = known_multiple_of(stride_grad_x_row, VEC)
    col_block = tl.program_id(0)
    row_group = tl.program_id(1)
    cols = col_block * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    col_mask = cols < n_cols
    col_offsets_x = cols[None, :].to(tl.int64) * stride_x_col
    col_offsets_grad_x = cols[None, :].to(tl.int64) * stride_grad_x_col
    w = tl.load(weight_ptr + cols.to(tl.int64) * stride_weight, mask=col_mask, other=0.0).to(tl.float32)

    acc = tl.zeros((BLOCK_ROWS, BLOCK_COLS), dtype=tl.float32)
    first_row = row_group * rows_per_program
    last_row = tl.minimum(first_row + rows_per_program, n_rows)
    for row_start in tl.range(first_row, last_row, BLOCK_ROWS, num_stages=NUM_STAGES):
        rows = row_start + tl.arange(0, BLOCK_ROWS)
        row_mask = rows < last_row
        mask = row_mask[:, None] & col_mask[None, :]
        rows64 = rows.to(tl.int64)
        g = tl.load(grad_y_ptr + rows64 * stride_grad_y, mask=row_mask, other=0.0).to(tl.float32)
        x = tl.load(x_ptr + rows64[:, None] * stride_x_row + col_offsets_x, mask=mask, other=0.0)
        acc += x.to(tl.float32) * g[:, None]
        grad_x = g[:, None] * w[None, :]
        tl.store(
            grad_x_ptr + rows64[:, None] * stride_grad_x_row + col_offsets_grad_x,
            grad_x.to(grad_x_ptr.dtype.element_ty),
            mask=mask,
        )
    partial = tl.sum(acc, axis=0)
    tl.store(partial_grad_weight_ptr + row_group * stride_partial_row + cols, partial, mask=col_mask)


# -------------------------------------------------------------------------- launchers


# The plans below were chosen by this sweep:
TUNED_ON = TunedOn("NVIDIA H200", "3.6.0", "benchmarks/tune_weighted_sum.py")
FORWARD_TILE_BYTES = 16384


@functools.cache  # called on every launch: keep the host path short
def forward_tiles(n_cols, element_size, wide_loads=True):
    """The forward kernel's LaunchPlan.

    ``wide_loads``: whether Triton can read x 16 bytes at a time (``vector_width``).
    The choices, each the best of benchmarks/tune_weighted_sum.py's sweep:

    * Whole rows in tiles of 16 KiB on 16 warps, a KiB of x a warp, loaded without a
      loop (a loop of one trip over the same tile is slower). Widths between powers of
      two pad the tile, and lose what the padding costs.
    * When loads are narrower, fewer warps, each with more values in flight: a warp for
      every 1024 columns of the tile, at least two rows and 4 KiB.
    * Rows wider than 16 KiB are walked two at a time in tiles of 16 KiB on 4 warps;
      pipelining that loop only slowed it.
    """
    row_block = next_power_of_2(n_cols)
    row_bytes = row_block * element_size
    if row_bytes > FORWARD_TILE_BYTES:
        return LaunchPlan(2, FORWARD_TILE_BYTES // 2 // element_size, 4)
    if wide_loads:
        return LaunchPlan(FORWARD_TILE_BYTES // row_bytes, row_block, 16)
    return LaunchPlan(max(2, 4096 // row_bytes), row_block, warps_for(row_block, 1024))


@functools.cache  # called on every launch: keep the host path short
def backward_tiles(n_cols, element_size):
    """The backward kernel's LaunchPlan.

    Narrower column blocks than the forward: each program keeps a float32 partial
    grad_weight for its columns, and more column blocks mean more programs. From the
    same sweep: float32 is best at 16 x 256 tiles, 16-bit types at 32 x 128. When one
    block spans the whole row each program walks many rows, and pipelining that loop
    three deep gained 3-6% (D = 128); elsewhere it gained nothing.
    """
    tile_bytes, row_bytes = (16384, 1024) if element_size == 4 else (8192, 256)
    block_cols = min(next_power_of_2(n_cols), row_bytes // element_size)
    block_rows = max(1, tile_bytes // element_size // block_cols)
    return LaunchPlan(block_rows, block_cols, 4, 3 if block_cols >= n_cols else 1)


BACKWARD_PROGRAMS_PER_SM = 4


def _check_inputs(op, x, weight, dtypes=FLOAT_DTYPES, plain=False):
    """``dtypes``: the kernels' (the operators' check), or the public function's, float64 too.
    ``plain``: what plain_inputs said of x and weight."""
    check_tensor(op, "x", x, dtypes=dtypes, plain=plain)
    check_tensor(op, "weight", weight, dtypes=dtypes, plain=plain)
    check_same_device_and_dtype(op, x=x, weight=weight)
    if weight.ndim != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(
            f"{op}: weight must have shape (D,) with D = x.shape[-1] = {x.shape[-1]}; "
            f"got weight of shape {tuple(weight.shape)} for x of shape {tuple(x.shape)}"
        )
    if x.shape[-1] == 0:
        raise ValueError(f"{op}: the last dimension D of x must be at least 1, got x of shape {tuple(x.shape)}")
    check_index_range(op, D=x.shape[-1], M=x.numel() // x.shape[-1])


def weighted_sum_forward(x, weight, tiles=None):
    """Launch the forward kernel; ``tiles``, a LaunchPlan, overrides forward_tiles'."""
    x2d = as_rows(x)
    n_rows, n_cols = x2d.shape
    # In x.shape[:-1], not a view of a row of sums: a caller may change y in place. The
    # kernel gets y itself (contiguous: row r at r), not a view: traced by torch.compile,
    # a view written by the kernel would make the output a view, which may not be.
    y = torch.empty(x.shape[:-1], device=x.device, dtype=x.dtype)
    if n_rows == 0:
        return y
    vec = vector_width(x2d)
    block_rows, block_cols, num_warps, num_stages = tiles or forward_tiles(
        int(n_cols), x.element_size(), wide_loads=vec * x.element_size() == 16
    )
    grid = (cdiv(n_rows, block_rows),)
    with on_device_of(x):
        launch(weighted_sum_forward_kernel, grid,
            x2d, weight, y,
            n_rows, n_cols,
            x2d.stride(0), x2d.stride(1), weight.stride(0), 1,
            BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols, NUM_STAGES=num_stages, WHOLE_ROWS=block_cols >= n_cols,
            VEC=width_hint(x2d, vec=vec), num_warps=num_warps,
        )
    return y


def backward_row_groups(n_rows, col_blocks, block_rows):
    """(rows_per_program, row_groups) of the backward: enough row groups for
    BACKWARD_PROGRAMS_PER_SM programs a multiprocessor, each a whole number of row tiles;
    fewer groups mean fewer partial rows to add up after."""
    wanted_groups = max(1, BACKWARD_PROGRAMS_PER_SM * multiprocessor_count() // col_blocks)
    rows_per_program = block_rows * cdiv(cdiv(n_rows, wanted_groups), block_rows)
    return rows_per_program, cdiv(n_rows, rows_per_program)


def weighted_sum_backward(x, weight, grad_y, tiles=None):
    """Launch the backward kernel; return (grad_x, grad_weight)."""
    x2d = as_rows(x)
    n_rows, n_cols = x2d.shape
    grad_y = grad_y if x.ndim == 2 else grad_y.reshape(n_rows)
    grad_x = torch.empty((n_rows, n_cols), device=x.device, dtype=x.dtype)
    if n_rows == 0:
        return shaped_like(grad_x, x), torch.zeros_like(weight)
    block_rows, block_cols, num_warps, num_stages = tiles or backward_tiles(int(n_cols), x.element_size())
    col_blocks = cdiv(n_cols, block_cols)
    rows_per_program, row_groups = backward_row_groups(n_rows, col_blocks, block_rows)
    partial = torch.empty((row_groups, n_cols), device=x.device, dtype=torch.float32)
    with on_device_of(x):
        launch(weighted_sum_backward_kernel, (col_blocks, row_groups),
            x2d, weight, grad_y, grad_x, partial,
            n_rows, n_cols, rows_per_program,
            x2d.stride(0), x2d.stride(1), weight.stride(0), grad_y.stride(0),
            grad_x.stride(0), grad_x.stride(1), partial.stride(0),
            BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols, NUM_STAGES=num_stages,
            VEC=width_hint(x2d, grad_x), num_warps=num_warps,
        )
        grad_weight = sum_partial_rows(partial, weight.dtype)
    return shaped_like(grad_x, x), grad_weight


# -------------------------------------------------------------------- custom operator
# One unit for torch.compile and for eager autograd (core.operator): torch.compile traces
# the operators course_lib::weighted_sum and course_lib::weighted_sum_backward, inductor
# launching their kernels from its own code; eager calls take an autograd.Function over
# the same launchers, or, when no gradient is wanted, the bare forward.


def _backward(x: torch.Tensor, weight: torch.Tensor, grad_y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return weighted_sum_backward(x, weight, grad_y)


def _save_inputs(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _gradients(ctx, backward, grad_y):
    return backward(*ctx.saved_tensors, grad_y)


def _check_backward(x, weight, grad_y):
    _check_inputs("weighted_sum_backward", x, weight)
    check_like("weighted_sum_backward", "grad_y", grad_y, x.shape[:-1], x)


@differentiable_op(
    "weighted_sum", backward=_backward, save=_save_inputs, gradients=_gradients,
    check=lambda x, weight: _check_inputs("weighted_sum", x, weight), check_backward=_check_backward,
    differentiable={"x": 0, "weight": 1},
)
def WEIGHTED_SUM(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return weighted_sum_forward(x, weight)


# ------------------------------------------------------------------------------ public


def weighted_sum(x, weight):
    """``(x * weight).sum(-1)`` with Triton kernels, differentiable in both arguments.

    Accumulates in float32. float64 inputs (on any device) are computed by the PyTorch
    reference instead, differentiable to any order (``torch.autograd.gradcheck``).

    Args:
        x (Tensor): float32, float16, bfloat16 or float64, any strides.
        weight (Tensor): the weights, of x's dtype and device (``x @ weight`` refuses
            mixed dtypes too: cast one).

    Shape:
        - x: (..., D)
        - weight: (D,)
        - Output: x.shape[:-1]

    Returns:
        Tensor: the weighted sums, in x's dtype.

    Example::

        >>> x, weight = torch.randn(4, 8), torch.randn(8)
        >>> weighted_sum(x, weight).shape
        torch.Size([4])
    """
    plain = plain_inputs(x, weight)
    _check_inputs("weighted_sum", x, weight, PUBLIC_DTYPES, plain)
    if not plain and runs_reference(x, weight):
        return by_reference(references.weighted_sum, x, weight)
    return WEIGHTED_SUM(x, weight)
