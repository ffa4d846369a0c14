"""Exercise 3.4's checker: the LayerNorm backward kernel, dx and the partial rows of dgamma
and dbeta in one persistent program."""

import torch
import triton

from ....core.runtime import DEVICE, ON_GPU, multiprocessor_count
from ...checking import ExerciseError, compare
from ...student_kernels import report_speed, require_kernel
from ..common import beyond_cases_runs, hidden_case, matches, random_size, say
from .dx_formula import _layernorm_dx64
from .partial_sums import _partial_row_runs, _partial_rows_hint, _program_ranges, _program_sums
from .shared import EPS, _layernorm_stats64, _rerun, _undefined_lanes_hint, _with_hint, _with_nan_rows


def launch_layernorm_backward_rows(layernorm_backward_rows_kernel, x, gamma, grad_y, mean, rstd, n_programs,
                                   out=None, block_rows=4):
    """How exercise 3.4's checker launches the kernel: program p owns rows p·R to
    min((p + 1)·R, M) - 1, R = cdiv(M, n_programs), walks them ``block_rows`` whole rows
    at a time, writes their dx, and stores its partial sums of dgamma and dbeta as row p of
    two (programs, N) buffers. ``out`` is (dx, partial_dgamma, partial_dbeta), filled with
    NaN when not given. Returns it; stage 2 (the column sums of the partial rows) is the
    caller's."""
    n_rows, n_cols = x.shape
    rows_per_program, n_programs = _program_ranges(n_rows, n_programs)
    if out is None:
        out = (_with_nan_rows(n_rows, n_cols), _with_nan_rows(n_programs, n_cols),
               _with_nan_rows(n_programs, n_cols))
    grad_x, partial_dgamma, partial_dbeta = out
    if partial_dgamma.stride(0) != partial_dbeta.stride(0):
        raise ValueError("the two partial buffers share one row stride")
    layernorm_backward_rows_kernel[(n_programs,)](
        x, gamma, grad_y, mean, rstd, grad_x, partial_dgamma, partial_dbeta,
        n_rows, n_cols, rows_per_program,
        x.stride(0), grad_y.stride(0), grad_x.stride(0), partial_dgamma.stride(0),
        BLOCK_ROWS=block_rows, BLOCK_COLS=triton.next_power_of_2(n_cols))
    return grad_x, partial_dgamma, partial_dbeta


def _grad_x_hint(got, x, gamma, grad_y, mean, rstd):
    """The usual mistake behind a wrong dx of the backward kernel, or None."""
    n_cols = x.shape[1]
    block_cols = triton.next_power_of_2(n_cols)
    candidates = [
        (dict(mean_term=False), "dx misses the term - mean(g) (g = gamma * dy), which comes from the mean "
                                "depending on every x of the row"),
        (dict(xhat_term=False), "dx misses the term - xhat * mean(g * xhat), which comes from rstd depending on "
                                "every x of the row"),
        (dict(with_gamma=False), "multiply dy by gamma first: the formula's g is gamma * dy"),
        (dict(reduce="sum"), "the two corrections are means over the row (divide the sums by n_cols), not sums"),
        (dict(xhat=x * rstd[:, None]), "xhat is recomputed without the mean: xhat = (x - mean) * rstd"),
        (dict(xhat=(x - mean[:, None]) / rstd[:, None]), "xhat is recomputed dividing by rstd: rstd is already "
                                                         "1 / sqrt(var + eps), so xhat = (x - mean) * rstd"),
    ]
    if block_cols != n_cols:
        candidates.append((dict(divisor=block_cols), "the row means divide by BLOCK_COLS, the padded width, so the "
                                                     "padding lanes count in them: divide by n_cols"))
    for mistake, hint in candidates:
        if matches(got, _layernorm_dx64(x, gamma, grad_y, mean, rstd, **mistake), rtol=1e-4, atol=1e-4):
            return hint
    return None


def _partial_grads_hint(got_dgamma, got_dbeta, products, rows_per_program, block_rows, x, gamma, grad_y, mean,
                        rstd):
    """The usual mistake behind wrong partial rows of dgamma and dbeta, or None."""
    expected_dgamma, expected_dbeta = (_program_sums(p, rows_per_program) for p in products)
    tolerance = dict(rtol=1e-4, atol=1e-4 * rows_per_program ** 0.5)
    if matches(got_dgamma, expected_dbeta, **tolerance) and matches(got_dbeta, expected_dgamma, **tolerance):
        return ("the partial rows of dgamma and dbeta are swapped: dgamma's are the sums of dy * xhat, dbeta's "
                "the sums of dy")
    if matches(got_dgamma, _program_sums(products[0] * gamma, rows_per_program), **tolerance):
        return "dgamma sums dy * xhat, without gamma: gamma * xhat is y - beta, not xhat"
    for wrong_xhat, hint in [(x * rstd[:, None], "xhat is recomputed without the mean: xhat = (x - mean) * rstd"),
                             ((x - mean[:, None]) / rstd[:, None], "xhat is recomputed dividing by rstd: xhat = "
                                                                  "(x - mean) * rstd")]:
        if matches(got_dgamma, _program_sums(grad_y * wrong_xhat, rows_per_program), **tolerance):
            return hint
    for got, expected, product in [(got_dgamma, expected_dgamma, products[0]),
                                   (got_dbeta, expected_dbeta, products[1])]:
        if isinstance(got, torch.Tensor) and got.shape == expected.shape and not matches(got, expected, **tolerance):
            hint = _partial_rows_hint(got, expected, product, rows_per_program, block_rows)
            if hint:
                return hint
    return None


