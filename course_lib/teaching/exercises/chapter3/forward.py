"""Exercise 3.1's checker: the LayerNorm forward, several rows a program, with the statistics."""

import torch
import triton

from ....core import references
from ....core.runtime import DEVICE, ON_GPU
from ...checking import ExerciseError, compare
from ...student_kernels import kernel_runs, report_speed, require_kernel
from ..common import beyond_cases_runs, hidden_case, matches, random_size, say
from .shared import EPS, _layernorm_stats64, _rerun, _undefined_lanes_hint, _with_hint, _with_nan_rows


def launch_layernorm_rows(layernorm_rows_kernel, x, gamma, beta, eps=EPS, out=None, block_rows=4):
    """How exercise 3.1's checker launches the kernel: one program a tile of ``block_rows``
    whole rows (BLOCK_COLS, the row length rounded up to a power of two). ``out`` is
    (y, mean, rstd), filled with NaN when not given. Returns (y, mean, rstd)."""
    n_rows, n_cols = x.shape
    if out is None:
        out = (_with_nan_rows(n_rows, n_cols), torch.full((n_rows,), float("nan"), device=x.device),
               torch.full((n_rows,), float("nan"), device=x.device))
    y, mean, rstd = out
    layernorm_rows_kernel[(triton.cdiv(n_rows, block_rows),)](
        x, gamma, beta, y, mean, rstd, n_rows, n_cols, eps, x.stride(0), y.stride(0),
        BLOCK_ROWS=block_rows, BLOCK_COLS=triton.next_power_of_2(n_cols))
    return y, mean, rstd


def _layernorm_rows_hint(x64, eps, mean, rstd, large_mean):
    """The usual mistake behind wrong statistics (got mean and rstd), or None."""
    x64 = x64.cpu()  # the candidates are made on the CPU, where matches compares
    n_cols = x64.shape[1]
    expected_mean = x64.mean(dim=1)
    centred = x64 - expected_mean[:, None]
    var = (centred ** 2).mean(dim=1)
    padding = triton.next_power_of_2(n_cols) - n_cols
    if padding and matches(mean, x64.sum(dim=1) / (n_cols + padding), rtol=1e-4, atol=1e-5):
        return ("the mean divides by BLOCK_COLS, the padded width: divide by n_cols, the padding lanes are not "
                "part of the row")
    if not matches(mean, expected_mean, rtol=1e-4, atol=1e-4 if large_mean else 1e-5):
        return None
    if n_cols == 1 and isinstance(rstd, torch.Tensor) and rstd.isnan().all():
        return ("the variance divides by n_cols - 1 (the unbiased estimate, 0 / 0 on rows of one element): "
                "LayerNorm's is biased, divide by n_cols")
    candidates = [
        (torch.rsqrt(var * n_cols / (n_cols - 1) + eps) if n_cols > 1 else None,
         "the variance divides by n_cols - 1 (the unbiased estimate): LayerNorm's is biased, divide by n_cols"),
        (1 / (var.sqrt() + eps),
         "eps goes inside the square root: rstd = 1 / sqrt(var + eps), not 1 / (sqrt(var) + eps)"),
        (torch.rsqrt((centred ** 2).sum(dim=1) / n_cols + padding * expected_mean ** 2 / n_cols + eps),
         "the padding lanes count in the variance: they load 0, so x - mean is -mean there and adds mean² to the "
         "sum of squares; set the centred values to 0 outside the mask (tl.where) before squaring"),
    ]
    for candidate, hint in candidates:
        if candidate is not None and matches(rstd, candidate, rtol=1e-4, atol=1e-4):
            return hint
    # The one-step E[x²] - E[x]² is off by about the rounding of E[x²], or negative (rstd NaN)
    rstd64 = rstd.detach().to("cpu", torch.float64) if isinstance(rstd, torch.Tensor) else None
    if rstd64 is not None and rstd64.shape == var.shape:
        var_got = 1 / rstd64 ** 2 - eps
        rounding = 4 * n_cols * 2.0 ** -23 * (x64 ** 2).mean(dim=1)
        if (~rstd64.isfinite() | ((var_got - var).abs() <= rounding)).all():
            return ("E[x²] - E[x]² cancels catastrophically in float32 when the variance is small next to the mean "
                    "squared (rows of spread 1e-3 around 0.5, rows centred on ±1e4 where E[x²] ≈ 1e8 is rounded to "
                    "a multiple of 8): subtract the mean first, then average the squares")
    return None


