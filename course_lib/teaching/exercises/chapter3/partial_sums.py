"""Exercise 3.3's checker: partial column sums, the first stage. Its program ranges and
per-program sums are exercise 3.4's too."""

import torch
import triton

from ....core.runtime import DEVICE, ON_GPU, multiprocessor_count
from ...checking import ExerciseError, compare
from ...student_kernels import kernel_runs, report_speed, require_kernel
from ..common import beyond_cases_runs, hidden_case, matches, random_size, say
from .shared import _rerun, _undefined_lanes_hint, _with_hint, _with_nan_rows


def _program_ranges(n_rows, n_programs):
    """(rows a program, the number of programs that get rows): every program but the last gets
    rows_per_program rows, and none is left without."""
    rows_per_program = triton.cdiv(n_rows, n_programs)
    return rows_per_program, triton.cdiv(n_rows, rows_per_program)


def launch_column_partial_sums(column_partial_sums_kernel, x, n_programs, out=None, block_rows=4):
    """How exercise 3.3's checker launches the kernel: program p owns rows p·R to
    min((p + 1)·R, M) - 1, R = cdiv(M, n_programs), and walks them ``block_rows`` at a time
    with whole rows (BLOCK_COLS >= N). ``out``, the (programs, N) partial rows, is filled
    with NaN when not given. Returns it."""
    n_rows, n_cols = x.shape
    rows_per_program, n_programs = _program_ranges(n_rows, n_programs)
    partial = _with_nan_rows(n_programs, n_cols) if out is None else out
    column_partial_sums_kernel[(n_programs,)](
        x, partial, n_rows, n_cols, rows_per_program, x.stride(0), partial.stride(0),
        BLOCK_ROWS=block_rows, BLOCK_COLS=triton.next_power_of_2(n_cols))
    return partial


def _program_sums(products, rows_per_program, block_rows=None, stop_at_n_rows=False):
    """Each program's column sums of float64 ``products``; with ``block_rows``, the sums a
    program makes when it masks its last tile with n_rows alone (reading into the next range)."""
    n_rows = products.shape[0]
    sums = []
    for start in range(0, n_rows, rows_per_program):
        stop = start + rows_per_program
        if stop_at_n_rows:
            stop = start + triton.cdiv(rows_per_program, block_rows) * block_rows
        sums.append(products[start:min(stop, n_rows)].sum(0))
    return torch.stack(sums)


