"""Exercise 7.2's checker: the local-attention forward in bfloat16 with tl.dot."""

import math

import torch
import triton

from ...checking import ExerciseError, compare
from ...student_kernels import report_throughput, require_kernel
from ..common import KEPT_FILL_HINT, Prefilled, random_fill, say
from .attention_shared import (BF16_ATOL, BF16_RTOL, COURSE_LIB_LABEL, LSE_ATOL, LSE_RTOL, SPEED_SHAPE, SPEED_WINDOW,
                               _attention_runs, _bf16, _close_rows, _course_lib_attention, _forward_reference,
                               _listed_attention_cases, _nan_like, _scores, _speed_inputs, _useful_flops,
                               _windowed_attention, _with_a_hidden_attention_case)
from .shared import _as_rows, _with_hint


def launch_local_attention_forward(local_attention_forward_kernel, q, k, v, window, out=None, block_q=16,
                                   block_k=16):
    """How exercise 7.2's checker launches the kernel: q, k, v are (batch·heads, n,
    head_dim) bfloat16 with head_dim contiguous; program (m, bh) writes the outputs of
    queries m * block_q ... of head bh into ``out`` (bfloat16) and their log-sum-exp into
    ``lse`` ((batch·heads, n) float32, contiguous). ``out``: the pair (out, lse) to write
    into; both are filled with NaN when not given. Returns (out, lse)."""
    out, lse = out if out is not None else (_nan_like(q), _nan_like(q[..., 0], torch.float32))
    heads, seq_len, head_dim = q.shape
    grid = (triton.cdiv(seq_len, block_q), heads)
    local_attention_forward_kernel[grid](*map(_as_rows, (q, k, v, out)), lse, seq_len, window, head_dim ** -0.5,
                                         q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                                         v.stride(0), v.stride(1), out.stride(0), out.stride(1),
                                         HEAD_DIM=head_dim, BLOCK_Q=block_q, BLOCK_K=block_k)
    return out, lse


def _tiled_attention(q, k, v, window, scale, block_q, block_k, first_key, *, rescale_sum=True,
                     rescale_acc=True, hidden_score=float("-inf"), last_key=None):
    """The kernel's loop in float64, with a mistake switched on: for each tile of block_q
    queries, the key tiles from ``first_key(start_q)`` to the tile's last query, the
    online softmax with (or without) its rescaling, and hidden scores set to
    ``hidden_score``. Keys past n are zeros, as a load with other=0 gives them. ``last_key(start_q)``:
    where the loop over key tiles stops (exclusive), the tile's last query + 1 when None."""
    q, k, v = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
    heads, n, head_dim = q.shape
    padding = block_q + block_k
    k, v = (torch.cat([t, t.new_zeros(heads, padding, head_dim)], dim=1) for t in (k, v))
    out = torch.empty_like(q)
    for start_q in range(0, n, block_q):
        queries = torch.arange(start_q, min(start_q + block_q, n))
        running_max = torch.full((heads, len(queries)), float("-inf"), dtype=torch.float64)
        running_sum = torch.zeros(heads, len(queries), dtype=torch.float64)
        acc = torch.zeros(heads, len(queries), head_dim, dtype=torch.float64)
        end = min(start_q + block_q, n) if last_key is None else last_key(start_q)
        for start_k in range(first_key(start_q), end, block_k):
            keys = torch.arange(start_k, start_k + block_k)
            scores = q[:, queries] @ k[:, keys].transpose(-1, -2) * scale
            seen = (keys[None, :] <= queries[:, None]) & (keys[None, :] > queries[:, None] - window)
            scores = torch.where(seen, scores, hidden_score)
            new_max = torch.maximum(running_max, scores.amax(dim=-1))
            shift = torch.where(new_max == float("-inf"), 0.0, new_max)
            weights = torch.exp(scores - shift[..., None])
            alpha = torch.exp(running_max - shift)
            running_sum = (running_sum * alpha if rescale_sum else running_sum) + weights.sum(dim=-1)
            acc = (acc * alpha[..., None] if rescale_acc else acc) + weights @ v[:, keys]
            running_max = new_max
        out[:, queries] = acc / running_sum[..., None]
    return out


def _explains(got, expected, candidate, rtol, atol):
    """Whether ``candidate`` (a wrong answer) explains every wrong row of ``got``: each
    row that differs from ``expected`` matches the candidate's (or the candidate has no
    value there: a row that sees no key), and at least one such row has a value."""
    got = got.detach().to("cpu", torch.float64)
    wrong = ~_close_rows(got, expected, rtol, atol)
    undefined = candidate.isnan().any(dim=-1)
    matching = _close_rows(got, candidate, rtol, atol)
    return bool(wrong.any() and (matching | undefined)[wrong].all() and (matching & ~undefined & wrong).any())