def check_layernorm_rows(layernorm_rows_kernel):
    """Exercise 3.1: ``layernorm_rows_kernel``, launched by :func:`launch_layernorm_rows`, writes
    (y, mean, rstd) of a 2-D float32 x, BLOCK_ROWS rows a program, mean and rstd of shape (rows,)."""
    name = "Exercise 3.1 (layernorm_rows_kernel)"
    kernel = require_kernel(name, layernorm_rows_kernel, "layernorm_rows_kernel")
    # (rows, columns, the rows' centre, their spread)
    cases = [(1, 1, 0.5, 2.0), (5, 3, 0.5, 2.0), (9, 17, 0.5, 2.0), (30, 100, 0.5, 2.0), (6, 50, 0.5, 1e-3),
             (7, 100, 1e4, 1.0)]
    cases += hidden_case(lambda: (random_size(2, 40), random_size(2, 130), 0.5, 2.0))
    inputs = []
    for n_rows, n_cols, centre, spread in cases:
        signs = torch.where(torch.arange(n_rows, device=DEVICE) % 2 == 0, 1.0, -1.0)[:, None]
        x = torch.randn(n_rows, n_cols, device=DEVICE) * spread + centre * (signs if centre > 1 else 1.0)
        what = f"x of shape {(n_rows, n_cols)}"
        if centre > 1:
            what += f", rows centred on ±{centre:g} with a spread of {spread:g}"
        elif spread < 1:
            what += f", rows of spread {spread:g} (variance 1e-6, below eps = {EPS:g})"
        inputs.append((what, x, None))
    wide = torch.randn(12, 40, device=DEVICE) * 2 + 0.5
    inputs.append((f"x = wide[:, :33] whose rows are {wide.stride(0)} elements apart (use stride_x_row), "
                   "y's rows 36 elements apart (use stride_y_row)", wide[:, :33], _with_nan_rows(12, 33, 36)))
    for what, x, y_out in inputs:
        n_rows, n_cols = x.shape
        large_mean = x.abs().mean() > 100
        rtol = atol = 1e-2 if large_mean else 1e-4  # float32 sums of values near 1e4: mean off by ~1e-3
        gamma = torch.randn(n_cols, device=DEVICE)
        beta = torch.randn(n_cols, device=DEVICE)
        x64 = x.double()
        expected_mean, expected_rstd = _layernorm_stats64(x64, EPS)
        expected_y = references.layernorm(x64, gamma.double(), beta.double(), EPS)
        out = None if y_out is None else (y_out, torch.full((n_rows,), float("nan"), device=DEVICE),
                                          torch.full((n_rows,), float("nan"), device=DEVICE))  # y strided
        for how, (y, mean, rstd) in kernel_runs(name, launch_layernorm_rows, kernel, x, gamma, beta, EPS, out):
            where = f"{name}, {what}" + (f", {how}" if how else "")
            try:
                compare(f"{where}: mean (one per row; wrong indices are rows)", mean, expected_mean,
                        rtol=1e-5, atol=1e-2 if large_mean else 1e-5)
                compare(f"{where}: rstd = 1/sqrt(var + eps) (one per row; wrong indices are rows)", rstd,
                        expected_rstd, rtol=rtol, atol=atol)
                compare(f"{where}: y", y, expected_y, rtol=rtol, atol=atol, show_picture=True)
            except ExerciseError as error:
                rerun = _rerun(name, launch_layernorm_rows, kernel, (x, gamma, beta, EPS))
                hint = (_undefined_lanes_hint(rerun, out, (y, mean, rstd))
                        or _layernorm_rows_hint(x64, EPS, mean, rstd, large_mean))
                raise _with_hint(error, hint, kernel, (y, mean, rstd)) from None
            if out is not None:  # the compiled run writes into fresh NaN
                for tensor in out:
                    tensor.fill_(float("nan"))
    # past the listed cases (not counted in the line below): more rows and columns than any of them,
    # and outputs filled beforehand with values a kernel cannot tell from its own
    for what, x in [("x of shape (1030, 7), more rows than any case above", torch.randn(1030, 7, device=DEVICE) + 0.5),
                    ("x of shape (3, 1500), longer rows than any case above",
                     torch.randn(3, 1500, device=DEVICE) * 2 - 0.5)]:
        _forward_beyond_cases(name, what, kernel, x)
    say(f"{name.split(' (')[0]} passed: y, mean and rstd for {len(inputs)} shapes, widths 1 to 100, "
          "rows of variance below eps, rows centred on ±1e4 and strided x and y.")
    _report_forward_speed(name, kernel)


def _forward_beyond_cases(name, what, kernel, x):
    """Exercise 3.1 on a case past the listed ones, outputs NaN and then filled beforehand."""
    n_rows, n_cols = x.shape
    gamma, beta = torch.randn(n_cols, device=DEVICE), torch.randn(n_cols, device=DEVICE)
    x64 = x.double()
    expected_mean, expected_rstd = _layernorm_stats64(x64, EPS)
    expected_y = references.layernorm(x64, gamma.double(), beta.double(), EPS)

    def verify(label, got):
        y, mean, rstd = got
        compare(f"{label}: mean", mean, expected_mean, rtol=1e-5, atol=1e-5)
        compare(f"{label}: rstd", rstd, expected_rstd, rtol=1e-4, atol=1e-4)
        compare(f"{label}: y", y, expected_y, rtol=1e-4, atol=1e-4)

    def filled():  # values a forward could write: y of spread 1, mean near 0, rstd near 1
        return (torch.randn(n_rows, n_cols, device=DEVICE), torch.randn(n_rows, device=DEVICE) * 0.1,
                torch.rand(n_rows, device=DEVICE) + 0.5)

    beyond_cases_runs(name, what, launch_layernorm_rows, kernel, (x, gamma, beta, EPS), verify, filled)


def _report_forward_speed(name, kernel):
    """The student's forward against the course's, on 16384 rows of 1024 float32 values."""
    n_rows, n_cols = 16384, 1024
    n_bytes = 2 * n_rows * n_cols * 4  # x read, y written
    if not ON_GPU:
        report_speed(name, None, n_bytes)  # says that speed needs a GPU
        return
    from ....kernels.layernorm_op.whole_rows import layernorm_forward

    x = torch.randn(n_rows, n_cols, device=DEVICE)
    gamma, beta = torch.randn(n_cols, device=DEVICE), torch.randn(n_cols, device=DEVICE)
    out = (torch.empty_like(x), torch.empty(n_rows, device=DEVICE), torch.empty(n_rows, device=DEVICE))
    report_speed(name, lambda: launch_layernorm_rows(kernel, x, gamma, beta, EPS, out), n_bytes,
                 against=("course_lib's forward", lambda: layernorm_forward(x, gamma, beta, EPS, save_stats=True)),
                 advice="a program of 4 rows of 1024 float32 values loads 16 KiB: check that the row's columns are "
                        "contiguous (cols[None, :] added to the row's start), so that loads combine into wide vectors")