def _partial_rows_hint(got, expected, products, rows_per_program, block_rows):
    """The usual mistake behind wrong partial rows, or None."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape or got.isnan().all():
        return None  # compare's message says it all
    got64 = got.detach().to("cpu", torch.float64)
    expected, products = expected.cpu(), products.cpu()
    tolerance = dict(rtol=1e-4, atol=1e-4 * rows_per_program ** 0.5)
    if matches(got64, _program_sums(products, rows_per_program, block_rows, stop_at_n_rows=True), **tolerance):
        return ("the rows of a program's last tile past its own range are added too, so they are counted twice "
                "(by this program and the next): mask the last tile with min((p + 1) * rows_per_program, n_rows), "
                "not only with n_rows")
    written = ~got64.isnan().any(dim=1)
    if (~written).any() and written.any():
        right_values = all(any(torch.allclose(row, want, **tolerance) for want in expected) for row in got64[written])
        if right_values:
            return ("some partial rows are never written while others hold a program's sum: program p stores its "
                    "sum as row p (partial_ptr + program * stride_partial_row), not at its first row's index or at "
                    "another program's")
    if not torch.allclose(got64.sum(0), expected.sum(0), rtol=1e-4, atol=1e-4 * products.shape[0] ** 0.5):
        return ("the partial rows do not add up to the column sums: some rows are counted twice or not at all; "
                "program p walks rows p * rows_per_program up to min((p + 1) * rows_per_program, n_rows)")
    return None


def check_column_partial_sums(column_partial_sums_kernel):
    """Exercise 3.3: ``column_partial_sums_kernel``, launched by :func:`launch_column_partial_sums`,
    writes the partial column sums of a 2-D float32 x: row p sums program p's range of rows."""
    name = "Exercise 3.3 (column_partial_sums_kernel)"
    kernel = require_kernel(name, column_partial_sums_kernel, "column_partial_sums_kernel")
    block_rows = 4
    cases = [(1, 1, 1), (8, 3, 2), (37, 17, 4), (100, 100, 7), (50, 33, 50), (20, 5, 1)]
    cases += hidden_case(lambda: (lambda m: (m, random_size(1, 60), random_size(1, m)))(random_size(1, 120)))
    inputs = [(torch.randn(m, n, device=DEVICE), p, None, "") for m, n, p in cases]
    wide = torch.randn(45, 40, device=DEVICE)
    inputs.append((wide[:, :29], 6, _with_nan_rows(6, 29, 32),
                   f", x = wide[:, :29] whose rows are {wide.stride(0)} elements apart (use stride_x_row), partial's "
                   "rows 32 elements apart (use stride_partial_row)"))
    for x, n_programs, out, note in inputs:
        n_rows, n_cols = x.shape
        rows_per_program, _ = _program_ranges(n_rows, n_programs)
        what = (f"{name}, x of shape {(n_rows, n_cols)}, n_programs={n_programs} ({rows_per_program} rows a "
                f"program, tiles of {block_rows}){note}")
        x64 = x.double()
        expected = _program_sums(x64, rows_per_program)
        runs = _partial_row_runs(name, launch_column_partial_sums, kernel, x, n_programs, out, block_rows)
        for how, got in runs:
            try:
                compare(f"{what}{', ' + how if how else ''}: partial (row p is program p's sum)", got, expected,
                        rtol=1e-5, atol=1e-5 * rows_per_program ** 0.5, show_picture=True)
            except ExerciseError as error:
                rerun = _rerun(name, launch_column_partial_sums, kernel, (x, n_programs), (block_rows,))
                hint = (_undefined_lanes_hint(rerun, out, (got,))
                        or _partial_rows_hint(got, expected, x64, rows_per_program, block_rows))
                raise _with_hint(error, hint, kernel, (got,)) from None
            if out is not None:
                out.fill_(float("nan"))
    for n_rows, n_cols, n_programs, why in [(4101, 5, 3, "more rows than any case above"),
                                            (10, 1500, 3, "more columns than any case above"),
                                            (300, 3, 150, "more programs than any case above")]:
        x = torch.randn(n_rows, n_cols, device=DEVICE)
        rows_per_program, n_partial = _program_ranges(n_rows, n_programs)
        expected = _program_sums(x.double(), rows_per_program)
        tolerance = dict(rtol=1e-5, atol=1e-5 * rows_per_program ** 0.5)
        beyond_cases_runs(name, f"x of shape {(n_rows, n_cols)}, n_programs={n_programs}, {why}",
                          launch_column_partial_sums, kernel, (x, n_programs),
                          lambda label, got: compare(f"{label}: partial", got, expected, **tolerance),
                          lambda: torch.randn(n_partial, n_cols, device=DEVICE) * rows_per_program ** 0.5)
    say(f"{name.split(' (')[0]} passed: {len(inputs)} shapes, from one row to ranges that end inside a tile, "
          "and strided x and partial.")
    _report_partial_sums_speed(name, kernel)


def _report_partial_sums_speed(name, kernel):
    """The student's first stage against torch's whole column sum, on 16384 rows of 1024 float32 values."""
    n_rows, n_cols = 16384, 1024
    n_bytes = n_rows * n_cols * 4  # x read; the partial rows are a few hundred
    if not ON_GPU:
        report_speed(name, None, n_bytes)
        return
    x = torch.randn(n_rows, n_cols, device=DEVICE)
    n_programs = 4 * multiprocessor_count()
    partial = torch.empty(_program_ranges(n_rows, n_programs)[1], n_cols, device=DEVICE)
    report_speed(name, lambda: launch_column_partial_sums(kernel, x, n_programs, partial, 8), n_bytes,
                 against=("torch's x.sum(0)", lambda: torch.sum(x, dim=0)),
                 advice="with few programs, each walks many tiles one after another: check that each tile's loads "
                        "are whole contiguous rows and that the accumulator stays a tile until the end (one "
                        "tl.sum after the loop, not one a tile)")


def _partial_row_runs(name, launch, kernel, *args):
    """kernel_runs, naming the usual reason when the kernel stores a vector of the wrong shape."""
    try:
        yield from kernel_runs(name, launch, kernel, *args)
    except ExerciseError as error:
        raise _with_shape_hint(error) from None


def _with_shape_hint(error):
    """An ExerciseError from a kernel that stored a vector of the wrong shape, with the usual reason."""
    message = str(error)
    if "Expected pointer argument to have shape" in message or "annot broadcast" in message:
        message += ("\n  hint: a stored value has another shape than its pointers. A partial row has one number a "
                    "column: tl.sum(tile, axis=0) sums down the tile's rows; axis=1 would give one number a row")
    return ExerciseError(message)
