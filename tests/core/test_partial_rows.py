import pytest
import torch
import triton
import triton.language as tl

from course_lib.core.partial_rows import program_partial_row
from course_lib.core.runtime import DEVICE


@triton.jit
def _partial_rows_kernel(x_ptr, out_ptr, n_rows, n_cols, stride_row, rows_per_program,
                         BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    cols = tl.arange(0, BLOCK_COLS)
    partial = program_partial_row(x_ptr, n_rows, n_cols, stride_row, rows_per_program, cols, BLOCK_ROWS, BLOCK_COLS)
    tl.store(out_ptr + tl.program_id(0) * n_cols + cols, partial, mask=cols < n_cols)


@pytest.mark.parametrize("n_rows, n_cols, rows_per_program", [(1, 1, 1), (10, 5, 3), (37, 20, 8)])
def test_each_program_sums_its_own_range_of_rows(n_rows, n_cols, rows_per_program):
    x = torch.randn(n_rows, n_cols, device=DEVICE)
    n_programs = triton.cdiv(n_rows, rows_per_program)
    out = torch.full((n_programs, n_cols), float("nan"), device=DEVICE)
    _partial_rows_kernel[(n_programs,)](x, out, n_rows, n_cols, x.stride(0), rows_per_program,
                                        BLOCK_ROWS=4, BLOCK_COLS=triton.next_power_of_2(n_cols))
    expected = torch.stack([x[p * rows_per_program:(p + 1) * rows_per_program].double().sum(0)
                            for p in range(n_programs)])
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
