"""Checkers of chapter 4, coordinate descent: one function an exercise."""

import functools
import math

import torch
import triton

from ...core import references
from ...core.runtime import DEVICE, ON_GPU
from ..checking import ExerciseError, compare, run_student_code
from ..student_kernels import kernel_runs, report_speed, require_kernel
from .common import (KEPT_FILL_HINT, Exercise, Prefilled, hidden_case, matches, random_fill, random_matrix, random_size,
                     say, without_layout_hints)

__all__ = ["check_routing_weights", "launch_row_logsumexp_of_min", "check_row_logsumexp_of_min",
           "launch_coor_descent_row", "check_coor_descent_row"]
# The chapter's exercises, in order, for the instructors' notes.
EXERCISES = (
    Exercise('4.1', 'the routing weights', 'check_routing_weights', kernel=False, skills='the weights from a and b', difficulty=1, minutes=10),
    Exercise('4.2', 'the log-sum-exp of the clipped row', 'check_row_logsumexp_of_min', kernel=True, skills='a clipped log-sum-exp in a kernel, -inf padding, the max subtracted', difficulty=3, minutes=30),
    Exercise('4.3', 'the whole iteration in one program', 'check_coor_descent_row', kernel=True, skills='a loop carrying a scalar state, a row kept in registers through every iteration, an ε schedule', difficulty=4, minutes=45),
)


def _routing_reference64(a, s, eps, mask):
    """y = exp((s + a + b) / eps) with b = -relu(s + a), exactly 0 where mask is False."""
    shifted = s + a[..., None]
    y = torch.exp((shifted - torch.relu(shifted)) / eps)
    return y if mask is None else y.masked_fill(~mask, 0.0)


# The exercise's words for the errors its usual mistakes raise.
_ROUTING_ERRORS = (
    ("must match the size of tensor", "a has one value a row, of shape (...), and s one more axis: give a a "
     "last axis of length 1 (a[..., None]) so that it broadcasts along each row of s"),
    ("not broadcastable", "a has one value a row, of shape (...), and s one more axis: give a a last axis of "
     "length 1 (a[..., None]) so that it broadcasts along each row of s"),
)


def _routing_weights_hint(got, expected, a, s, eps, mask):
    """The usual mistake behind wrong routing weights, or None."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return None
    got64 = got.detach().to("cpu", torch.float64)
    wrong = ~torch.isclose(got64, expected, rtol=1e-9, atol=1e-12)
    finite = got64.isfinite()
    exponent = (s + a[..., None]) / eps
    # exp is inf in float64 past 709; a value that undoes it afterwards gives NaN (inf * 0) or inf there
    if not (got64[finite] > 1 + 1e-9).any() and (wrong & ~finite & (exponent > 709)).any():
        return ("y is NaN or inf where (s + a) / eps lies far above 0: exp((s + a) / eps) is inf there (float64's "
                "exp overflows past 709), and whatever undoes it afterwards (times exp(-relu(s + a) / eps), "
                "divided by another inf) gives NaN or inf; take the minimum with 0 before the exponential")
    if (got64 > 1 + 1e-9).any():
        return ("y = exp(min(s + a, 0) / eps) never exceeds 1: take the minimum with 0 "
                "(that is what b = -relu(s + a) does)")
    if mask is not None and not (wrong & mask).any():
        if got64[~mask].isnan().any():
            return ("only masked positions are wrong, and they are NaN: the scores there may hold anything, and "
                    "NaN * 0 is NaN, so multiplying by the mask is not enough; use torch.where(mask, y, 0.0) or "
                    "y.masked_fill(~mask, 0.0)")
        return "only masked positions are wrong: y must be exactly 0 where mask is False"
    return None


def _check_routing_case(name, routing_weights, a, s, eps, mask, what, past_listed=False):
    """Exercise 4.1 on one case: the weights compared with the reference, the mistake named."""
    with torch.no_grad():
        got = run_student_code(name, routing_weights, a.clone(), s.clone(), eps,
                               None if mask is None else mask.clone(), explain=_ROUTING_ERRORS)
    expected = _routing_reference64(a, s, eps, mask)
    try:
        compare(what, got, expected, rtol=1e-9, atol=1e-12, show_picture=s.ndim == 2,
                outputs_start_as_nan=False)  # the function makes its own output
    except ExerciseError as error:
        hint = _routing_weights_hint(got, expected, a, s, eps, mask)
        if hint is None and past_listed:
            hint = ("this case lies past the cases listed above (more rows or scores than any of them, or scores "
                    "far from 0): y comes from the same formula whatever the shape or the values; does the "
                    "function branch on the size of s or on its values?")
        raise ExerciseError(without_layout_hints(error) + (f"\n  hint: {hint}" if hint else "")) from None


def _routing_cases_past_listed():
    """(a, s, eps, mask, what): scores far below and far above 0, with s + a far from 0 on either
    side, and sizes past the listed cases', a fully masked row among them."""
    mixed = torch.randn(6, 40, dtype=torch.float64) * 3
    mixed[::2] -= 200
    mixed[1::2] += 200
    high = torch.randn(5, 30, dtype=torch.float64) * 2 + 150
    low = torch.randn(5, 30, dtype=torch.float64) * 2 - 150
    many = torch.randn(300, 3, dtype=torch.float64)
    long = torch.randn(2, 3000, dtype=torch.float64) * 4 + 100
    long_mask = torch.rand(2, 3000) < 0.5
    long_mask[1] = False
    batched = torch.randn(2, 3, 4, 50, dtype=torch.float64) * 50
    return [
        (-mixed.quantile(0.6, dim=-1), mixed, 0.004, None, "rows near -200 and near +200, -a among the scores"),
        (-high.amin(dim=-1) + 40, high, 0.02, None, "scores near +150, s + a far above 0 (y = 1 everywhere)"),
        (-low.amax(dim=-1) - 40, low, 0.5, None, "scores near -150, s + a far below 0"),
        (-many.median(dim=-1).values, many, 0.1, None, "300 rows of 3 scores"),
        (-long.quantile(0.9, dim=-1), long.masked_fill(~long_mask, float("nan")), 0.05, long_mask,
         "2 rows of 3000 scores near +100, NaN under the mask, the second row fully masked"),
        (-batched.median(dim=-1).values, batched, 0.05, batched > 0, "a of shape (2, 3, 4), scores of spread 50"),
    ]


