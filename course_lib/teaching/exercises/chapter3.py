"""Checkers of chapter 3, LayerNorm: one function an exercise."""

import inspect

import torch
import triton

from ...core import references
from ...core.runtime import DEVICE, ON_GPU, multiprocessor_count
from ..checking import ExerciseError, compare, run_student_code, without_autograd
from ..student_kernels import kernel_runs, report_speed, require_kernel, run_interpreted
from .chapter1 import python_error_in_words
from .common import Exercise, beyond_cases_runs, hidden_case, matches, random_size, without_mask_hints, say

__all__ = ["launch_layernorm_rows", "check_layernorm_rows", "check_layernorm_dx",
           "launch_column_partial_sums", "check_column_partial_sums",
           "launch_layernorm_backward_rows", "check_layernorm_backward_rows"]
# The chapter's exercises, in order, for the instructors' notes.
EXERCISES = (
    Exercise('3.1', 'several rows a program, with the statistics', 'check_layernorm_rows', kernel=True, skills='row tiles, two row reductions with masked padding, saved statistics', difficulty=3, minutes=30),
    Exercise('3.2', 'the gradient of x in PyTorch', 'check_layernorm_dx', kernel=False, skills='the LayerNorm backward', difficulty=2, minutes=20),
    Exercise('3.3', 'partial column sums, the first stage', 'check_column_partial_sums', kernel=True, skills='a loop over a range of rows, per-program partial sums', difficulty=3, minutes=25),
    Exercise('3.4', 'the backward kernel', 'check_layernorm_backward_rows', kernel=True, skills='row reductions and column partial sums in one persistent program', difficulty=4, minutes=45),
)

EPS = 1e-5


def _with_nan_rows(n_rows, n_cols, row_stride=None):
    """A float32 (n_rows, n_cols) output filled with NaN, rows ``row_stride`` elements apart."""
    row_stride = row_stride or n_cols
    return torch.full((n_rows, row_stride), float("nan"), device=DEVICE)[:, :n_cols]


def _layernorm_stats64(x, eps):
    """mean and rstd of each row of a float64 x, shapes x.shape[:-1]: the forward's saved statistics."""
    mean = x.mean(dim=-1)
    var = ((x - mean[..., None]) ** 2).mean(dim=-1)
    return mean, torch.rsqrt(var + eps)


def _masked_loads_without_other(kernel):
    """The tl.load calls of the kernel's source that have a mask= and no other=."""
    try:
        source = inspect.getsource(kernel.fn)
    except (AttributeError, OSError, TypeError):
        return []
    loads, start = [], source.find("tl.load(")
    while start != -1:
        depth, end = 0, start
        for end in range(start + len("tl.load"), len(source)):
            depth += {"(": 1, ")": -1}.get(source[end], 0)
            if depth == 0:
                break
        call = " ".join(source[start:end + 1].split())
        if "mask=" in call and "other=" not in call:
            loads.append(call)
        start = source.find("tl.load(", end)
    return loads


def _with_hint(error, hint, kernel, outputs):
    """``error`` with its hint line; without one, NaN in the outputs and a masked load without
    other= in the kernel name that load."""
    if hint is None and any(isinstance(t, torch.Tensor) and t.isnan().any() for t in outputs):
        loads = _masked_loads_without_other(kernel)
        if loads:
            hint = (f"{loads[0]} has a mask but no other=: its masked lanes hold whatever memory held (NaN in "
                    "the checker's interpreted run), and a sum over the tile spreads them; give other=0.0")
    return ExerciseError(str(error) + (f"\n  hint: {hint}" if hint else ""))


def _fresh_like(out):
    """New NaN-filled outputs laid out as ``out`` (a tensor, a tuple of them, or None)."""
    if out is None:
        return None
    if isinstance(out, tuple):
        return tuple(_fresh_like(t) for t in out)
    if out.ndim == 2:
        return _with_nan_rows(out.shape[0], out.shape[1], out.stride(0))
    return torch.full(out.shape, float("nan"), device=out.device)


