"""Exercise kernels with the usual mistakes, for the checkers' tests.

Run as a script, ``python tests/wrong_kernels.py CASE`` runs the checker of CASE's exercise
on CASE's kernel in a process of its own (a kernel writing outside its tensors must not take
the test runner down) and prints the checker's ExerciseError.
"""

import sys

import course_lib  # noqa: F401  (chooses the interpreter before triton is imported)
import torch
import triton
import triton.language as tl

from course_lib.teaching import exercises
from course_lib.teaching.checking import ExerciseError

# ------------------------------------------------------ Exercise 1.1: scale_columns


@triton.jit
def scale_columns_le_kernel(x_ptr, w_ptr, out_ptr, n_rows, n_cols, stride_x_row, stride_x_col, stride_out_row,
                            BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    mask = (rows < n_rows)[:, None] & (cols <= n_cols)[None, :]  # one column too many
    x = tl.load(x_ptr + rows[:, None] * stride_x_row + cols[None, :] * stride_x_col, mask=mask)
    w = tl.load(w_ptr + cols, mask=cols <= n_cols)
    tl.store(out_ptr + rows[:, None] * stride_out_row + cols[None, :], x * w[None, :], mask=mask)


@triton.jit
def scale_columns_no_mask_kernel(x_ptr, w_ptr, out_ptr, n_rows, n_cols, stride_x_row, stride_x_col, stride_out_row,
                                 BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    x = tl.load(x_ptr + rows[:, None] * stride_x_row + cols[None, :] * stride_x_col)
    w = tl.load(w_ptr + cols)
    tl.store(out_ptr + rows[:, None] * stride_out_row + cols[None, :], x * w[None, :])


@triton.jit
def scale_columns_no_row_mask_kernel(x_ptr, w_ptr, out_ptr, n_rows, n_cols, stride_x_row, stride_x_col,
                                     stride_out_row, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    mask = (cols < n_cols)[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x_row + cols[None, :] * stride_x_col, mask=mask)
    w = tl.load(w_ptr + cols, mask=cols < n_cols)
    tl.store(out_ptr + rows[:, None] * stride_out_row + cols[None, :], x * w[None, :], mask=mask)


@triton.jit
def scale_columns_no_col_stride_kernel(x_ptr, w_ptr, out_ptr, n_rows, n_cols, stride_x_row, stride_x_col,
                                       stride_out_row, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x_row + cols[None, :], mask=mask)  # stride_x_col ignored
    w = tl.load(w_ptr + cols, mask=cols < n_cols)
    tl.store(out_ptr + rows[:, None] * stride_out_row + cols[None, :], x * w[None, :], mask=mask)


@triton.jit
def scale_columns_n_cols_stride_kernel(x_ptr, w_ptr, out_ptr, n_rows, n_cols, stride_x_row, stride_x_col,
                                       stride_out_row, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    x = tl.load(x_ptr + rows[:, None] * n_cols + cols[None, :] * stride_x_col, mask=mask)  # n_cols as row stride
    w = tl.load(w_ptr + cols, mask=cols < n_cols)
    tl.store(out_ptr + rows[:, None] * stride_out_row + cols[None, :], x * w[None, :], mask=mask)


def scale_columns_with(kernel):
    def scale_columns(x, w, block_rows=16, block_cols=32):
        out = torch.full_like(x, float("nan"), memory_format=torch.contiguous_format)
        grid = (triton.cdiv(x.shape[0], block_rows), triton.cdiv(x.shape[1], block_cols))
        kernel[grid](x, w, out, x.shape[0], x.shape[1], x.stride(0), x.stride(1), out.stride(0),
                     BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols)
        return out
    return scale_columns


# ------------------------------------------------------------ Exercise 1.3: column_sum


@triton.jit
def column_sum_no_row_mask_kernel(partial_ptr, out_ptr, n_rows, n_cols, stride_row,
                                  BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    acc = tl.zeros((BLOCK_COLS,), dtype=tl.float32)
    for row_start in range(0, n_rows, BLOCK_ROWS):
        rows = row_start + tl.arange(0, BLOCK_ROWS)
        mask = (cols < n_cols)[None, :] & (rows >= 0)[:, None]  # the rows past the last one are read
        acc += tl.sum(tl.load(partial_ptr + rows[:, None] * stride_row + cols[None, :], mask=mask, other=0.0), axis=0)
    tl.store(out_ptr + cols, acc, mask=cols < n_cols)


def column_sum(partial, block_rows=8, block_cols=32):
    out = torch.full((partial.shape[1],), float("nan"), device=partial.device)
    column_sum_no_row_mask_kernel[(triton.cdiv(partial.shape[1], block_cols),)](
        partial, out, partial.shape[0], partial.shape[1], partial.stride(0),
        BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols)
    return out


# ---------------------------------------------------------- Exercise 2.1: softmax_rows


@triton.jit
def softmax_rows_kernel(x_ptr, y_ptr, n_rows, n_cols, stride_x_row, stride_y_row, BLOCK_ROWS: tl.constexpr,
                        BLOCK_COLS: tl.constexpr, MISTAKE: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_COLS)
    if MISTAKE == "rows <= n_rows":
        mask = (rows <= n_rows)[:, None] & (cols < n_cols)[None, :]
    else:
        mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    row_stride = n_cols if MISTAKE == "n_cols as row stride" else stride_x_row
    padding = 0.0 if MISTAKE == "padding loaded as 0" else float("-inf")
    x = tl.load(x_ptr + rows[:, None] * row_stride + cols[None, :], mask=mask, other=padding)
    if MISTAKE == "no max subtracted":
        numerator = tl.exp(x)
    elif MISTAKE == "axis 0":
        numerator = tl.exp(x - tl.max(x, axis=0)[None, :])
    else:
        numerator = tl.exp(x - tl.max(x, axis=1)[:, None])
    if MISTAKE == "axis 0":
        y = numerator / tl.sum(numerator, axis=0)[None, :]
    else:
        y = numerator / tl.sum(numerator, axis=1)[:, None]
    tl.store(y_ptr + rows[:, None] * stride_y_row + cols[None, :], y, mask=mask)


def softmax_rows_with(mistake):
    def softmax_rows(x, block_rows=4):
        n_rows, n_cols = x.shape
        y = torch.full((n_rows, n_cols), float("nan"), device=x.device)
        softmax_rows_kernel[(triton.cdiv(n_rows, block_rows),)](
            x, y, n_rows, n_cols, x.stride(0), y.stride(0),
            BLOCK_ROWS=block_rows, BLOCK_COLS=triton.next_power_of_2(n_cols), MISTAKE=mistake)
        return y
    return softmax_rows


# -------------------------------------------------------- Exercise 3.1: layernorm_rows


@triton.jit
def layernorm_rows_unmasked_stats_kernel(x_ptr, gamma_ptr, beta_ptr, y_ptr, mean_ptr, rstd_ptr, n_rows, n_cols, eps,
                                         stride_x_row, stride_y_row, BLOCK_ROWS: tl.constexpr,
                                         BLOCK_COLS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_COLS)
    col_mask = cols < n_cols
    mask = (rows < n_rows)[:, None] & col_mask[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x_row + cols[None, :], mask=mask, other=0.0)
    mean = tl.sum(x, axis=1) / n_cols
    centred = tl.where(mask, x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1) / n_cols + eps)
    gamma = tl.load(gamma_ptr + cols, mask=col_mask, other=0.0)
    beta = tl.load(beta_ptr + cols, mask=col_mask, other=0.0)
    tl.store(y_ptr + rows[:, None] * stride_y_row + cols[None, :], centred * rstd[:, None] * gamma + beta, mask=mask)
    tl.store(mean_ptr + rows, mean)  # no row mask: the last program writes past the end
    tl.store(rstd_ptr + rows, rstd)


def layernorm_rows(x, gamma, beta, eps=1e-5, block_rows=4):
    n_rows, n_cols = x.shape
    y = torch.full((n_rows, n_cols), float("nan"), device=x.device)
    mean = torch.full((n_rows,), float("nan"), device=x.device)
    rstd = torch.full((n_rows,), float("nan"), device=x.device)
    layernorm_rows_unmasked_stats_kernel[(triton.cdiv(n_rows, block_rows),)](
        x, gamma, beta, y, mean, rstd, n_rows, n_cols, eps, x.stride(0), y.stride(0),
        BLOCK_ROWS=block_rows, BLOCK_COLS=triton.next_power_of_2(n_cols))
    return y, mean, rstd


# --------------------------------------------------- Exercise 3.3: column_partial_sums


@triton.jit
def column_partial_sums_no_row_mask_kernel(x_ptr, partial_ptr, n_rows, n_cols, rows_per_program, stride_x_row,
                                           stride_partial_row, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    program = tl.program_id(0)
    cols = tl.arange(0, BLOCK_COLS)
    col_mask = cols < n_cols
    first_row = program * rows_per_program
    last_row = tl.minimum(first_row + rows_per_program, n_rows)
    acc = tl.zeros((BLOCK_ROWS, BLOCK_COLS), dtype=tl.float32)
    for row_start in range(first_row, last_row, BLOCK_ROWS):
        rows = row_start + tl.arange(0, BLOCK_ROWS)
        mask = (rows >= 0)[:, None] & col_mask[None, :]  # rows past the program's range are read
        acc += tl.load(x_ptr + rows[:, None] * stride_x_row + cols[None, :], mask=mask, other=0.0)
    tl.store(partial_ptr + program * stride_partial_row + cols, tl.sum(acc, axis=0), mask=col_mask)


def column_partial_sums(x, n_programs, block_rows=4):
    n_rows, n_cols = x.shape
    rows_per_program = triton.cdiv(n_rows, n_programs)
    n_programs = triton.cdiv(n_rows, rows_per_program)
    partial = torch.full((n_programs, n_cols), float("nan"), device=x.device)
    column_partial_sums_no_row_mask_kernel[(n_programs,)](
        x, partial, n_rows, n_cols, rows_per_program, x.stride(0), partial.stride(0),
        BLOCK_ROWS=block_rows, BLOCK_COLS=triton.next_power_of_2(n_cols))
    return partial


# -------------------------------------------------- Exercise 4.3: row_logsumexp_of_min


@triton.jit
def row_logsumexp_of_min_le_kernel(s_ptr, a_ptr, out_ptr, n_cols, eps, stride_s_row, BLOCK_COLS: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_COLS)
    s = tl.load(s_ptr + row * stride_s_row + cols, mask=cols <= n_cols, other=float("-inf"))  # one lane too many
    a = tl.load(a_ptr + row)
    z = tl.minimum(s, -a) / eps
    z_max = tl.max(z, axis=0)
    tl.store(out_ptr + row, z_max + tl.log(tl.sum(tl.exp(z - z_max), axis=0)))


def row_logsumexp_of_min(s, a, eps):
    n_rows, n_cols = s.shape
    out = torch.full((n_rows,), float("nan"), device=s.device)
    row_logsumexp_of_min_le_kernel[(n_rows,)](s, a, out, n_cols, eps, s.stride(0),
                                              BLOCK_COLS=triton.next_power_of_2(n_cols))
    return out


# The kernels that reach outside their tensors: (checker, student's function).
OUT_OF_BOUNDS = {
    "1.1 cols <= n_cols": (exercises.check_scale_columns, scale_columns_with(scale_columns_le_kernel)),
    "1.1 no mask": (exercises.check_scale_columns, scale_columns_with(scale_columns_no_mask_kernel)),
    "1.1 no row mask": (exercises.check_scale_columns, scale_columns_with(scale_columns_no_row_mask_kernel)),
    "1.1 n_cols as row stride": (exercises.check_scale_columns, scale_columns_with(scale_columns_n_cols_stride_kernel)),
    "1.3 no row mask": (exercises.check_column_sum, column_sum),
    "2.1 rows <= n_rows": (exercises.check_softmax_rows, softmax_rows_with("rows <= n_rows")),
    "2.1 n_cols as row stride": (exercises.check_softmax_rows, softmax_rows_with("n_cols as row stride")),
    "3.1 stats stored without row mask": (exercises.check_layernorm_rows, layernorm_rows),
    "3.3 no row mask": (exercises.check_column_partial_sums, column_partial_sums),
    "4.3 cols <= n_cols": (exercises.check_row_logsumexp_of_min, row_logsumexp_of_min),
}

if __name__ == "__main__":
    checker, student_function = OUT_OF_BOUNDS[sys.argv[1]]
    torch.manual_seed(int(sys.argv[2]))
    try:
        checker(student_function)
    except ExerciseError as error:
        print(f"ExerciseError: {error}")
    else:
        print("the checker passed")
