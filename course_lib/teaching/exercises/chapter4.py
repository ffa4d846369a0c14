"""Checkers of chapter 4, coordinate descent: one function an exercise."""

import math

import torch

from ...core.runtime import DEVICE
from ..checking import ExerciseError, compare, run_student_code
from .common import Exercise, hidden_case, random_size, random_matrix, run_quietly, without_mask_hints, matches

__all__ = ["check_coor_descent_step", "check_routing_weights", "check_row_logsumexp_of_min", "check_da_next_da"]
# The chapter's exercises, in order, for the instructors' notes.
EXERCISES = (
    Exercise('4.1', 'one step of the scalar recurrence', 'check_coor_descent_step', kernel=False, skills='the coordinate-descent update', difficulty=1, minutes=10),
    Exercise('4.2', 'the routing weights', 'check_routing_weights', kernel=False, skills='the weights from a and b', difficulty=1, minutes=10),
    Exercise('4.3', 'the log-sum-exp of the clipped row', 'check_row_logsumexp_of_min', kernel=True, skills='a clipped log-sum-exp in a kernel', difficulty=3, minutes=30),
    Exercise('4.4', 'the derivative of one step', 'check_da_next_da', kernel=False, skills='differentiating the recurrence', difficulty=2, minutes=15),
)



def _step_reference64(s, a, logk, eps):
    """a_{t+1} from a_t the reference's way, through b = -relu(s + a_t); float64, shape s.shape[:-1]."""
    b = -torch.relu(s + a[..., None])
    return eps * (logk - torch.logsumexp((s + b) / eps, dim=-1))


def _step_variant64(s, a, logk, eps, sign=-1.0, eps_outside=True, eps_inside=True):
    """The step with one of the usual mistakes, for hints."""
    inner = torch.minimum(s, sign * a[..., None])
    lse = torch.logsumexp(inner / eps if eps_inside else inner, dim=-1)
    return eps * logk - (eps * lse if eps_outside else lse)


_STEP_MISTAKES = [
    (dict(sign=1.0), "s + b = s - relu(s + a_t) = min(s, -a_t): the minimum is taken with -a_t, not a_t"),
    (dict(eps_outside=False), "a_{t+1} = eps * (log k - LSE(...)): the logsumexp is multiplied by eps too"),
    (dict(eps_inside=False), "divide min(s, -a_t) by eps inside the logsumexp"),
]


def check_coor_descent_step(coor_descent_step):
    """Exercise 4.1: ``coor_descent_step(s, a, logk, eps)`` returns a_{t+1} = eps * log k - eps *
    logsumexp_j(min(s_j, -a_t) / eps) for s (..., n) and a (...) in float64."""
    name = "Exercise 4.1 (coor_descent_step)"
    random_rows = torch.randn(6, 20, dtype=torch.float64)
    nothing_clipped = torch.randn(5, 33, dtype=torch.float64)
    all_clipped = torch.randn(5, 33, dtype=torch.float64)
    large = (torch.rand(7, 100, dtype=torch.float64) * 2 - 1) * 1e3
    batched = torch.randn(2, 3, 17, dtype=torch.float64)
    one = torch.randn(4, 1, dtype=torch.float64)
    cases = [
        (random_rows, -random_rows.quantile(0.7, dim=-1), math.log(5), 0.1, "random rows, -a inside each row"),
        (one, torch.randn(4, dtype=torch.float64), math.log(0.5), 0.3, "rows of one score"),
        (nothing_clipped, -nothing_clipped.amax(dim=-1) - 1, math.log(3), 0.2,
         "-a above every score, so min(s, -a) = s"),
        (all_clipped, -all_clipped.amin(dim=-1) + 1, math.log(3), 0.2,
         "-a below every score, so min(s, -a) = -a everywhere"),
        (batched, -batched.median(dim=-1).values, math.log(4), 0.1, "s of shape (2, 3, 17), a of shape (2, 3)"),
        (large, -large.median(dim=-1).values, math.log(10), 0.01,
         "scores up to ±1e3 with eps = 0.01 (exp overflows: use torch.logsumexp, which subtracts the max)"),
    ]
    cases += hidden_case(lambda: (lambda s: (s, -s.quantile(0.7, dim=-1), math.log(random_size(1, s.shape[-1])), 0.1,
                                         "random rows"))(random_matrix(8, 60)))
    for s, a, logk, eps, kind in cases:
        what = f"{name}, s of shape {tuple(s.shape)}, eps = {eps:g}, {kind}"
        with torch.no_grad():  # the answer must come from the formula, not from autograd
            got = run_student_code(name, coor_descent_step, s.clone(), a.clone(), logk, eps)
        expected = _step_reference64(s, a, logk, eps)
        try:
            compare(f"{what} (one a per row; wrong indices are rows)", got, expected, rtol=1e-9, atol=1e-9)
        except ExerciseError as error:
            hint = next((text for mistake, text in _STEP_MISTAKES
                         if matches(got, _step_variant64(s, a, logk, eps, **mistake))), None)
            if hint is None and isinstance(got, torch.Tensor) and not got.isfinite().all():
                hint = "exp((...) / eps) overflowed: compute the logsumexp with torch.logsumexp"
            raise ExerciseError(str(error) + (f"\n  hint: {hint}" if hint else "")) from None
    print(f"Exercise 4.1 passed: {len(cases)} cases, -a inside, above and below the scores, "
          "batched rows and scores up to ±1e3.")


