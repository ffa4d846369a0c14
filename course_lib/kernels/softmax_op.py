"""Softmax over the last dimension, plain or causal: y = exp(x - max) / sum(exp(x - max)).

Chapter 2. The causal version takes x of shape (..., n, n), one matrix of attention
scores per leading index, and lets query row i see only keys j <= i: the keys above
the diagonal are never read and their outputs are exactly 0. It is a rewrite of
PaLM-pytorch's Triton causal softmax, whose mask ``col > row % n_cols`` silently
assumed square input; here a non-square input is an error unless the caller says
where its diagonal lies (``diagonal``: query i sees keys j <= i + diagonal).

A row whose every visible key is -inf (nothing to attend to) gives zeros and a zero
gradient instead of NaN. A NaN (or +inf) among the visible keys makes the row NaN, as
in PyTorch; its entries above the diagonal may then be NaN too. Whatever lies above the
diagonal of x, NaN included, is never read.

Read top to bottom: the Triton kernels (rows that fit in one block, then a looped
online softmax for wider rows, each forward and backward), the host launchers that
pick tiles and grids, the ``torch.autograd.Function``, and the public ``softmax``
and ``causal_softmax``.
"""

import functools
from typing import Optional

import torch
import triton
import triton.language as tl

from ..core import references
from ..core.operator import differentiable_op
from ..core.plans import LaunchPlan, TunedOn, warps_for
from ..core.runtime import cdiv, launch, multiprocessor_count, next_power_of_2
from ..core.validation import (FLOAT_DTYPES, INT32_LIMIT, PUBLIC_DTYPES, check_anchor, check_index_range, check_like,
                               check_tensor, on_device_of, plain_inputs, runs_reference, by_reference,
                               autocast_as_float32_ops)

# Causal loads fetch keys up to the diagonal rounded up to this many columns: a load
# mask that is constant over aligned groups of 16 lets Triton issue 16-byte vector
# loads. The few keys fetched past the diagonal are masked out in registers.
FETCH_GROUP = tl.constexpr(16)
# exp(t) = exp2(t * log2(e)). tl.exp2 compiles to one MUFU.EX2 instruction; tl.exp to
# that plus a multiply and three more instructions that keep denormal results, which
# a softmax does not need. In 16-bit types the forward is bound by instructions, not
# bytes, so every instruction saved a value shows in its speed.
LOG2E = tl.constexpr(1.4426950408889634)

# ---------------------------------------------------------------------------- kernels