def _undefined_lanes_hint(rerun, out, outputs):
    """When the outputs hold NaN that a masked load without other= put there, a hint naming
    that load (not the pattern of wrong rows). ``rerun(out)`` runs the case again into
    ``out`` with the masked lanes the interpreter's 0 (``run_interpreted(...,
    undefined_as_nan=False)``): NaN that disappear there came from those lanes."""
    if not any(isinstance(t, torch.Tensor) and t.isnan().any() for t in outputs):
        return None
    loads = _masked_loads_without_other(rerun.kernel)
    if not loads:
        return None
    try:
        again = rerun(_fresh_like(out))
    except ExerciseError:
        return None
    again = again if isinstance(again, tuple) else (again,)
    if any(not isinstance(t, torch.Tensor) or t.isnan().any() for t in again):
        return None
    return (f"{' and '.join(loads)} {'has' if len(loads) == 1 else 'have'} a mask but no other=: the lanes the mask "
            "switches off hold no defined value (NaN in the checker's interpreted run, whatever memory held on a "
            "GPU), and they reach the results (with those lanes 0 the NaN are gone); give other=0.0, or keep "
            "those lanes out with tl.where before they are used")


def _rerun(name, launch, kernel, before, after=()):
    """``rerun(out)`` for _undefined_lanes_hint: the launch again into ``out``, masked lanes 0."""
    def rerun(out):
        return run_interpreted(name, launch, kernel, *before, out, *after, undefined_as_nan=False)

    rerun.kernel = kernel
    return rerun


# ------------------------------------------------------------ Exercise 3.1: the forward


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
    from ...kernels.layernorm_op.whole_rows import layernorm_forward

    x = torch.randn(n_rows, n_cols, device=DEVICE)
    gamma, beta = torch.randn(n_cols, device=DEVICE), torch.randn(n_cols, device=DEVICE)
    out = (torch.empty_like(x), torch.empty(n_rows, device=DEVICE), torch.empty(n_rows, device=DEVICE))
    report_speed(name, lambda: launch_layernorm_rows(kernel, x, gamma, beta, EPS, out), n_bytes,
                 against=("course_lib's forward", lambda: layernorm_forward(x, gamma, beta, EPS, save_stats=True)),
                 advice="a program of 4 rows of 1024 float32 values loads 16 KiB: check that the row's columns are "
                        "contiguous (cols[None, :] added to the row's start), so that loads combine into wide vectors")


# ------------------------------------------------------ Exercise 3.2: dx in PyTorch


def _layernorm_dx64(x, gamma, grad_y, mean, rstd, *, with_gamma=True, reduce="mean", xhat_term=True,
                    mean_term=True, with_rstd=True, xhat=None, divisor=None):
    """The dx formula, and the usual mistakes in it (for hints). ``divisor`` replaces N in the means."""
    if xhat is None:
        xhat = (x - mean[..., None]) * rstd[..., None]
    g = grad_y * gamma if with_gamma else grad_y
    if divisor is not None:
        average = lambda t: t.sum(dim=-1, keepdim=True) / divisor  # noqa: E731
    elif reduce == "mean":
        average = lambda t: t.mean(dim=-1, keepdim=True)  # noqa: E731
    else:
        average = lambda t: t.sum(dim=-1, keepdim=True)  # noqa: E731
    inner = g - (average(g) if mean_term else 0.0) - (xhat * average(g * xhat) if xhat_term else 0.0)
    return inner * rstd[..., None] if with_rstd else inner


_DX_MISTAKES = [
    (dict(with_gamma=False), "multiply dy by gamma first: the formula's g is gamma * dy"),
    (dict(reduce="sum"), "the two corrections are means over the row (divide the sums by N), not sums"),
    (dict(xhat_term=False), "the term - xhat * mean(g * xhat), which comes from rstd depending on x, is missing"),
    (dict(mean_term=False), "the term - mean(g), which comes from the mean depending on x, is missing"),
    (dict(with_rstd=False), "the whole bracket is multiplied by rstd"),
]