def check_routing_weights(routing_weights):
    """Exercise 4.1: ``routing_weights(a, s, eps, mask=None)`` returns y = exp(min(s + a, 0) / eps),
    exactly 0 where mask is False, for s (..., n) and a (...) in float64."""
    name = "Exercise 4.1 (routing_weights)"
    s = torch.randn(5, 12, dtype=torch.float64)
    big = torch.randn(4, 9, dtype=torch.float64)
    masked = torch.randn(6, 25, dtype=torch.float64)
    mask = torch.rand(6, 25) < 0.7
    mask[::3, 0] = True
    mask[4] = False  # a fully masked row
    large_scores = masked.masked_fill(~mask, 1e4)  # padding that looks like the best score
    nan_scores = masked.masked_fill(~mask, float("nan"))  # padding that holds anything
    batched = torch.randn(2, 3, 10, dtype=torch.float64)
    batched_mask = torch.rand(2, 3, 10) < 0.6
    cases = [
        (-s.quantile(0.7, dim=-1), s, 0.1, None, "random rows, no mask"),
        (torch.randn(3, dtype=torch.float64), torch.randn(3, 1, dtype=torch.float64), 0.5, None,
         "rows of one score, no mask"),
        (-big.amin(dim=-1) + 1, big, 0.05, None, "s + a > 0 everywhere, so y = 1 everywhere"),
        (-masked.quantile(0.7, dim=-1), large_scores, 0.1, mask, "masked scores set to 1e4"),
        (-masked.quantile(0.7, dim=-1), nan_scores, 0.1, mask,
         "masked scores set to NaN (a mask says nothing about what the scores hold there)"),
        (-batched.median(dim=-1).values, batched, 0.2, batched_mask, "s of shape (2, 3, 10), a of shape (2, 3)"),
    ]
    cases += hidden_case(lambda: (lambda s: (-s.quantile(0.7, dim=-1), s, 0.1, s > s.median(),
                                         "random rows, masked"))(random_matrix(8, 60)))
    for a, s, eps, m, kind in cases:
        _check_routing_case(name, routing_weights, a, s, eps, m,
                            f"{name}, s of shape {tuple(s.shape)}, eps = {eps:g}, {kind}")
    # Not counted in the line below (what a student saw printed): scores far from 0, s + a far from 0
    # on both sides, and sizes past the listed ones.
    for a, s, eps, m, kind in _routing_cases_past_listed():
        _check_routing_case(name, routing_weights, a, s, eps, m,
                            f"{name}, s of shape {tuple(s.shape)}, eps = {eps:g}, {kind}", past_listed=True)
    say(f"Exercise 4.1 passed: {len(cases)} cases, with and without masks, NaN under the mask, "
          "y clipped at 1 and batched rows.")