@triton.jit
def _row_offsets(rows, rows_per_matrix, stride_matrix, stride_row):
    """Offsets of ``rows`` in a (matrices, rows_per_matrix, columns) view, in 64 bits:
    rows * stride can pass 2**31 on large inputs."""
    matrix = tl.cast(rows // rows_per_matrix, tl.int64)
    row_in_matrix = tl.cast(rows % rows_per_matrix, tl.int64)
    return matrix * stride_matrix + row_in_matrix * stride_row


@triton.jit
def key_masks(rows, cols, rows_per_matrix, n_cols, diagonal, CAUSAL: tl.constexpr):
    """(visible, fetch) for keys ``cols`` of query ``rows`` (broadcast against each
    other): visible keys take part in the softmax, fetched keys are loaded. A causal
    query row i sees keys 0..i + diagonal; it fetches up to there rounded up to
    FETCH_GROUP."""
    in_row = cols < n_cols
    if CAUSAL:
        last_key = rows % rows_per_matrix + diagonal
        fetch_end = (last_key + FETCH_GROUP) // FETCH_GROUP * FETCH_GROUP
        return in_row & (cols <= last_key), in_row & (cols < fetch_end)
    else:
        return in_row, in_row


@triton.jit
def _key_end(row, rows_per_matrix, n_cols, diagonal, CAUSAL: tl.constexpr):
    """One past the last key that query ``row`` sees (0 when it sees none)."""
    if CAUSAL:
        return tl.minimum(tl.maximum(row % rows_per_matrix + diagonal + 1, 0), n_cols)
    else:
        return n_cols


@triton.jit
def hide_fetched_keys(values, visible, hidden_value, CAUSAL: tl.constexpr):
    """``hidden_value`` at keys fetched but not visible: causal keys past the diagonal
    that share its FETCH_GROUP. Without a causal mask every fetched key is visible and
    the loads' ``other`` already covers the row's end, so no select is spent: in the
    plain forward it would cost most where rows are short and instructions set the
    pace."""
    if CAUSAL:
        values = tl.where(visible, values, hidden_value)
    return values


@triton.jit
def softmax_of_rows(
    x_ptr, y_ptr, rows, row_mask, rows_per_matrix, n_cols, diagonal,
    stride_x_matrix, stride_x_row, stride_x_col, stride_y_row,
    CAUSAL: tl.constexpr, BLOCK_COLS: tl.constexpr, ROW_BLOCK_COLS: tl.constexpr,
):
    """Normalise ``rows`` whose visible keys all lie in the first BLOCK_COLS columns;
    columns BLOCK_COLS .. ROW_BLOCK_COLS, all hidden, get zeros without being read."""
    cols = tl.arange(0, BLOCK_COLS)
    visible, fetch = key_masks(rows[:, None], cols[None, :], rows_per_matrix, n_cols, diagonal, CAUSAL)
    x_offsets = (_row_offsets(rows, rows_per_matrix, stride_x_matrix, stride_x_row)[:, None]
                 + cols.to(tl.int64)[None, :] * stride_x_col)
    # Masked-off lanes fetch nothing: of the upper triangle, only the keys that share
    # a FETCH_GROUP with the diagonal are read.
    x = tl.load(x_ptr + x_offsets, mask=row_mask & fetch, other=float("-inf")).to(tl.float32)
    x = hide_fetched_keys(x, visible, float("-inf"), CAUSAL)

    row_max = tl.max(x, axis=1)
    # A row with no finite visible key has max -inf: shift by 0 instead, so that exp
    # gives 0 rather than exp(-inf - -inf) = NaN; its sum is then 0, and dividing by
    # 1 instead leaves the row all zeros.
    shift = tl.where(row_max == float("-inf"), 0.0, row_max)
    numerator = tl.exp2((x - shift[:, None]) * LOG2E)
    total = tl.sum(numerator, axis=1)
    inverse_total = 1.0 / tl.where(total == 0.0, 1.0, total)
    # Hidden keys have numerator exp2(-inf) = 0, so y is 0 there without a select. One
    # (on `visible`, or on numerator == 0) would keep `visible` in registers across both
    # reductions, and in bfloat16 registers and instructions set the pace.
    y = numerator * inverse_total[:, None]
    y_row_ptrs = y_ptr + rows.to(tl.int64)[:, None] * stride_y_row
    tl.store(y_row_ptrs + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=row_mask & (cols < n_cols)[None, :])
    for start in tl.static_range(BLOCK_COLS, ROW_BLOCK_COLS, BLOCK_COLS):
        hidden_cols = start + cols
        tl.store(y_row_ptrs + hidden_cols[None, :], tl.zeros((1, BLOCK_COLS), y_ptr.dtype.element_ty),
                 mask=row_mask & (hidden_cols < n_cols)[None, :])


@triton.jit
def softmax_forward_kernel(
    x_ptr, y_ptr,
    n_rows, rows_per_matrix, n_cols, diagonal,
    stride_x_matrix, stride_x_row, stride_x_col, stride_y_row,
    CAUSAL: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr,
):
    """One program normalises BLOCK_ROWS whole rows held in registers (n_cols <= BLOCK_COLS).

    Causal queries in the first half of a square matrix see only the first half of the
    keys (with a diagonal, those whose last key lies in the first half of the block). A
    program holding only such rows works on a block half as wide and writes zeros to the
    rest: a quarter of all the arithmetic is saved, and in 16-bit types
    the arithmetic, not the bytes, sets the pace (see LOG2E). In float32, bound by
    bytes, it changes nothing.
    """
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_mask = (rows < n_rows)[:, None]
    if CAUSAL and BLOCK_COLS >= 2 * FETCH_GROUP:
        last_key = tl.max(tl.where(rows < n_rows, rows % rows_per_matrix, 0), axis=0) + diagonal
        if last_key < BLOCK_COLS // 2:
            softmax_of_rows(x_ptr, y_ptr, rows, row_mask, rows_per_matrix, n_cols, diagonal,
                          stride_x_matrix, stride_x_row, stride_x_col, stride_y_row,
                          CAUSAL, BLOCK_COLS // 2, BLOCK_COLS)
        else:
            softmax_of_rows(x_ptr, y_ptr, rows, row_mask, rows_per_matrix, n_cols, diagonal,
                          stride_x_matrix, stride_x_row, stride_x_col, stride_y_row,
                          CAUSAL, BLOCK_COLS, BLOCK_COLS)
    else:
        softmax_of_rows(x_ptr, y_ptr, rows, row_mask, rows_per_matrix, n_cols, diagonal,
                      stride_x_matrix, stride_x_row, stride_x_col, stride_y_row,
                      CAUSAL, BLOCK_COLS, BLOCK_COLS)


@triton.jit
def softmax_backward_kernel(
    y_ptr, grad_y_ptr, grad_x_ptr, anchor_ptr,  # anchor: never read (see softmax_backward)
    n_rows, rows_per_matrix, n_cols, diagonal,
    stride_y_row, stride_grad_y_matrix, stride_grad_y_row, stride_grad_y_col, stride_grad_x_row,
    CAUSAL: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr,
):
    """grad_x = y * (grad_y - sum(y * grad_y)) for BLOCK_ROWS whole rows a program."""
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_COLS)
    row_mask = (rows < n_rows)[:, None]
    visible, fetch = key_masks(rows[:, None], cols[None, :], rows_per_matrix, n_cols, diagonal, CAUSAL)
    rows64 = rows.to(tl.int64)[:, None]
    y = tl.load(y_ptr + rows64 * stride_y_row + cols[None, :], mask=row_mask & fetch, other=0.0)
    grad_y_offsets = (_row_offsets(rows, rows_per_matrix, stride_grad_y_matrix, stride_grad_y_row)[:, None]
                      + cols.to(tl.int64)[None, :] * stride_grad_y_col)
    grad_y = tl.load(grad_y_ptr + grad_y_offsets, mask=row_mask & fetch, other=0.0)
    y = y.to(tl.float32)
    # Fetched keys past the diagonal are dropped: grad_y there may hold anything.
    grad_y = hide_fetched_keys(grad_y.to(tl.float32), visible, 0.0, CAUSAL)

    dot = tl.sum(y * grad_y, axis=1)
    # No select, as in the forward: at hidden keys y = 0 (the forward wrote it) and
    # grad_y = 0 (zeroed above), so grad_x is 0 there.
    grad_x = y * (grad_y - dot[:, None])
    tl.store(grad_x_ptr + rows64 * stride_grad_x_row + cols[None, :], grad_x.to(grad_x_ptr.dtype.element_ty),
             mask=row_mask & (cols < n_cols)[None, :])


@triton.jit
def softmax_forward_looped_kernel(
    x_ptr, y_ptr,
    n_rows, rows_per_matrix, n_cols, diagonal,
    stride_x_matrix, stride_x_row, stride_x_col, stride_y_row,
    CAUSAL: tl.constexpr, BLOCK_COLS: tl.constexpr,
):
    """For rows wider than a block: each row in two passes over tiles.

    Pass 1 is an online softmax: it keeps the running max and, per lane, a running
    sum of exp(x - max), rescaling the sums whenever the max grows. Pass 2 writes
    exp(x - max) / sum. A causal row stops at its diagonal; the tiles right of it
    are never read, only filled with zeros. Programs take rows in turn (a persistent
    grid, see looped_grid).
    """
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        x_row_ptr = x_ptr + _row_offsets(row, rows_per_matrix, stride_x_matrix, stride_x_row)
        y_row_ptr = y_ptr + tl.cast(row, tl.int64) * stride_y_row
        key_end = _key_end(row, rows_per_matrix, n_cols, diagonal, CAUSAL)

        running_max = tl.full((), float("-inf"), tl.float32)
        sums = tl.zeros((BLOCK_COLS,), dtype=tl.float32)
        for start in range(0, key_end, BLOCK_COLS):
            cols = start + tl.arange(0, BLOCK_COLS)
            visible, fetch = key_masks(row, cols, rows_per_matrix, n_cols, diagonal, CAUSAL)
            # evict_last: pass 2 reads the row again, so keep it in L2 while it fits.
            x = tl.load(x_row_ptr + cols.to(tl.int64) * stride_x_col, mask=fetch, other=float("-inf"),
                        eviction_policy="evict_last").to(tl.float32)
            x = hide_fetched_keys(x, visible, float("-inf"), CAUSAL)
            new_max = tl.maximum(running_max, tl.max(x, axis=0))
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)  # no NaN, as in the one-block kernel
            sums = sums * tl.exp2((running_max - shift) * LOG2E) + tl.exp2((x - shift) * LOG2E)
            running_max = new_max
        total = tl.sum(sums, axis=0)
        shift = tl.where(running_max == float("-inf"), 0.0, running_max)
        inverse_total = 1.0 / tl.where(total == 0.0, 1.0, total)

        # Pass 2 walks the tiles last to first: the tiles pass 1 read last are the
        # likeliest to be still in L2.
        n_tiles = tl.cdiv(key_end, BLOCK_COLS)
        for tile in range(0, n_tiles):
            cols = (n_tiles - 1 - tile) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
            visible, fetch = key_masks(row, cols, rows_per_matrix, n_cols, diagonal, CAUSAL)
            x = tl.load(x_row_ptr + cols.to(tl.int64) * stride_x_col, mask=fetch, other=float("-inf"),
                        eviction_policy="evict_first").to(tl.float32)
            x = hide_fetched_keys(x, visible, float("-inf"), CAUSAL)
            y = tl.exp2((x - shift) * LOG2E) * inverse_total  # 0 at hidden keys, as above
            tl.store(y_row_ptr + cols, y.to(y_ptr.dtype.element_ty), mask=cols < n_cols,
                     eviction_policy="evict_first")
        for start in range(n_tiles * BLOCK_COLS, n_cols, BLOCK_COLS):
            cols = start + tl.arange(0, BLOCK_COLS)
            tl.store(y_row_ptr + cols, tl.zeros((BLOCK_COLS,), y_ptr.dtype.element_ty), mask=cols < n_cols)


