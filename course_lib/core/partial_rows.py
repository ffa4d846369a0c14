"""The first stage of a deterministic column sum: one program's partial row.

Chapter 3 finishes this stage three ways (atomics, a lock, a second kernel). The stage
itself is Exercise 3.3, so the chapter imports it from here rather than printing it.
"""

import triton
import triton.language as tl


@triton.jit
def program_partial_row(x_ptr, n_rows, n_cols, stride_row, rows_per_program, cols,
                        BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    """The sum over this program's range of rows of the columns ``cols``, in float32."""
    first_row = tl.program_id(0) * rows_per_program
    last_row = tl.minimum(first_row + rows_per_program, n_rows)
    acc = tl.zeros((BLOCK_ROWS, BLOCK_COLS), dtype=tl.float32)
    for row_start in range(first_row, last_row, BLOCK_ROWS):
        rows = row_start + tl.arange(0, BLOCK_ROWS)
        mask = (rows < last_row)[:, None] & (cols < n_cols)[None, :]
        acc += tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_row + cols[None, :], mask=mask, other=0.0)
    return tl.sum(acc, axis=0)