def check_layernorm_backward_rows(layernorm_backward_rows_kernel):
    """Exercise 3.4: ``layernorm_backward_rows_kernel``, launched by
    :func:`launch_layernorm_backward_rows`, writes dx of every row and each program's partial
    rows of dgamma and dbeta; the checker adds the partial rows in a fixed order (stage 2)."""
    name = "Exercise 3.4 (layernorm_backward_rows_kernel)"
    kernel = require_kernel(name, layernorm_backward_rows_kernel, "layernorm_backward_rows_kernel")
    from ....core.rows import sum_partial_rows

    block_rows = 4
    cases = [(1, 1, 1), (5, 3, 2), (9, 17, 3), (30, 100, 4), (13, 40, 13), (37, 20, 5)]
    cases += hidden_case(lambda: (lambda m: (m, random_size(1, 70), random_size(1, m)))(random_size(1, 60)))
    inputs = [(torch.randn(m, n, device=DEVICE) * 2 + 0.5, torch.randn(m, n, device=DEVICE), p, None, "")
              for m, n, p in cases]
    wide_x, wide_dy = torch.randn(21, 40, device=DEVICE) * 2 + 0.5, torch.randn(21, 48, device=DEVICE)
    out = (_with_nan_rows(21, 33, 36), _with_nan_rows(4, 33, 35), _with_nan_rows(4, 33, 35))
    inputs.append((wide_x[:, :33], wide_dy[:, :33], 4, out,
                   ", x, dy, dx and the partial rows each with rows further apart than 33 elements (use their "
                   "strides)"))
    for x, grad_y, n_programs, out, note in inputs:
        n_rows, n_cols = x.shape
        rows_per_program, _ = _program_ranges(n_rows, n_programs)
        gamma = torch.randn(n_cols, device=DEVICE)
        x64, gamma64, grad_y64 = x.double(), gamma.double(), grad_y.double()
        mean64, rstd64 = _layernorm_stats64(x64, EPS)
        mean, rstd = mean64.float(), rstd64.float()  # as the forward saved them
        mean64, rstd64 = mean.double(), rstd.double()
        xhat64 = (x64 - mean64[:, None]) * rstd64[:, None]
        products = (grad_y64 * xhat64, grad_y64)
        expected_dx = _layernorm_dx64(x64, gamma64, grad_y64, mean64, rstd64)
        expected = (_program_sums(products[0], rows_per_program), _program_sums(products[1], rows_per_program))
        what = (f"{name}, x of shape {(n_rows, n_cols)}, n_programs={n_programs} ({rows_per_program} rows a "
                f"program, tiles of {block_rows}){note}")
        runs = _partial_row_runs(name, launch_layernorm_backward_rows, kernel, x, gamma, grad_y, mean, rstd,
                                 n_programs, out, block_rows)
        rerun = _rerun(name, launch_layernorm_backward_rows, kernel, (x, gamma, grad_y, mean, rstd, n_programs),
                       (block_rows,))
        for how, (grad_x, partial_dgamma, partial_dbeta) in runs:
            where = what + (f", {how}" if how else "")
            partial_atol = 1e-4 * rows_per_program ** 0.5
            try:
                compare(f"{where}: dx", grad_x, expected_dx, rtol=1e-4, atol=1e-4, show_picture=True)
            except ExerciseError as error:
                hint = (_undefined_lanes_hint(rerun, out, (grad_x, partial_dgamma, partial_dbeta))
                        or _grad_x_hint(grad_x, x64, gamma64, grad_y64, mean64, rstd64))
                raise _with_hint(error, hint, kernel, (grad_x,)) from None
            try:
                compare(f"{where}: partial_dgamma (row p: program p's sum of dy * xhat)", partial_dgamma,
                        expected[0], rtol=1e-4, atol=partial_atol, show_picture=True)
                compare(f"{where}: partial_dbeta (row p: program p's sum of dy)", partial_dbeta, expected[1],
                        rtol=1e-4, atol=partial_atol, show_picture=True)
            except ExerciseError as error:
                hint = (_undefined_lanes_hint(rerun, out, (grad_x, partial_dgamma, partial_dbeta))
                        or _partial_grads_hint(partial_dgamma, partial_dbeta, products, rows_per_program, block_rows,
                                               x64, gamma64, grad_y64, mean64, rstd64))
                raise _with_hint(error, hint, kernel, (partial_dgamma, partial_dbeta)) from None
            # stage 2: the partial rows added down the columns in a fixed order, as the course's backward does
            for what_sum, partial, product in [("dgamma", partial_dgamma, products[0]),
                                               ("dbeta", partial_dbeta, products[1])]:
                compare(f"{where}: {what_sum}, your partial rows added in a fixed order",
                        sum_partial_rows(partial.contiguous(), torch.float32), product.sum(0),
                        rtol=1e-4, atol=1e-4 * n_rows ** 0.5)
            if out is not None:
                for tensor in out:
                    tensor.fill_(float("nan"))
    for n_rows, n_cols, n_programs, why in [(1030, 5, 3, "more rows than any case above"),
                                            (6, 1500, 2, "more columns than any case above")]:
        _backward_beyond_cases(name, kernel, n_rows, n_cols, n_programs, why)
    say(f"{name.split(' (')[0]} passed: dx and the partial rows of dgamma and dbeta for {len(inputs)} shapes, "
          "from one row to ranges that end inside a tile, and strided tensors; their sums in a fixed order match "
          "autograd's dgamma and dbeta.")
    _report_backward_speed(name, kernel, sum_partial_rows)