@triton.jit
def softmax_backward_looped_kernel(
    y_ptr, grad_y_ptr, grad_x_ptr, anchor_ptr,  # anchor: never read (see softmax_backward)
    n_rows, rows_per_matrix, n_cols, diagonal,
    stride_y_row, stride_grad_y_matrix, stride_grad_y_row, stride_grad_y_col, stride_grad_x_row,
    CAUSAL: tl.constexpr, BLOCK_COLS: tl.constexpr,
):
    """For rows wider than a block: pass 1 sums y * grad_y over tiles, pass 2 writes grad_x."""
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        y_row_ptr = y_ptr + tl.cast(row, tl.int64) * stride_y_row
        grad_y_row_ptr = grad_y_ptr + _row_offsets(row, rows_per_matrix, stride_grad_y_matrix, stride_grad_y_row)
        grad_x_row_ptr = grad_x_ptr + tl.cast(row, tl.int64) * stride_grad_x_row
        key_end = _key_end(row, rows_per_matrix, n_cols, diagonal, CAUSAL)

        partial_dots = tl.zeros((BLOCK_COLS,), dtype=tl.float32)
        for start in range(0, key_end, BLOCK_COLS):
            cols = start + tl.arange(0, BLOCK_COLS)
            visible, fetch = key_masks(row, cols, rows_per_matrix, n_cols, diagonal, CAUSAL)
            y = tl.load(y_row_ptr + cols, mask=fetch, other=0.0, eviction_policy="evict_last")
            grad_y = tl.load(grad_y_row_ptr + cols.to(tl.int64) * stride_grad_y_col, mask=fetch, other=0.0,
                             eviction_policy="evict_last")
            partial_dots += hide_fetched_keys(y.to(tl.float32) * grad_y.to(tl.float32), visible, 0.0, CAUSAL)
        dot = tl.sum(partial_dots, axis=0)

        n_tiles = tl.cdiv(key_end, BLOCK_COLS)
        for tile in range(0, n_tiles):  # last to first, as in the forward
            cols = (n_tiles - 1 - tile) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
            visible, fetch = key_masks(row, cols, rows_per_matrix, n_cols, diagonal, CAUSAL)
            y = tl.load(y_row_ptr + cols, mask=fetch, other=0.0, eviction_policy="evict_first")
            grad_y = tl.load(grad_y_row_ptr + cols.to(tl.int64) * stride_grad_y_col, mask=fetch, other=0.0,
                             eviction_policy="evict_first")
            grad_x = hide_fetched_keys(y.to(tl.float32) * (grad_y.to(tl.float32) - dot), visible, 0.0, CAUSAL)
            tl.store(grad_x_row_ptr + cols, grad_x.to(grad_x_ptr.dtype.element_ty), mask=cols < n_cols,
                     eviction_policy="evict_first")
        for start in range(n_tiles * BLOCK_COLS, n_cols, BLOCK_COLS):
            cols = start + tl.arange(0, BLOCK_COLS)
            tl.store(grad_x_row_ptr + cols, tl.zeros((BLOCK_COLS,), grad_x_ptr.dtype.element_ty),
                     mask=cols < n_cols)


