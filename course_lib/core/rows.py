"""Row helpers the kernels of chapters 1 and 3 share.

Every kernel of the course reads its input as rows: a tensor of shape (..., D) viewed
as (M, D). This module holds what more than one kernel module needs for that: the view
itself, how many neighbouring values of a row one load may take (and how to tell
Triton), and the deterministic column sum that finishes a reduction down the rows
(weighted sum's grad_weight, LayerNorm's grad_gamma and grad_beta).
"""

import torch
import triton
import triton.language as tl

from .runtime import cdiv, is_16_byte_aligned, launch, multiprocessor_count, next_power_of_2

# ---------------------------------------------------------------------------- kernels


@triton.jit
def known_multiple_of(value, VEC: tl.constexpr):
    """``value`` itself, which the launcher checked VEC divides, written so that Triton
    sees it is a multiple of VEC (``width_hint``)."""
    return value // VEC * VEC


@triton.jit
def column_sum_kernel(
    partial_ptr, out_ptr, n_partial_rows, n_cols, stride_partial_row,
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    """out[d] = sum_r partial[r, d], always in the same order: the second stage of a
    column sum whose first stage left one float32 partial row a program."""
    cols = tl.program_id(0) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    col_mask = cols < n_cols
    acc = tl.zeros((BLOCK_ROWS, BLOCK_COLS), dtype=tl.float32)
    for row_start in tl.range(0, n_partial_rows, BLOCK_ROWS, num_stages=NUM_STAGES):
        rows = row_start + tl.arange(0, BLOCK_ROWS)
        mask = (rows < n_partial_rows)[:, None] & col_mask[None, :]
        acc += tl.load(partial_ptr + rows[:, None] * stride_partial_row + cols[None, :], mask=mask, other=0.0)
    tl.store(out_ptr + cols, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=col_mask)


# -------------------------------------------------------------------------- launchers


def as_rows(x):
    """View x of shape (..., D) as (M, D) without copying when the strides allow it (x
    itself when it is 2-D: a reshape costs host time on every call)."""
    return x if x.ndim == 2 else x.reshape(-1, x.shape[-1])


def shaped_like(rows, x):
    """``rows``, an (M, D) or (M,) result for x of shape (..., D), as (..., D) or (...)."""
    if x.ndim == 2:
        return rows
    return rows.reshape(x.shape if rows.ndim == 2 else x.shape[:-1])


def vector_width(*rows):
    """How many neighbouring values of a row one load may take (up to 16 bytes), for the
    2-D views ``rows`` that a kernel reads or writes: the largest power of two that
    divides n_cols and every row stride. Rows must be contiguous and start 16-byte
    aligned, or it is 1."""
    if any(t.stride(1) != 1 or not is_16_byte_aligned(t) for t in rows):
        return 1
    n_cols = rows[0].shape[1]
    vec = 16 // rows[0].element_size()
    while n_cols % vec or any(t.stride(0) % vec for t in rows):
        vec //= 2
    return vec


def width_hint(*rows, vec=None):
    """VEC for the kernels' ``known_multiple_of``: what Triton must be told to load
    ``vector_width(*rows)`` values at once (``vec``, where the caller has it already).

    At each launch Triton notes which integer arguments are divisible by 16 and which
    pointers are 16-byte aligned, and compiles with those facts. At 1000 columns,
    though 1000 is a multiple of 8, it cannot prove that 8 neighbouring bfloat16 values
    start on a 16-byte boundary and lie all inside or all outside the mask, and loads
    them one at a time. The kernels rewrite n_cols and the row strides as
    ``known_multiple_of(n, VEC)``: the same numbers, now visibly multiples of VEC, and the
    loads are wide again. Where the width and every row stride are multiples of 16,
    Triton knows enough by itself, and VEC = 1 leaves the kernels exactly as they would
    be without the rewrite, which there only costs instructions.
    """
    if rows[0].shape[1] % 16 == 0 and all(t.stride(0) % 16 == 0 for t in rows):
        return 1
    return vector_width(*rows) if vec is None else vec


def column_sum_blocks(n_partial_rows, width):
    """(BLOCK_ROWS, BLOCK_COLS) of column_sum_kernel for partial rows (n_partial_rows, width)."""
    block_cols = max(16, min(64, next_power_of_2(cdiv(width, multiprocessor_count()))))
    return max(1, min(next_power_of_2(n_partial_rows), 4096 // block_cols)), block_cols


def sum_partial_rows(partial, dtype):
    """Column sums of the float32 partial rows, in a fixed order, cast to ``dtype``.

    Narrow column blocks, so that even a short row of sums spreads over the GPU, and
    the loop down the partial rows pipelined 3 deep (tiles of at most 16 KiB): a few
    programs walking the partial rows one after another would leave most of the GPU
    idle at the end of every backward.
    """
    n_partial_rows, width = partial.shape
    out = torch.empty(width, device=partial.device, dtype=dtype)
    block_rows, block_cols = column_sum_blocks(n_partial_rows, width)
    launch(column_sum_kernel, (cdiv(width, block_cols),),
        partial, out, n_partial_rows, width, partial.stride(0),
        BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols, NUM_STAGES=3,
    )
    return out