def _local_attention_hint(got, q, k, v, window, block_q, block_k, expected, rtol, atol):
    """The usual mistake behind a wrong output of exercise 7.2, or None."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return None
    scale = q.shape[-1] ** -0.5

    def explained_by(candidate):
        return _explains(got, expected, candidate, rtol, atol)

    if explained_by(_windowed_attention(q, k, v, window, 1.0)):
        return ("these are the weights of the unscaled scores q·k: multiply the scores by scale (1/sqrt(head_dim)) "
                "before the softmax")
    if explained_by(_windowed_attention(q, k, v, window, scale, diagonal=False)):
        return "the diagonal is hidden: query i must see key i itself (key j <= query i, not j < i)"
    if explained_by(_windowed_attention(q, k, v, window, scale, window_start=0)):
        return (f"the window is one key too wide: query i sees window = {window} keys, i - window < j <= i, so key "
                "i - window is hidden (>, not >=)")
    # Where a student's loop may start: the tile's first visible key, the tile boundary below it, or key 0.
    first_keys = (lambda start_q: max(0, start_q - window + 1),
                  lambda start_q: max(0, start_q - window + 1) // block_k * block_k,
                  lambda start_q: 0)
    for first_key in first_keys:
        if explained_by(_tiled_attention(q, k, v, window, scale, block_q, block_k, first_key, hidden_score=0.0)):
            return ("hidden keys count as scores of 0, so they still take exp(0 - max) of the softmax: set the "
                    "hidden scores to -inf (float('-inf')), whose exp is 0")
        for rescale_sum, rescale_acc in ((False, True), (True, False), (False, False)):
            candidate = _tiled_attention(q, k, v, window, scale, block_q, block_k, first_key,
                                         rescale_sum=rescale_sum, rescale_acc=rescale_acc)
            if explained_by(candidate):
                missing = " and ".join(name for name, done in (("running sum", rescale_sum),
                                                               ("accumulator", rescale_acc)) if not done)
                verb = "is" if rescale_sum or rescale_acc else "are"
                return (f"the {missing} {verb} not rescaled when the maximum grows. What was added before carries "
                        "exp(score - old max): multiply it by alpha = exp(old max - new max) before adding the "
                        "new tile (acc = acc * alpha[:, None] + tl.dot(p, v))")
    # Where a loop may stop short of the diagonal's tile: at the tile's first query, or one key tile early.
    last_keys = (lambda start_q: start_q, lambda start_q: min(start_q + block_q, q.shape[1]) - block_k,
                 lambda start_q: min(start_q + block_q, q.shape[1]) - 1)
    for first_key in first_keys:
        for last_key in last_keys:
            if explained_by(_tiled_attention(q, k, v, window, scale, block_q, block_k, first_key, last_key=last_key)):
                return ("the loop over key tiles stops before the keys on the diagonal: query i sees key i itself, "
                        "so the tile of keys that holds the tile's own queries must be visited too (the loop's end "
                        "is exclusive: it must lie past the tile's last query, up to seq_len)")
    nan = got.detach().isnan()
    if nan.any() and not nan.all():  # all NaN: nothing was written, as compare says
        return ("NaN where the answer is a number: a query that has seen no visible key yet has running max -inf, "
                "and exp(-inf - (-inf)) is NaN. Shift such a row by 0 instead (as chapter 2's online softmax does); "
                "every real query sees at least itself, so its final sum is never 0")
    return None


def _lse_hint(got, q, k, window, expected):
    """The usual mistake behind a wrong log-sum-exp of exercise 7.2, or None."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return None
    max_score = _scores(q, k, window, q.shape[-1] ** -0.5).amax(dim=-1)

    def explained_by(candidate):  # each query's lse as a row of one element
        return _explains(got[..., None], expected[..., None], candidate[..., None], LSE_RTOL, LSE_ATOL)

    if explained_by(expected - max_score):
        return ("the log-sum-exp lacks the maximum: running_sum adds exp(score - max), so the log of the sum of "
                "exp(score) is running_max + log(running_sum)")
    if explained_by(expected * math.log2(math.e)):
        return ("the log-sum-exp is in base 2 (log2 e times too large): the backward recomputes the weights as "
                "exp(score - lse), so store the natural log, running_max + tl.log(running_sum)")
    return None


def _adversarial_attention_cases():
    """(what, (q, k, v), window): scores far below 0 and far above, and a longer sequence."""
    heads, n, d = 2, 37, 16
    far = (_bf16(heads, n, d, shift=6, spread=0.3), _bf16(heads, n, d, shift=-6, spread=0.3),
           _bf16(heads, n, d))  # scores near -144
    near = (far[0], _bf16(heads, n, d, shift=6, spread=0.3), far[2])  # scores near +144
    long = tuple(_bf16(1, 150, 16) for _ in range(3))
    return [("2 heads of 37 tokens, scores near -144", far, 9), ("2 heads of 37 tokens, scores near +144", near, 9),
            ("1 head of 150 tokens", long, 40)]