def _backward_beyond_cases(name, kernel, n_rows, n_cols, n_programs, why):
    """Exercise 3.4 on a case past the listed ones, outputs NaN and then filled beforehand."""
    x, grad_y = torch.randn(n_rows, n_cols, device=DEVICE) * 2 + 0.5, torch.randn(n_rows, n_cols, device=DEVICE)
    gamma = torch.randn(n_cols, device=DEVICE)
    mean64, rstd64 = _layernorm_stats64(x.double(), EPS)
    mean, rstd = mean64.float(), rstd64.float()
    x64, gamma64, grad_y64, mean64, rstd64 = x.double(), gamma.double(), grad_y.double(), mean.double(), rstd.double()
    rows_per_program, n_partial = _program_ranges(n_rows, n_programs)
    xhat64 = (x64 - mean64[:, None]) * rstd64[:, None]
    expected_dx = _layernorm_dx64(x64, gamma64, grad_y64, mean64, rstd64)
    expected = (_program_sums(grad_y64 * xhat64, rows_per_program), _program_sums(grad_y64, rows_per_program))
    partial_atol = 1e-4 * rows_per_program ** 0.5

    def verify(label, got):
        grad_x, partial_dgamma, partial_dbeta = got
        compare(f"{label}: dx", grad_x, expected_dx, rtol=1e-4, atol=1e-4)
        compare(f"{label}: partial_dgamma", partial_dgamma, expected[0], rtol=1e-4, atol=partial_atol)
        compare(f"{label}: partial_dbeta", partial_dbeta, expected[1], rtol=1e-4, atol=partial_atol)

    def filled():
        return (torch.randn(n_rows, n_cols, device=DEVICE), torch.randn(n_partial, n_cols, device=DEVICE),
                torch.randn(n_partial, n_cols, device=DEVICE))

    beyond_cases_runs(name, f"x of shape {(n_rows, n_cols)}, n_programs={n_programs}, {why}",
                      launch_layernorm_backward_rows, kernel, (x, gamma, grad_y, mean, rstd, n_programs), verify,
                      filled)


def _report_backward_speed(name, kernel, sum_partial_rows):
    """Both stages of the student's backward against the course's, on 16384 rows of 1024 float32 values."""
    n_rows, n_cols = 16384, 1024
    n_bytes = 3 * n_rows * n_cols * 4  # x and dy read, dx written
    if not ON_GPU:
        report_speed(name, None, n_bytes)
        return
    from ....kernels.layernorm_op.whole_rows import RowStats, layernorm_backward

    x, grad_y = torch.randn(n_rows, n_cols, device=DEVICE), torch.randn(n_rows, n_cols, device=DEVICE)
    gamma = torch.randn(n_cols, device=DEVICE)
    mean64, rstd64 = _layernorm_stats64(x.double(), EPS)
    mean, rstd = mean64.float(), rstd64.float()
    n_programs = 4 * multiprocessor_count()
    n_partial = _program_ranges(n_rows, n_programs)[1]
    out = (torch.empty_like(x), torch.empty(n_partial, n_cols, device=DEVICE),
           torch.empty(n_partial, n_cols, device=DEVICE))

    def both_stages():
        _, partial_dgamma, partial_dbeta = launch_layernorm_backward_rows(
            kernel, x, gamma, grad_y, mean, rstd, n_programs, out, 4)
        sum_partial_rows(partial_dgamma, torch.float32)
        sum_partial_rows(partial_dbeta, torch.float32)

    report_speed(name, both_stages, n_bytes,
                 against=("course_lib's backward",
                          lambda: layernorm_backward(grad_y, x, gamma, True, RowStats(mean, rstd))),
                 advice="load gamma once a program, before the loop over its tiles, keep both accumulators as tiles "
                        "until the end (one tl.sum each after the loop), and check that each tile's loads are "
                        "whole contiguous rows")