# -------------------------------------------------------------------------- launchers

# Rows up to this many columns are held whole in registers, one block a row; wider
# rows take the looped kernels. At 8 warps that is 32 values a thread.
SINGLE_BLOCK_MAX_COLS = 8192
# The causal backward in 16-bit types takes the looped kernels from this many columns
# (see backward_tiles).
LOOPED_CAUSAL_BACKWARD_MIN_COLS = 4096
# Programs of the looped kernels a multiprocessor, for rows wider than a block and for
# rows that would fit one; see looped_grid.
LOOPED_PROGRAMS_PER_SM = 2
SHORT_ROW_LOOPED_PROGRAMS_PER_SM = 32


# The plans below were chosen by this sweep:
TUNED_ON = TunedOn("NVIDIA H200", "3.6.0", "benchmarks/tune_softmax.py")


def _looped_tiles(n_cols):
    """Tiles of a quarter of the row, at most 16384 values, a warp for every 256 values."""
    block_cols = min(16384, next_power_of_2(n_cols) // 4)
    return LaunchPlan(1, block_cols, warps_for(block_cols, 256, max_warps=32))


def row_tiles(n_cols, element_size):
    """The LaunchPlan of rows of ``n_cols``, the same for the forward and the backward.

    The best of benchmarks/tune_softmax.py's sweep:
    * rows up to SINGLE_BLOCK_MAX_COLS sit whole in one block, one row a program
      once rows reach 1024 values (short rows share a program); about 1024 values a
      warp, but at least 4 warps in float32 and 2 in 16-bit types;
    * wider rows loop over tiles of a quarter of the row (_looped_tiles).
    """
    if n_cols > SINGLE_BLOCK_MAX_COLS:
        return _looped_tiles(n_cols)
    block_cols = next_power_of_2(n_cols)
    block_rows = max(1, 1024 // block_cols)
    return LaunchPlan(block_rows, block_cols,
                      warps_for(block_rows * block_cols, 1024, min_warps=4 if element_size == 4 else 2))


@functools.cache  # called on every launch: keep the host path short
def forward_tiles(n_cols, element_size):
    """The forward kernels' LaunchPlan.

    BLOCK_COLS >= n_cols selects the one-block kernel; a narrower BLOCK_COLS selects
    the looped kernel, which works on one row at a time (BLOCK_ROWS = 1).

    In 16-bit types rows of up to 1024 values pair up, two a program on the same
    warps: a program's fixed costs then count half as much. In float32, bound by
    bytes, it did not pay.
    """
    plan = row_tiles(n_cols, element_size)
    if element_size <= 2 and plan.block_cols <= 1024:
        return plan._replace(block_rows=2 * plan.block_rows)
    return plan


@functools.cache  # called on every launch: keep the host path short
def backward_tiles(n_cols, element_size, causal=False):
    """The backward kernels' LaunchPlan, as forward_tiles.

    One exception: the causal backward in 16-bit types, from
    LOOPED_CAUSAL_BACKWARD_MIN_COLS columns, takes the looped kernel even where a row
    fits one block. There the one-block kernel is bound by its arithmetic, half of it
    spent on the masked triangle; the looped kernel stops each row at its diagonal.
    In float32, bound by bytes, one block stays ahead.
    """
    if causal and element_size <= 2 and LOOPED_CAUSAL_BACKWARD_MIN_COLS <= n_cols <= SINGLE_BLOCK_MAX_COLS:
        return _looped_tiles(n_cols)
    return row_tiles(n_cols, element_size)


def looped_grid(n_rows, n_cols):
    """Grid of the looped kernels: programs taking rows in turn. Pass 2 of a row
    re-reads what pass 1 read; for rows wider than a block, a few programs a
    multiprocessor keep few rows in flight, so more of them is still in L2 (tens of
    megabytes) and need not come from memory again. Rows that would fit a block are
    small enough to stay in L2 with many in flight, and many programs hide latency."""
    programs_per_sm = LOOPED_PROGRAMS_PER_SM if n_cols > SINGLE_BLOCK_MAX_COLS else SHORT_ROW_LOOPED_PROGRAMS_PER_SM
    return (min(n_rows, programs_per_sm * multiprocessor_count()),)


def _as_matrices(x):
    """(x3d, its shape, its strides): x of shape (..., N) viewed as (matrices, rows a
    matrix, N), copying only when the leading dimensions cannot be merged. Keeping the last
    two dimensions apart lets kernels read any strides there, a transposed matrix
    included, without a copy. A 3-D x is passed as it is, and a 2-D x as one matrix,
    with the strides that view would have: a reshape costs host time on every call."""
    if x.ndim == 2:
        return x, (1, *x.shape), (x.shape[0] * x.stride(0), *x.stride())
    if x.ndim == 3:
        return x, x.shape, x.stride()
    x3d = x.reshape(-1, x.shape[-2] if x.ndim >= 2 else 1, x.shape[-1])
    return x3d, x3d.shape, x3d.stride()



def _check_index_headroom(n_rows, n_cols, block_rows, block_cols, causal):
    """Kernels count rows and columns in 32 bits, up to one tile past the end."""
    for name, size, tile in (("rows", n_rows, block_rows), ("columns", n_cols, block_cols)):
        if size > INT32_LIMIT - tile:
            raise ValueError(
                f"{'causal_softmax' if causal else 'softmax'}: {size} {name} are too many for 32-bit indices "
                f"with tiles of {block_rows} x {block_cols}; at most {INT32_LIMIT - tile}"
            )


def softmax_forward(x, causal, tiles=None, diagonal=0):
    """Launch a forward kernel; ``tiles``, a LaunchPlan, overrides forward_tiles'.
    A causal query i sees keys j <= i + ``diagonal``."""
    if x.numel() == 0:
        return torch.empty(x.shape, device=x.device, dtype=x.dtype)
    x3d, (n_matrices, rows_per_matrix, n_cols), x_strides = _as_matrices(x)
    n_rows = n_matrices * rows_per_matrix
    block_rows, block_cols, num_warps, _ = tiles or forward_tiles(int(n_cols), x.element_size())
    _check_index_headroom(n_rows, n_cols, block_rows, block_cols, causal)
    # The kernels get y itself (row-major: row r at r * n_cols), not a view of its rows:
    # traced by torch.compile, a view written by a kernel would make the output a view,
    # which a caller could not change in place.
    y = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    strides = (*x_strides, n_cols)
    with on_device_of(x):
        if block_cols >= n_cols:
            launch(softmax_forward_kernel, (cdiv(n_rows, block_rows),),
                x3d, y, n_rows, rows_per_matrix, n_cols, diagonal, *strides,
                CAUSAL=causal, BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols, num_warps=num_warps,
            )
        else:
            assert block_rows == 1, "the looped kernels work on one row at a time"
            launch(softmax_forward_looped_kernel, looped_grid(n_rows, n_cols),
                x3d, y, n_rows, rows_per_matrix, n_cols, diagonal, *strides,
                CAUSAL=causal, BLOCK_COLS=block_cols, num_warps=num_warps,
            )
    return y


def softmax_backward(y, grad_y, causal, tiles=None, diagonal=0, anchor=None):
    """Launch a backward kernel: grad_x from the forward's output y and grad_y (any
    strides), with the forward's ``causal`` and ``diagonal``. ``anchor``, a tensor the
    kernels take and never read, is for torch.compile (core.operator's ``anchored``)."""
    if y.numel() == 0:
        return torch.empty(y.shape, device=y.device, dtype=y.dtype)
    grad_y3d, (n_matrices, rows_per_matrix, n_cols), grad_y_strides = _as_matrices(grad_y)
    n_rows = n_matrices * rows_per_matrix
    block_rows, block_cols, num_warps, _ = tiles or backward_tiles(int(n_cols), y.element_size(), causal=causal)
    _check_index_headroom(n_rows, n_cols, block_rows, block_cols, causal)
    # y, as the forward wrote it, and grad_x are row-major: row r at r * n_cols. Passed
    # whole, as the forward passes y.
    grad_x = torch.empty(y.shape, device=y.device, dtype=y.dtype)
    strides = (n_cols, *grad_y_strides, n_cols)
    anchor = y if anchor is None else anchor
    with on_device_of(y):
        if block_cols >= n_cols:
            launch(softmax_backward_kernel, (cdiv(n_rows, block_rows),),
                y, grad_y3d, grad_x, anchor, n_rows, rows_per_matrix, n_cols, diagonal, *strides,
                CAUSAL=causal, BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols, num_warps=num_warps,
            )
        else:
            assert block_rows == 1, "the looped kernels work on one row at a time"
            launch(softmax_backward_looped_kernel, looped_grid(n_rows, n_cols),
                y, grad_y3d, grad_x, anchor, n_rows, rows_per_matrix, n_cols, diagonal, *strides,
                CAUSAL=causal, BLOCK_COLS=block_cols, num_warps=num_warps,
            )
    return grad_x


# -------------------------------------------------------------------- custom operator
# One unit for torch.compile and for eager autograd (core.operator; weighted_sum_op.py
# says how the paths differ). The backward needs only the output y.


def _backward(y: torch.Tensor, grad_y: torch.Tensor, causal: bool, diagonal: int,
              anchor: Optional[torch.Tensor] = None) -> torch.Tensor:
    return softmax_backward(y, grad_y, causal, diagonal=diagonal, anchor=anchor)


def _save_output(ctx, inputs, output):
    ctx.save_for_backward(output)
    ctx.causal, ctx.diagonal = inputs[1], inputs[2]


def _gradients(ctx, backward, grad_y):
    (y,) = ctx.saved_tensors
    return backward(y, grad_y, ctx.causal, ctx.diagonal), None, None


def _check_operator_input(x, causal, diagonal):
    op = "causal_softmax" if causal is True else "softmax"
    _check_input(op, x, causal, diagonal)
    _check_diagonal_range(op, x, causal, diagonal)


def _check_diagonal_range(op, x, causal, diagonal):
    """The operators take the diagonal as causal_softmax hands it over, clamped to the
    scores' bounds: beyond them the kernels' 32-bit index sums would overflow."""
    if causal and not -x.shape[-2] <= diagonal <= x.shape[-1]:
        raise ValueError(f"{op}: diagonal must be between -m and n for scores (..., m, n) = {tuple(x.shape)}, "
                         f"got {diagonal} (causal_softmax clamps any diagonal to that range)")


def _check_backward(y, grad_y, causal, diagonal, anchor=None):
    op = "softmax_backward"
    if anchor is not None:
        check_anchor(op, anchor, y)
    _check_input(op, y, causal, diagonal, name="y")
    _check_diagonal_range(op, y, causal, diagonal)
    if not y.is_contiguous():  # the backward kernels read y as the forward wrote it, row-major
        raise ValueError(f"{op}: y must be contiguous, as the forward wrote it; got strides {y.stride()}")
    check_like(op, "grad_y", grad_y, y.shape, y)


@differentiable_op(
    "softmax", backward=_backward, save=_save_output, gradients=_gradients,
    check=_check_operator_input, check_backward=_check_backward, differentiable={"x": 0}, anchored=True,
)
def SOFTMAX(x: torch.Tensor, causal: bool, diagonal: int) -> torch.Tensor:
    return softmax_forward(x, causal, diagonal=diagonal)


# ------------------------------------------------------------------------------ public


def _check_input(op, x, causal, diagonal=None, name="x", dtypes=FLOAT_DTYPES, plain=False):
    """``dtypes``: the kernels' (the operators' check), or the public functions', float64 too.
    ``plain``: what plain_inputs said of x."""
    if not isinstance(causal, bool):
        raise TypeError(f"{op}: causal must be True or False, got {causal!r}")
    # A SymInt: traced by torch.compile with dynamic shapes, diagonal=n - m is one.
    if diagonal is not None and (isinstance(diagonal, bool) or not isinstance(diagonal, (int, torch.SymInt))):
        raise TypeError(f"{op}: diagonal must be an int or None, got {diagonal!r}")
    check_tensor(op, name, x, dtypes=dtypes, min_ndim=2 if causal else 1, plain=plain)
    if causal and diagonal is None and x.shape[-1] != x.shape[-2]:
        raise ValueError(
            f"{op}: a causal mask needs square matrices in the last two dimensions, (..., n, n), "
            f"or a diagonal saying where the keys of non-square scores (..., m, n) start: "
            f"diagonal=n - m aligns the last query with the last key, diagonal=0 the first with the first; "
            f"got {name} of shape {tuple(x.shape)}"
        )
    n_cols = x.shape[-1]
    check_index_range(op, columns=n_cols, rows=x.numel() // n_cols if n_cols else 0)


def _check_dim(op, x, dim, causal):
    if isinstance(dim, bool):  # softmax(x, True): causal, before it became keyword-only
        raise TypeError(f"{op}: dim must be an int, got {dim!r}; causal is keyword-only: softmax(x, causal={dim!r})")
    if not isinstance(dim, int):
        raise TypeError(f"{op}: dim must be an int, got {type(dim).__name__} {dim!r}")
    if not -x.ndim <= dim < x.ndim:
        raise IndexError(f"{op}: dim must be in [{-x.ndim}, {x.ndim - 1}] for x of shape {tuple(x.shape)}, got {dim}")
    if causal and dim % x.ndim != x.ndim - 1:
        raise ValueError(f"{op}: a causal softmax runs over the last dimension (keys), so dim must be -1; got {dim}")


def softmax(x, dim=-1, *, causal=False):
    """``torch.softmax(x, dim)`` with Triton kernels, differentiable.

    Computes in float32 (float64 inputs, on any device, by the PyTorch reference,
    differentiable to any order). A row whose every visible entry is -inf gives zeros
    (and a zero gradient) instead of NaN. Another ``dim`` than the last is moved to the
    last axis and back (``movedim``, a view).

    Args:
        x (Tensor): float32, float16, bfloat16 or float64, any strides.
        dim (int): the dimension the softmax runs over; by default the last.
        causal (bool): keyword only. Then x is (..., n, n) and row i sees only columns
            j <= i, as in :func:`causal_softmax` (dim must then be -1).

    Shape:
        - x: (..., N), or (..., n, n) with ``causal=True``
        - Output: x's shape

    Returns:
        Tensor: the probabilities, of x's shape and dtype.

    Example::

        >>> x = torch.randn(4, 8)
        >>> softmax(x, dim=0).sum(0)  # ones
        >>> softmax(torch.randn(2, 5, 5), causal=True)[0, 0]  # [1, 0, 0, 0, 0]
    """
    op = "causal_softmax" if causal is True else "softmax"
    plain = plain_inputs(x)
    _check_input(op, x, causal, dtypes=PUBLIC_DTYPES, plain=plain)
    _check_dim(op, x, dim, causal)
    if not plain:
        (x,) = autocast_as_float32_ops(x)
    if dim % x.ndim != x.ndim - 1:
        return softmax(x.movedim(dim, -1)).movedim(-1, dim)
    if not plain and runs_reference(x):
        return by_reference(references.causal_softmax if causal else references.softmax, x)
    return SOFTMAX(x, causal, 0, error_name=op)


def causal_softmax(x, diagonal=None):
    """Softmax of attention scores x (..., m, n) where query i sees keys j <= i + diagonal.

    Without ``diagonal`` the scores must be square, (..., n, n), and query i sees keys
    j <= i. Non-square scores need it said which key is on a query's diagonal, as in
    ``torch.tril(diagonal=...)``: ``diagonal=n - m`` for m new queries after n - m
    earlier keys (the last query sees every key), ``diagonal=0`` for the top-left
    corner. A query that sees no key (i + diagonal < 0) gets zeros. Computes in float32
    (float64 inputs, on any device, by the PyTorch reference, differentiable to any order).

    Hidden entries (j > i + diagonal) take no part and come out exactly 0 (in a row
    made NaN by a NaN key, possibly NaN). They are not read either, apart from the few
    next to the diagonal that share its 16-element load (FETCH_GROUP).

    Args:
        x (Tensor): the scores, float32, float16, bfloat16 or float64, any strides.
        diagonal (int, optional): where the keys a query sees end, as in ``torch.tril``.

    Shape:
        - x: (..., n, n), or (..., m, n) with ``diagonal``
        - Output: x's shape

    Returns:
        Tensor: the attention weights, of x's shape and dtype.

    Example::

        >>> scores = torch.randn(2, 4, 6, 6)  # (batch, heads, queries, keys)
        >>> causal_softmax(scores)[0, 0, 0]  # [1, 0, 0, 0, 0, 0]
        >>> causal_softmax(torch.randn(2, 3, 6), diagonal=3).shape  # 3 new queries after 3 keys
        torch.Size([2, 3, 6])
    """
    plain = plain_inputs(x)
    _check_input("causal_softmax", x, True, diagonal, dtypes=PUBLIC_DTYPES, plain=plain)
    if not plain:
        (x,) = autocast_as_float32_ops(x)
    if not plain and runs_reference(x):
        return by_reference(references.causal_softmax, x, diagonal or 0)
    if not diagonal:  # None or 0: the square case, within any bounds
        return SOFTMAX(x, True, 0, error_name="causal_softmax")
    rows, cols = x.shape[-2:]
    # Beyond these bounds every key is hidden or visible: clamping keeps the kernels' 32-bit sums exact.
    # int(): traced with dynamic shapes the bound is a SymInt, and the operator takes an int
    # (torch.compile then specialises the graph on its value).
    return SOFTMAX(x, True, int(max(-rows, min(cols, diagonal))), error_name="causal_softmax")