def _check_forward_run(label, got, q, k, v, window, block_q, block_k, expected, launch=None):
    """Compare one run's (out, lse) with the reference; name the mistake where one fits."""
    if not (isinstance(got, tuple) and len(got) == 2):
        raise ExerciseError(f"{label}: the launcher returns (out, lse); got {type(got).__name__}")
    prefilled = launch is not None
    for (part, got_part, expected_part), hint in zip(
            (("out", got[0], expected[0]), ("lse", got[1], expected[1])),
            (lambda: _local_attention_hint(got[0], q, k, v, window, block_q, block_k, expected[0], BF16_RTOL,
                                           BF16_ATOL),
             lambda: _lse_hint(got[1], q, k, window, expected[1]))):
        rtol, atol = (BF16_RTOL, BF16_ATOL) if part == "out" else (LSE_RTOL, LSE_ATOL)
        try:
            compare(f"{label}, {part}", got_part, expected_part, rtol=rtol, atol=atol, outputs_start_as_nan=not prefilled)
        except ExerciseError as error:
            named = hint()
            if named is None and prefilled and launch.kept_fill(got_part, expected_part, rtol=rtol, atol=atol):
                named = KEPT_FILL_HINT
            if named is None and prefilled and not got_part.detach().isfinite().all():
                named = ("inf or NaN where the answer is a number, on scores far from 0: the running max must "
                         "start at -inf (not 0) and every exponent be taken after subtracting it")
            raise _with_hint(error, named) from None


def check_local_attention_forward(local_attention_forward_kernel):
    """Exercise 7.2: ``local_attention_forward_kernel``, launched by
    :func:`launch_local_attention_forward`, writes softmax(q kᵀ / sqrt(d)) v where query i
    sees keys i - window < j <= i, for bfloat16 q, k and v on the tensor cores, and each
    query's log-sum-exp."""
    name = "Exercise 7.2 (local_attention_forward_kernel)"
    kernel = require_kernel(name, local_attention_forward_kernel, "local_attention_forward_kernel")
    # (batch·heads, n, head_dim, window, BLOCK_Q, BLOCK_K, q, k and v views of one (bh, n, 3 d) tensor)
    cases = _with_a_hidden_attention_case([
        (2, 37, 16, 5, 16, 16, False), (3, 29, 32, 1, 16, 16, False), (1, 45, 16, 50, 16, 16, False),
        (2, 40, 32, 7, 32, 16, False), (2, 21, 16, 9, 16, 16, True), (1, 1, 16, 3, 16, 16, False)])
    for what, (q, k, v), window, block_q, block_k in _listed_attention_cases(name, cases):
        expected = _forward_reference(q, k, v, window)
        for how, got in _attention_runs(name, launch_local_attention_forward, kernel, q, k, v, window, None,
                                        block_q, block_k):
            _check_forward_run(what + (f", {how}" if how else ""), got, q, k, v, window, block_q, block_k, expected)
    # Not counted in the line below: scores far below and far above 0 (no shift that is the largest
    # only near 0 survives them), a sequence longer than the printed ones, and outputs filled with
    # random values beforehand rather than NaN, a new fill each run.
    for what, (q, k, v), window in _adversarial_attention_cases():
        what = f"{name}, {what}, window {window}, outputs filled with random values beforehand"
        expected = _forward_reference(q, k, v, window)
        launch = Prefilled(launch_local_attention_forward, lambda q, *rest: (
            random_fill(q.shape, q.device, q.dtype), random_fill(q.shape[:2], q.device)))
        for how, got in _attention_runs(name, launch, kernel, q, k, v, window):
            _check_forward_run(what + (f", {how}" if how else ""), got, q, k, v, window, 16, 16, expected, launch)
    say(f"{name.split(' (')[0]} passed: {len(cases)} cases, windows from 1 to past the sequence, n not a "
        "multiple of the tile, head_dim 16 and 32, q, k and v as views, and the log-sum-exp.")
    q, k, v, q4, k4, v4 = _speed_inputs()
    outputs = None if q is None else (torch.empty_like(q), torch.empty(q.shape[:2], device=q.device))
    report_throughput(name, lambda: launch_local_attention_forward(kernel, q, k, v, SPEED_WINDOW, outputs, 64, 64),
                      _useful_flops(*SPEED_SHAPE, SPEED_WINDOW),
                      against=(COURSE_LIB_LABEL, lambda: _course_lib_attention(q4, k4, v4)), share=0.5,
                      advice="visit only the key tiles the query tile can see, from its first query's window to "
                             "its last query, and keep the scores and weights in registers (two tl.dot a key "
                             "tile on bfloat16 tiles, nothing stored in the loop)")