def check_layernorm_dx(layernorm_dx):
    """Exercise 3.2: ``layernorm_dx(x, gamma, dy, mean, rstd)`` returns dx of y = xhat * gamma + beta
    from the saved statistics (mean and rstd of shape x.shape[:-1]), without autograd."""
    name = "Exercise 3.2 (layernorm_dx)"
    shapes = [(3, 1), (4, 7), (2, 3, 16), (5, 100)] + hidden_case(lambda: (random_size(1, 6), random_size(1, 120)))
    for shape in shapes:
        x = (torch.randn(shape, dtype=torch.float64) * 2 + 0.5).requires_grad_()
        gamma = torch.randn(shape[-1], dtype=torch.float64)
        grad_y = torch.randn(shape, dtype=torch.float64)
        (expected,) = torch.autograd.grad(references.layernorm(x, gamma, None, EPS), x, grad_y)
        x = x.detach()
        mean, rstd = _layernorm_stats64(x, EPS)
        try:
            with without_autograd(name):  # the answer must come from the formula, not from autograd
                got = run_student_code(name, layernorm_dx, x.clone(), gamma.clone(), grad_y.clone(),
                                       mean.clone(), rstd.clone())
        except ExerciseError as error:
            raise python_error_in_words(
                name, error,
                "the exercise asks for dx from the formula, not from autograd: the checker calls your function "
                "under torch.no_grad, so no graph is recorded and torch.autograd.grad or .backward() has nothing "
                "to differentiate (switching grad back on is refused too). Compute dx from x, gamma, dy and the "
                "saved mean and rstd with tensor operations",
                f"this call had x and dy of shape {shape}, gamma of shape {tuple(gamma.shape)}, mean and rstd of "
                f"shape {tuple(mean.shape)} (one value a row): x may be 2-D or 3-D, so take the row means over "
                "the last axis (dim=-1, keepdim=True) and give mean and rstd a last axis of 1 before they meet "
                "a row") from None
        what = f"{name}, x of shape {shape} (mean and rstd of shape {tuple(mean.shape)})"
        try:
            compare(what, got, expected, rtol=1e-9, atol=1e-9)
        except ExerciseError as error:
            hint = next((text for mistake, text in _DX_MISTAKES
                         if matches(got, _layernorm_dx64(x, gamma, grad_y, mean, rstd, **mistake))), None)
            if hint is None and isinstance(got, torch.Tensor) and tuple(got.shape) != tuple(expected.shape):
                hint = ("dx has x's shape: mean and rstd have one value a row (shape x.shape[:-1]); give them a "
                        "last axis of 1 (mean[..., None]) before they meet a row, so that they broadcast along "
                        "it and not across the rows")
            raise ExerciseError(without_mask_hints(error) + (f"\n  hint: {hint}" if hint else "")) from None
    say("Exercise 3.2 passed: dx matches autograd's in float64 for widths 1 to 100, 2-D and 3-D x.")


# --------------------------------------------- Exercise 3.3: partial column sums


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


# ------------------------------------------------- Exercise 3.4: the backward kernel


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


def check_layernorm_backward_rows(layernorm_backward_rows_kernel):
    """Exercise 3.4: ``layernorm_backward_rows_kernel``, launched by
    :func:`launch_layernorm_backward_rows`, writes dx of every row and each program's partial
    rows of dgamma and dbeta; the checker adds the partial rows in a fixed order (stage 2)."""
    name = "Exercise 3.4 (layernorm_backward_rows_kernel)"
    kernel = require_kernel(name, layernorm_backward_rows_kernel, "layernorm_backward_rows_kernel")
    from ...core.rows import sum_partial_rows

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
    from ...kernels.layernorm_op.whole_rows import RowStats, layernorm_backward

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