def _warps(block):
    """Enough warps that a row of `block` lanes holds 8 to 16 of them a thread."""
    return max(1, min(16, block // 256))


# ------------------------------------------------- Exercise 4.2: the log-sum-exp of the clipped row


def launch_row_logsumexp_of_min(row_logsumexp_of_min_kernel, s, a, eps, out=None, block_cols=None):
    """How exercise 4.2's checker launches the kernel: one program a row of the 2-D ``s``,
    ``BLOCK_COLS`` the next power of 2 of its width (the whole row); ``out`` of shape
    ``(rows,)``, filled with NaN when not given."""
    n_rows, n_cols = s.shape
    if out is None:
        out = torch.full((n_rows,), float("nan"), device=s.device)
    block_cols = block_cols or triton.next_power_of_2(n_cols)
    row_logsumexp_of_min_kernel[(n_rows,)](s, a, out, n_cols, eps, s.stride(0), s.stride(1),
                                           BLOCK_COLS=block_cols, num_warps=_warps(block_cols))
    return out


def _lse_of_min64(s, a, eps, pad=0, sign=-1.0, divide=True):
    """logsumexp_j(min(s_j, -a) / eps) per row in float64; pad > 0 adds lanes that loaded 0, for hints."""
    s = s.detach().to("cpu", torch.float64)
    a = a.detach().to("cpu", torch.float64)
    if pad:
        s = torch.cat([s, s.new_zeros(s.shape[0], pad)], dim=1)
    inner = torch.minimum(s, sign * a[:, None])
    return torch.logsumexp(inner / eps if divide else inner, dim=-1)


def _row_logsumexp_of_min_hint(got, s, a, eps, large):
    """The usual mistake behind a wrong row_logsumexp_of_min, or None."""
    if not isinstance(got, torch.Tensor):
        return None
    if large and not got.detach().isfinite().all():
        return ("exp overflowed float32 (past exp(88) it is inf): subtract the row's largest "
                "min(s_j, -a_i) / eps before tl.exp and add it back after tl.log")
    n_cols = s.shape[1]
    pad = triton.next_power_of_2(n_cols) - n_cols
    candidates = [
        (_lse_of_min64(s, a, eps, sign=1.0), "the minimum is taken with -a_i, not a_i"),
        (_lse_of_min64(s, a, eps, divide=False), "divide min(s, -a) by eps before the exponential"),
    ]
    if pad:
        candidates.append((_lse_of_min64(s, a, eps, pad=pad),
                           "the lanes past the end of the row count: load them with "
                           "other=float('-inf'), so that min(-inf, -a) = -inf and exp gives 0"))
    return next((text for candidate, text in candidates if matches(got, candidate, rtol=1e-5, atol=1e-4)), None)


def _lse_shifted32(s, a, eps, shift):
    """The kernel's log-sum-exp in float32 with the shift a student may subtract before the
    exponential: "-a" (-a_i / eps, the largest term only when -a_i lies below every score),
    "s_max" (max_j s_ij / eps, the largest only when -a_i lies above them) or "none"."""
    s32 = s.detach().to("cpu", torch.float32)
    a32 = a.detach().to("cpu", torch.float32)[:, None]
    z = torch.minimum(s32, -a32) / eps
    c = {"-a": -a32 / eps, "s_max": s32.amax(dim=-1, keepdim=True) / eps, "none": torch.zeros_like(a32)}[shift]
    return (c + torch.exp(z - c).sum(dim=-1, keepdim=True).log()).flatten()


def _same_or_both_undefined(got, candidate, rtol=1e-5, atol=1e-4):
    """got matches candidate, inf for inf and NaN for NaN (what a wrong shift gives)."""
    if not isinstance(got, torch.Tensor) or got.shape != candidate.shape:
        return False
    got64, candidate64 = got.detach().to("cpu", torch.float64), candidate.to(torch.float64)
    return bool(torch.isclose(got64, candidate64, rtol=rtol, atol=atol, equal_nan=True).all())


_SHIFT_HINTS = {
    "-a": ("the value subtracted before tl.exp is -a_i / eps, which is the row's largest term only when -a_i "
           "lies below every score; where -a_i lies above a row's scores, every exponent is far below 0, exp "
           "gives 0 and the log -inf. Subtract the largest of the terms themselves, whichever side of the scores "
           "-a_i lies on"),
    "s_max": ("the value subtracted before tl.exp is the largest score over eps, which is the row's largest term "
              "only when -a_i lies above the scores; where -a_i lies below a row's largest score, every exponent "
              "is far below 0, exp gives 0 and the log -inf. Subtract the largest of the terms themselves"),
    "none": ("exp overflowed or underflowed float32 (past exp(88) it is inf, below exp(-103) it is 0): subtract "
             "the row's largest term before tl.exp and add it back after tl.log"),
}


def _adversarial_lse_cases():
    """Inputs that separate the largest term from what is the largest in easier cases: scores far
    below and far above zero, -a above every score and below it, and sizes past the printed
    cases' (many rows, a long row), each with its outputs pre-filled with random values."""
    cases = []
    for centre in (-200.0, 200.0):
        s = torch.randn(6, 37, device=DEVICE) * 3 + centre
        cases.append((s, -(s.amax(dim=-1) + 30), 0.05, f"scores near {centre:+g} and -a above every score"))
        s = torch.randn(6, 37, device=DEVICE) * 3 + centre
        cases.append((s, -(s.amin(dim=-1) - 30), 0.05, f"scores near {centre:+g} and -a below every score"))
    s = torch.randn(8, 29, device=DEVICE) * 50
    s[::2] -= 150
    s[1::2] += 150
    cases.append((s, -s.median(dim=-1).values, 0.02, "rows near -150 and near +150, -a among the scores"))
    many = torch.randn(300, 3, device=DEVICE)
    cases.append((many, -many.median(dim=-1).values, 0.1, "300 rows of 3 scores"))
    long = torch.randn(2, 2500, device=DEVICE) * 4
    cases.append((long, -long.quantile(0.9, dim=-1), 0.05, "2 rows of 2500 scores"))
    return cases


def check_row_logsumexp_of_min(row_logsumexp_of_min_kernel):
    """Exercise 4.2: ``row_logsumexp_of_min_kernel``, launched by :func:`launch_row_logsumexp_of_min`,
    writes logsumexp_j(min(s_ij, -a_i) / eps) for each row i of a 2-D float32 s of any strides."""
    name = "Exercise 4.2 (row_logsumexp_of_min_kernel)"
    kernel = require_kernel(name, row_logsumexp_of_min_kernel, "row_logsumexp_of_min_kernel")
    inputs = []
    for n_rows, n_cols in [(4, 1), (6, 3), (5, 16), (9, 17), (7, 100)] + hidden_case(lambda: (random_size(1, 20), random_size(1, 150))):
        s = torch.randn(n_rows, n_cols, device=DEVICE)
        inputs.append((s, -s.median(dim=-1).values, 0.1, "", False))
    large = (torch.rand(7, 100, device=DEVICE) * 2 - 1) * 1e3
    inputs.append((large, -large.median(dim=-1).values, 0.01,
                   " with scores up to ±1e3 and eps = 0.01 (exp overflows unless the row max is subtracted first)",
                   True))
    below = torch.randn(5, 20, device=DEVICE)
    inputs.append((below, -below.amin(dim=-1) + 2, 0.1, " with -a below every score (min(s, -a) = -a everywhere)",
                   False))
    sliced = torch.randn(12, 40, device=DEVICE)[:, :33]
    inputs.append((sliced, -sliced.median(dim=-1).values, 0.1,
                   f", s = wide[:, :33] whose rows are {sliced.stride(0)} elements apart (use stride_s_row)", False))
    transposed = torch.randn(21, 9, device=DEVICE).t()
    inputs.append((transposed, -transposed.median(dim=-1).values, 0.1,
                   f", a transposed s (strides {transposed.stride()}: use stride_s_col)", False))
    for s, a, eps, kind, large in inputs:
        what = f"{name}, s of shape {tuple(s.shape)}, eps = {eps:g}{kind} (one value per row; wrong indices are rows)"
        expected = _lse_of_min64(s, a, eps)
        for how, got in kernel_runs(name, launch_row_logsumexp_of_min, kernel, s, a.contiguous(), eps):
            try:
                compare(what + (f", {how}" if how else ""), got, expected, rtol=1e-5, atol=1e-4)
            except ExerciseError as error:
                hint = next((_SHIFT_HINTS[shift] for shift in ("-a", "s_max") if not matches(
                    _lse_shifted32(s, a, eps, shift), expected, rtol=1e-5, atol=1e-4)
                    and _same_or_both_undefined(got, _lse_shifted32(s, a, eps, shift))), None)
                hint = hint or _row_logsumexp_of_min_hint(got, s, a, eps, large)
                raise ExerciseError(str(error) + (f"\n  hint: {hint}" if hint else "")) from None
    # Not counted in the line below (what a student saw printed): inputs where the largest term
    # is not where the easy cases put it, sizes past the printed ones, outputs not NaN beforehand.
    for s, a, eps, kind in _adversarial_lse_cases():
        what = f"{name}, s of shape {tuple(s.shape)}, eps = {eps:g}, {kind} (one value per row; wrong indices are rows)"
        expected = _lse_of_min64(s, a, eps)
        launch = Prefilled(launch_row_logsumexp_of_min, lambda s, *rest: random_fill((s.shape[0],), s.device))
        for how, got in kernel_runs(name, launch, kernel, s, a.contiguous(), eps):
            try:
                compare(what + (f", {how}" if how else ""), got, expected, rtol=1e-5, atol=1e-4,
                        outputs_start_as_nan=False)
            except ExerciseError as error:
                hint = next((_SHIFT_HINTS[shift] for shift in ("-a", "s_max", "none") if not matches(
                    _lse_shifted32(s, a, eps, shift), expected, rtol=1e-5, atol=1e-4)
                    and _same_or_both_undefined(got, _lse_shifted32(s, a, eps, shift))), None)
                if hint is None and isinstance(got, torch.Tensor) and not got.detach().isfinite().all():
                    hint = ("the result is not finite: the value subtracted before tl.exp must be the row's "
                            "largest term in every case (-a_i above or below the scores, scores far from 0)")
                if hint is None and launch.kept_fill(got, expected, rtol=1e-5, atol=1e-4):
                    hint = KEPT_FILL_HINT
                hint = hint or _row_logsumexp_of_min_hint(got, s, a, eps, True)
                raise ExerciseError(str(error) + (f"\n  hint: {hint}" if hint else "")) from None
    say(f"Exercise 4.2 passed: {len(inputs)} cases, widths 1 to 100, scores up to ±1e3, "
          "-a below every score, a sliced and a transposed s.")
    s = torch.randn(16384, 4096, device=DEVICE) if ON_GPU else None
    if s is not None:
        a, out = -s.median(dim=-1).values, torch.empty(16384, device=DEVICE)
    report_speed(name, lambda: launch_row_logsumexp_of_min(kernel, s, a, 0.1, out), 16384 * 4096 * 4 + 2 * 16384 * 4,
                 against=("torch's logsumexp(minimum(s, -a) / eps)",
                          lambda: torch.logsumexp(torch.minimum(s, -a[:, None]) / 0.1, dim=-1)),
                 advice="each program should read its row once, with contiguous columns (cols * stride_s_col, "
                        "stride 1 here), and reduce it in registers: one tl.max and one tl.sum")


# ------------------------------------------------- Exercise 4.3: the whole iteration in one program


def _eps_schedule(n_iters, eps, eps_init=None, eps_decay=1.0):
    """ε of iterations 0 … n_iters − 1, then the ε that y divides by: as references.coor_descent."""
    current, values = max(eps if eps_init is None else eps_init, eps), []
    for _ in range(n_iters + 1):
        values.append(current)
        current = max(current * eps_decay, eps)
    return values


def launch_coor_descent_row(coor_descent_row_kernel, s, k, n_iters, eps=0.1, eps_init=None, eps_decay=1.0,
                            out=None, block=None):
    """How exercise 4.3's checker launches the kernel: one program a row of the 2-D ``s``,
    ``BLOCK`` the next power of 2 of its width (the whole row); ``y`` contiguous, of ``s``'s
    shape, filled with NaN when not given. The ε schedule is references.coor_descent's:
    ``eps_start = max(eps_init, eps)``, then ``ε ← max(ε · eps_decay, eps)`` after each iteration."""
    n_rows, n_cols = s.shape
    if out is None:
        out = torch.full((n_rows, n_cols), float("nan"), device=s.device)
    block = block or triton.next_power_of_2(n_cols)
    eps_start = _eps_schedule(0, eps, eps_init)[0]
    coor_descent_row_kernel[(n_rows,)](s, out, n_cols, s.stride(0), s.stride(1), out.stride(0),
                                       float(k), n_iters, eps_start, float(eps_decay), float(eps),
                                       BLOCK=block, num_warps=_warps(block))
    return out


def _coor_descent_variant64(s, k, n_iters, schedule, *, pad=float("-inf"), count_block=False, clip="min",
                            carried=True, from_zero=False, y_eps_index=-1):
    """y after the scalar recurrence done with one of the usual mistakes, in float64 (the
    defaults give the right y). The row is padded to the kernel's BLOCK lanes, holding
    ``pad``, as a kernel sees it; ``count_block``: n counts those lanes too."""
    s64 = s.detach().to("cpu", torch.float64)
    n = s64.shape[1]
    block = triton.next_power_of_2(n)
    row = torch.cat([s64, s64.new_full((s64.shape[0], block - n), pad)], dim=1)
    epsilons, logk = _eps_schedule(n_iters, **schedule), math.log(k)
    clipped = {"min": lambda a: torch.minimum(row, -a), "max": lambda a: torch.maximum(row, -a),
               "min with a": lambda a: torch.minimum(row, a), "min of s + a and 0": lambda a: torch.clamp(row + a, max=0.0)}[clip]
    if from_zero:  # T steps of the clipped recurrence from a = 0
        a, first = s64.new_zeros(s64.shape[0], 1), 0
    else:  # a_1: s + b = 0 on the n scores of the row
        a, first = s64.new_full((s64.shape[0], 1), epsilons[0] * (logk - math.log(block if count_block else n))), 1
    start = a
    for t in range(first, n_iters):
        a = epsilons[t] * (logk - torch.logsumexp(clipped(a if carried else start) / epsilons[t], dim=-1, keepdim=True))
    return torch.exp(torch.clamp(s64 + a, max=0.0) / epsilons[y_eps_index])


def _coor_descent_shifted32(s, k, n_iters, schedule, shift="none", nan_min=False):
    """The kernel's y in float32 with the value subtracted before the exponential one of the
    usual mistakes: "none" (exp of min(s, -a) / eps directly: inf past exp(88), then a = -inf),
    "-a" (-a_t, the largest min(s_j, -a_t) only when -a_t lies below every score) or "s_max"
    (max_j s_j, the largest only when -a_t lies above them). Once a is NaN, ``nan_min`` takes
    tl.minimum as a GPU computes it (and Triton 3.9's interpreter): the operand that is not
    NaN; without it, NaN, as Triton 3.7's interpreter gives."""
    minimum = torch.fmin if nan_min else torch.minimum
    s32 = s.detach().to("cpu", torch.float32)
    epsilons, logk = _eps_schedule(n_iters, **schedule), math.log(k)
    a = torch.full((s32.shape[0], 1), epsilons[0] * (logk - math.log(s32.shape[1])))
    s_max = s32.amax(dim=-1, keepdim=True)
    for t in range(1, n_iters):
        eps = epsilons[t]
        c = {"none": torch.zeros_like(a), "-a": -a, "s_max": s_max}[shift]
        a = eps * logk - (c + eps * torch.exp((minimum(s32, -a) - c) / eps).sum(-1, keepdim=True).log())
    return torch.exp(minimum(s32 + a, torch.zeros(())) / epsilons[-1]).double()


def _coor_descent_without_max32(s, k, n_iters, schedule):
    """The kernel's y in float32 with the largest term not subtracted."""
    return _coor_descent_shifted32(s, k, n_iters, schedule, "none")


SHIFTS = 6  # the candidates for the value subtracted before the exponential, first in the list


def _coor_descent_row_hint(got, expected, s, k, n_iters, schedule, large, tolerance):
    """The usual mistake behind a wrong y, or None: the first whose y matches ``got`` within
    ``tolerance``, the case's. A mistake that gives the right y on this case (the ε of y when ε
    is fixed, say) says nothing, and is passed over."""
    if not isinstance(got, torch.Tensor) or got.shape != s.shape:
        return None
    overflow = ("exp overflowed float32 (past exp(88) it is inf, and then a = -inf): subtract the largest "
                "min(s_j, -a_t), which is min(max_j s_j, -a_t), before the exponential")
    variant = functools.partial(_coor_descent_variant64, s, k, n_iters, schedule)
    below = ("the value subtracted before the exponential is -a_t, which is the largest min(s_j, -a_t) only "
             "when -a_t lies below every score; in this case it lies above the scores of a row, where every "
             "exponent is then far below 0 and exp gives 0: subtract the largest term itself, whichever side "
             "of the scores -a_t lies on")
    above = ("the value subtracted before the exponential is the largest score, which is the largest "
             "min(s_j, -a_t) only when -a_t lies above it; in this case -a_t lies below the largest score of a "
             "row, where every exponent is then far below 0 and exp gives 0: subtract the largest term itself, "
             "whichever side of the scores -a_t lies on")
    shifted = functools.partial(_coor_descent_shifted32, s, k, n_iters, schedule)
    candidates = [  # the shifts first (SHIFTS of them), each as either NaN rule of tl.minimum computes it
        (lambda: _coor_descent_without_max32(s, k, n_iters, schedule), overflow),
        (lambda: shifted("none", nan_min=True), overflow),
        (lambda: shifted("-a"), below),
        (lambda: shifted("-a", nan_min=True), below),
        (lambda: shifted("s_max"), above),
        (lambda: shifted("s_max", nan_min=True), above),
        (lambda: variant(carried=False),
         "every iteration starts again from a_1: the state is not carried, so assign each new a to the "
         "variable the next iteration reads"),
        (lambda: variant(clip="max"),
         "max(s_j, -a_t) where the recurrence has min(s_j, -a_t): s + b = s - relu(s + a) caps each score at -a"),
        (lambda: variant(clip="min with a"), "the clip is at -a_t, not a_t: s + b = min(s, -a_t)"),
        (lambda: variant(clip="min of s + a and 0"),
         "inside the log-sum-exp the clipped score is min(s_j, -a_t), not min(s_j + a_t, 0) "
         "(which is min(s_j, -a_t) + a_t; that form is the output's)"),
        (lambda: variant(pad=0.0),
         "the lanes past the end of the row count: load them with other=float('-inf'), so that "
         "min(-inf, -a) = -inf and exp gives 0 there"),
        (lambda: variant(count_block=True),
         "the first iteration's n counts the lanes past the end of the row: n is the number of scores "
         "(n_cols), not BLOCK"),
        (lambda: variant(from_zero=True),
         "the first iteration starts from b = -s, where s + b = 0 on every score, so "
         "a_1 = eps_0 (log k - log n): it is not the clipped step applied to a = 0"),
        (lambda: _coor_descent_variant64(s, k, n_iters - 1, schedule) if n_iters > 1 else None,
         f"one iteration fewer than n_iters = {n_iters}: a_1 is the first iteration, so the loop after it "
         "runs n_iters - 1 times"),
        (lambda: _coor_descent_variant64(s, k, n_iters + 1, schedule),
         f"one iteration more than n_iters = {n_iters}: a_1 is the first iteration, so the loop after it "
         "runs n_iters - 1 times"),
        (lambda: variant(y_eps_index=-2),
         "y divides by the ε reached after the last iteration's decay (ε_T), not by the last iteration's "
         "ε_{T-1}: decay once more after the loop"),
    ]
    found = []
    for index, (candidate, text) in enumerate(candidates):
        if found and index >= SHIFTS:  # past the shifts, the first mistake that fits is the one named
            break
        wrong_y = candidate()
        if wrong_y is not None and not matches(wrong_y, expected, **tolerance) and (
                matches(got, wrong_y, **tolerance) or _same_or_both_undefined(got, wrong_y, **tolerance)):
            if text not in found:
                found.append(text)
            if index >= SHIFTS:
                break
    if len(found) > 1:  # no shift at all and a wrong shift give the same y on this case: name each
        return "one of these: " + "; or ".join(found)
    if found:
        return found[0]
    if large and not got.detach().isfinite().all():
        return overflow
    return None


# y divides s + a by ε: one float32 rounding of a (6e-8 |a|) becomes 6e-8 |a| / ε in y, about
# 4e-5 for scores near 20 and ε = 0.05, and the iterations add up a few such roundings.
_TOLERANCE, _LARGE_TOLERANCE = dict(rtol=1e-4, atol=2e-5), dict(rtol=5e-4, atol=5e-4)


def check_coor_descent_row(coor_descent_row_kernel):
    """Exercise 4.3: ``coor_descent_row_kernel``, launched by :func:`launch_coor_descent_row`, runs
    the n_iters iterations of the scalar recurrence on each row of a 2-D float32 s (any strides),
    the row held by one program, and writes y: references.coor_descent's, without a mask."""
    name = "Exercise 4.3 (coor_descent_row_kernel)"
    kernel = require_kernel(name, coor_descent_row_kernel, "coor_descent_row_kernel")
    fixed, falling = dict(eps=0.1), dict(eps=0.03, eps_init=4.0, eps_decay=0.7)
    cases = [  # (s, k, n_iters, ε schedule, what, large scores)
        (torch.randn(3, 5, device=DEVICE), 2.0, 1, fixed, "one iteration", False),
        (torch.randn(4, 17, device=DEVICE), 3.5, 2, fixed, "two iterations", False),
        (torch.randn(5, 100, device=DEVICE), 10.0, 20, fixed, "20 iterations", False),
        (torch.randn(3, 64, device=DEVICE), 8.0, 5, falling, "ε from 4 down by 0.7, 5 iterations", False),
        (torch.randn(2, 100, device=DEVICE), 0.5, 20, falling, "ε from 4 down to 0.03, 20 iterations", False),
        (torch.randn(4, 1, device=DEVICE), 1.0, 3, fixed, "rows of one score", False),
        (torch.randn(3, 40, device=DEVICE), 40.0, 7, dict(eps=0.2), "k = n (every y near 1)", False),
        ((torch.rand(3, 50, device=DEVICE) * 2 - 1) * 20, 5.0, 20, dict(falling, eps=0.05),
         "scores up to ±20, ε down to 0.05 (exp overflows past 88 unless the largest term is subtracted)", True),
    ]
    sliced = torch.randn(4, 48, device=DEVICE)[:, :33]
    cases.append((sliced, 6.0, 10, fixed, f"s = wide[:, :33] whose rows are {sliced.stride(0)} elements apart "
                                          "(use stride_s_row)", False))
    transposed = torch.randn(30, 6, device=DEVICE).t()
    cases.append((transposed, 4.0, 10, fixed, f"a transposed s (strides {transposed.stride()}: use stride_s_col)",
                  False))
    cases += hidden_case(lambda: (torch.randn(random_size(1, 6), random_size(1, 100), device=DEVICE),
                                  float(random_size(1, 12)), random_size(1, 20), falling, "random rows", False))
    for s, k, n_iters, schedule, kind, large in cases:
        settings = ", ".join(f"{key} = {value:g}" for key, value in schedule.items())
        what = f"{name}, s of shape {tuple(s.shape)}, k = {k:g}, n_iters = {n_iters}, {settings}, {kind}"
        expected = references.coor_descent(s.double(), n_iters=n_iters, k=k, **schedule)
        tolerance = _LARGE_TOLERANCE if large else _TOLERANCE
        for how, got in kernel_runs(name, launch_coor_descent_row, kernel, s, k, n_iters, *_launch_schedule(schedule)):
            try:
                compare(what + (f", {how}" if how else ""), got, expected, show_picture=True, **tolerance)
            except ExerciseError as error:
                hint = _coor_descent_row_hint(got, expected, s, k, n_iters, schedule, large, tolerance)
                raise ExerciseError(str(error) + (f"\n  hint: {hint}" if hint else "")) from None
    # Not counted in the line below (what a student saw printed): scores far below and far above 0
    # (the largest term on either side of -a), sizes past the printed ones, outputs not NaN beforehand.
    for s, k, n_iters, schedule, kind in _adversarial_coor_descent_cases():
        settings = ", ".join(f"{key} = {value:g}" for key, value in schedule.items())
        what = f"{name}, s of shape {tuple(s.shape)}, k = {k:g}, n_iters = {n_iters}, {settings}, {kind}"
        expected = references.coor_descent(s.double(), n_iters=n_iters, k=k, **schedule)
        launch = Prefilled(launch_coor_descent_row, lambda s, *rest: random_fill(s.shape, s.device))
        for how, got in kernel_runs(name, launch, kernel, s, k, n_iters, *_launch_schedule(schedule)):
            try:
                compare(what + (f", {how}" if how else ""), got, expected, show_picture=True,
                        outputs_start_as_nan=False, **_LARGE_TOLERANCE)
            except ExerciseError as error:
                hint = _coor_descent_row_hint(got, expected, s, k, n_iters, schedule, True, _LARGE_TOLERANCE)
                if hint is None and launch.kept_fill(got, expected, **_LARGE_TOLERANCE):
                    hint = KEPT_FILL_HINT
                raise ExerciseError(str(error) + (f"\n  hint: {hint}" if hint else "")) from None
    say(f"{name.split(' (')[0]} passed: {len(cases)} cases, rows of 1 to 100 scores, 1 to 20 iterations, "
          "fixed and falling ε, scores up to ±20, a sliced and a transposed s.")
    s = torch.randn(16384, 1024, device=DEVICE) if ON_GPU else None
    out = torch.empty_like(s) if s is not None else None
    from ...kernels.coor_descent_op import coor_descent

    report_speed(name, lambda: launch_coor_descent_row(kernel, s, 128, 20, **falling, out=out), 2 * 16384 * 1024 * 4,
                 against=("course_lib.coor_descent", lambda: coor_descent(s, n_iters=20, k=128, **falling)),
                 # the chapter's answer, one program a row, reaches 0.63 of course_lib's kernel (which splits
                 # long rows) on an H200: the target is what it reaches, the advice for slower answers
                 share=0.5,
                 advice="read s once and keep the row in registers through every iteration; take the row max "
                        "once, before the loop, so that each iteration has one reduction (the largest "
                        "min(s_j, -a) is min(max_j s_j, -a)); and multiply by 1 / eps rather than divide each "
                        "element by eps")


def _adversarial_coor_descent_cases():
    """(s, k, n_iters, schedule, what) that separate the largest term from what is the largest
    in easier cases, and sizes past the printed cases'."""
    falling = dict(eps=0.05, eps_init=2.0, eps_decay=0.7)
    cases = []
    cases.append((torch.randn(4, 40, device=DEVICE) * 2 - 100, 3.0, 8, dict(eps=0.05),
                  "scores near -100 (-a_t above every score at first)"))
    # -a_1 = 0.05 log 1000 lies below every score, by more than 100 ε: every exponent taken from the largest
    # score instead of the largest term is below -103 (exp gives 0 in float32); -a_t then climbs by
    # ε log(n / k) an iteration and reaches the scores before the last.
    cases.append((torch.randn(2, 1000, device=DEVICE) * 0.3 + 6, 1.0, 30, dict(eps=0.05),
                  "2 rows of 1000 scores near +6 (-a_t below every score at first)"))
    mixed = torch.randn(6, 30, device=DEVICE) * 3
    mixed[::2] -= 80
    mixed[1::2] += 80
    cases.append((mixed, 5.0, 12, dict(eps=0.1), "rows near -80 and near +80"))
    cases.append((torch.randn(300, 3, device=DEVICE), 2.0, 4, dict(eps=0.1), "300 rows of 3 scores"))
    cases.append((torch.randn(2, 1500, device=DEVICE) * 3, 40.0, 6, falling, "2 rows of 1500 scores"))
    return cases


def _launch_schedule(schedule):
    """The launcher's (eps, eps_init, eps_decay) from a references.coor_descent schedule."""
    return schedule["eps"], schedule.get("eps_init"), schedule.get("eps_decay", 1.0)