def _routing_reference64(a, s, eps, mask):
    """y = exp((s + a + b) / eps) with b = -relu(s + a), exactly 0 where mask is False."""
    shifted = s + a[..., None]
    y = torch.exp((shifted - torch.relu(shifted)) / eps)
    return y if mask is None else y.masked_fill(~mask, 0.0)


def check_routing_weights(routing_weights):
    """Exercise 4.2: ``routing_weights(a, s, eps, mask=None)`` returns y = exp(min(s + a, 0) / eps),
    exactly 0 where mask is False, for s (..., n) and a (...) in float64."""
    name = "Exercise 4.2 (routing_weights)"
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
        what = f"{name}, s of shape {tuple(s.shape)}, eps = {eps:g}, {kind}"
        with torch.no_grad():
            got = run_student_code(name, routing_weights, a.clone(), s.clone(), eps,
                                   None if m is None else m.clone())
        expected = _routing_reference64(a, s, eps, m)
        try:
            compare(what, got, expected, rtol=1e-9, atol=1e-12, show_picture=s.ndim == 2)
        except ExerciseError as error:
            hint = None
            if isinstance(got, torch.Tensor) and got.shape == expected.shape:
                got64 = got.detach().to("cpu", torch.float64)
                wrong = ~torch.isclose(got64, expected, rtol=1e-9, atol=1e-12)
                if (got64 > 1 + 1e-9).any():
                    hint = ("y = exp(min(s + a, 0) / eps) never exceeds 1: take the minimum with 0 "
                            "(that is what b = -relu(s + a) does)")
                elif m is not None and not (wrong & m).any():
                    if got64[~m].isnan().any():
                        hint = ("only masked positions are wrong, and they are NaN: the scores there may hold "
                                "anything, and NaN * 0 is NaN, so multiplying by the mask is not enough; use "
                                "torch.where(mask, y, 0.0) or y.masked_fill(~mask, 0.0)")
                    else:
                        hint = "only masked positions are wrong: y must be exactly 0 where mask is False"
            raise ExerciseError(without_mask_hints(error) + (f"\n  hint: {hint}" if hint else "")) from None
    print(f"Exercise 4.2 passed: {len(cases)} cases, with and without masks, NaN under the mask, "
          "y clipped at 1 and batched rows.")


def _lse_of_min64(s, a, eps, pad=0, sign=-1.0, divide=True):
    """logsumexp_j(min(s_j, -a) / eps) per row in float64; pad > 0 adds lanes that loaded 0, for hints."""
    s = s.detach().to("cpu", torch.float64)
    a = a.detach().to("cpu", torch.float64)
    if pad:
        s = torch.cat([s, s.new_zeros(s.shape[0], pad)], dim=1)
    inner = torch.minimum(s, sign * a[:, None])
    return torch.logsumexp(inner / eps if divide else inner, dim=-1)


def check_row_logsumexp_of_min(row_logsumexp_of_min):
    """Exercise 4.3: ``row_logsumexp_of_min(s, a, eps)`` returns logsumexp_j(min(s_ij, -a_i) / eps)
    for each row i of a 2-D float32 s, with a of shape (rows,)."""
    name = "Exercise 4.3 (row_logsumexp_of_min)"
    inputs = []
    for n_rows, n_cols in [(4, 1), (6, 3), (5, 16), (9, 17), (7, 100)] + hidden_case(lambda: (random_size(1, 20), random_size(1, 150))):
        s = torch.randn(n_rows, n_cols, device=DEVICE)
        inputs.append((s, -s.median(dim=-1).values, 0.1, ""))
    large = (torch.rand(7, 100, device=DEVICE) * 2 - 1) * 1e3
    inputs.append((large, -large.median(dim=-1).values, 0.01,
                   " with scores up to ±1e3 and eps = 0.01 (exp overflows unless the row max is subtracted first)"))
    below = torch.randn(5, 20, device=DEVICE)
    inputs.append((below, -below.amin(dim=-1) + 2, 0.1, " with -a below every score (min(s, -a) = -a everywhere)"))
    sliced = torch.randn(12, 40, device=DEVICE)[:, :33]
    inputs.append((sliced, -sliced.median(dim=-1).values, 0.1,
                   f", s = wide[:, :33] whose rows are {sliced.stride(0)} elements apart (use stride_s_row)"))
    for s, a, eps, kind in inputs:
        n_cols = s.shape[1]
        what = f"{name}, s of shape {tuple(s.shape)}, eps = {eps:g}{kind}"
        got = run_quietly(name, row_logsumexp_of_min, s, a.contiguous(), eps)
        expected = _lse_of_min64(s, a, eps)
        try:
            compare(f"{what} (one value per row; wrong indices are rows)", got, expected, rtol=1e-5, atol=1e-4)
        except ExerciseError as error:
            pad = (1 << (n_cols - 1).bit_length()) - n_cols
            candidates = [
                (_lse_of_min64(s, a, eps, sign=1.0), "the minimum is taken with -a_i, not a_i"),
                (_lse_of_min64(s, a, eps, divide=False), "divide min(s, -a) by eps before the exponential"),
            ]
            if pad:
                candidates.append((_lse_of_min64(s, a, eps, pad=pad),
                                   "the lanes past the end of the row count: load them with "
                                   "other=float('-inf'), so that min(-inf, -a) = -inf and exp gives 0"))
            hint = next((text for candidate, text in candidates if matches(got, candidate, rtol=1e-5, atol=1e-4)),
                        None)
            raise ExerciseError(str(error) + (f"\n  hint: {hint}" if hint else "")) from None
    print(f"Exercise 4.3 passed: {len(inputs)} cases, widths 1 to 100, scores up to ±1e3, "
          "-a below every score and a sliced s.")


def _da_next_da64(s, a, eps):
    """d a_{t+1} / d a_t by autograd through the reference's step (log k plays no part)."""
    a = a.detach().clone().requires_grad_()
    (grad,) = torch.autograd.grad(_step_reference64(s, a, math.log(3.0), eps).sum(), a)
    return grad


def _da_variants64(s, a, eps):
    """(answer, hint) for the usual mistakes."""
    clipped = s > -a[..., None]
    p = torch.softmax(torch.minimum(s, -a[..., None]) / eps, dim=-1)
    right = (p * clipped).sum(dim=-1)
    return [
        ((p * ~clipped).sum(dim=-1), "a_t enters where the minimum takes -a_t, that is where s_j > -a_t, "
                                     "not where it takes s_j"),
        (-right, "the sign: a_{t+1} = ... - eps * LSE(min(s, -a_t) / eps), and min(s_j, -a_t) falls as a_t "
                 "rises, so the two minus signs cancel"),
        (eps * right, "no factor eps: the eps in front of the logsumexp cancels the 1/eps inside it"),
        (right / eps, "no factor 1/eps: the eps in front of the logsumexp cancels the 1/eps inside it"),
        ((torch.softmax(s / eps, dim=-1) * clipped).sum(dim=-1),
         "p is the softmax of min(s, -a_t) / eps, the terms of the logsumexp, not of s / eps"),
        (torch.ones_like(right), "the sum of all p_j is 1: only positions where the minimum takes -a_t count"),
    ]


def check_da_next_da(da_next_da):
    """Exercise 4.4: ``da_next_da(s, a, eps)`` returns d a_{t+1} / d a_t = sum_j p_j [s_j > -a_t],
    p = softmax(min(s, -a_t) / eps), for s (..., n) and a (...) in float64, without autograd."""
    name = "Exercise 4.4 (da_next_da)"
    random_rows = torch.randn(6, 20, dtype=torch.float64)
    smooth = torch.randn(4, 30, dtype=torch.float64)
    edges = torch.randn(4, 15, dtype=torch.float64)
    batched = torch.randn(2, 3, 17, dtype=torch.float64)
    one = torch.randn(4, 1, dtype=torch.float64)
    cases = [
        (random_rows, -random_rows.quantile(0.6, dim=-1), 0.1, "random rows, -a inside each row"),
        (smooth, -smooth.quantile(0.8, dim=-1), 0.7, "a large eps"),
        (edges, torch.cat([-edges[:2].amin(dim=-1) + 1, -edges[2:].amax(dim=-1) - 1]), 0.1,
         "-a below every score (rows 0-1) and above every score (rows 2-3)"),
        (one, torch.tensor([-1.0, 1.0, -1.0, 1.0], dtype=torch.float64) - one[:, 0], 0.3, "rows of one score"),
        (batched, -batched.median(dim=-1).values, 0.2, "s of shape (2, 3, 17), a of shape (2, 3)"),
    ]
    cases += hidden_case(lambda: (lambda s: (s, -s.quantile(0.6, dim=-1), 0.1, "random rows"))(random_matrix(8, 60)))
    for s, a, eps, kind in cases:
        what = f"{name}, s of shape {tuple(s.shape)}, eps = {eps:g}, {kind}"
        with torch.no_grad():  # the answer must come from the formula, not from autograd
            got = run_student_code(name, da_next_da, s.clone(), a.clone(), eps)
        expected = _da_next_da64(s, a, eps)
        try:
            compare(f"{what} (one derivative per row; wrong indices are rows)", got, expected,
                    rtol=1e-9, atol=1e-12)
        except ExerciseError as error:
            hint = next((text for candidate, text in _da_variants64(s, a, eps) if matches(got, candidate)), None)
            raise ExerciseError(str(error) + (f"\n  hint: {hint}" if hint else "")) from None
    print(f"Exercise 4.4 passed: {len(cases)} cases, -a inside, below and above the scores, "
          "a large eps and batched rows.")
