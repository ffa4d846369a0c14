"""Exercise 7.3's checker: the local-attention backward with tl.dot."""

import math

import torch
import triton

from ...checking import ExerciseError, compare
from ...student_kernels import report_throughput, require_kernel
from ..common import KEPT_FILL_HINT, Prefilled, random_fill, say
from .attention_shared import (BF16_ATOL, BF16_RTOL, COURSE_LIB_LABEL, SPEED_SHAPE, SPEED_WINDOW, _attention_runs,
                               _bf16, _close_rows, _course_lib_attention, _forward_reference, _listed_attention_cases,
                               _nan_like, _speed_inputs, _useful_flops, _visible, _windowed_attention,
                               _with_a_hidden_attention_case)
from .shared import _as_rows, _with_hint


def launch_local_attention_backward(local_attention_backward_kernel, q, k, v, forward_out, grad_out, lse, window,
                                    out=None, block_q=16, block_k=16):
    """How exercise 7.3's checker launches the kernel: q, k, v, the forward's output
    ``forward_out`` and ``grad_out`` are (batch·heads, n, head_dim) bfloat16, q, k and v
    with one layout, grad_out contiguous; ``lse`` is the forward's (batch·heads, n) float32.
    delta = rowsum(grad_out ∘ forward_out) is computed here in float32. Then two launches:
    FOR_KEYS=True, program (t, bh) writes dk and dv of keys t * block_k ... of head bh;
    FOR_KEYS=False, program (t, bh) writes dq of queries t * block_q .... ``out``: the
    triple (dq, dk, dv) to write into, contiguous bfloat16 (NaN-filled when not given).
    Returns (dq, dk, dv)."""
    grad_q, grad_k, grad_v = out if out is not None else (_nan_like(q) for _ in range(3))
    delta = (forward_out.float() * grad_out.float()).sum(dim=-1)
    heads, seq_len, head_dim = q.shape
    arguments = (*map(_as_rows, (q, k, v, grad_out)), lse, delta, *map(_as_rows, (grad_q, grad_k, grad_v)),
                 seq_len, window, head_dim ** -0.5, q.stride(0), q.stride(1), grad_q.stride(0), grad_q.stride(1))
    for for_keys, block in ((True, block_k), (False, block_q)):
        local_attention_backward_kernel[(triton.cdiv(seq_len, block), heads)](
            *arguments, HEAD_DIM=head_dim, BLOCK_Q=block_q, BLOCK_K=block_k, FOR_KEYS=for_keys)
    return grad_q, grad_k, grad_v


def _backward_inputs(q, k, v, window):
    """What the backward is given besides q, k and v: the forward's output (bfloat16) and
    log-sum-exp (float32), computed in float64, and a random grad_out."""
    out, lse = _forward_reference(q, k, v, window)
    grad_out = torch.randn(q.shape, device=q.device).to(torch.bfloat16)
    return out.to(q.device, torch.bfloat16), grad_out, lse.to(q.device, torch.float32)


def _backward_reference(q, k, v, grad_out, window):
    """(dq, dk, dv) of the windowed attention, by torch's autograd in float64."""
    q, k, v = (t.detach().to("cpu", torch.float64).requires_grad_() for t in (q, k, v))
    out = _windowed_attention(q, k, v, window, q.shape[-1] ** -0.5)
    return torch.autograd.grad(out, (q, k, v), grad_out.to("cpu", torch.float64))


def _adversarial_backward_cases():
    """(what, (q, k, v), window): a longer sequence. Not the forward's scores far from 0, nor
    scores spread wide: there dq = dS k and dk = dSᵀ q sum terms far larger than their
    result, and the bfloat16 roundings of dS and of the forward's output (which delta is
    computed from) leave errors past a bfloat16 tolerance in the course's own answer."""
    return [("1 head of 150 tokens", tuple(_bf16(1, 150, 16) for _ in range(3)), 40)]


def _pairs_by_tiles(n, block_rows, block_cols, first_col, end_col):
    """(n, n) bool: the (row, column) pairs a loop visits, program by program: for each tile
    of block_rows rows from start, the tiles of block_cols columns from first_col(start) on
    while before end_col(start), within 0 ... n - 1."""
    pairs = torch.zeros(n, n, dtype=torch.bool)
    for start in range(0, n, block_rows):
        for col in range(first_col(start), end_col(start), block_cols):
            pairs[start:start + block_rows, max(col, 0):max(col + block_cols, 0)] = True
    return pairs


def _pass_gradients(inputs, pairs, *, subtract_delta=True, scaled=True, weights=None):
    """One pass of the backward in float64, with a mistake switched on: P on ``pairs`` (the
    (query, key) pairs the pass counts, bool (n, n)), 0 elsewhere, recomputed as
    ``weights(scores, lse)`` (exp(scores - lse) when None; lse a column); returns (dq, dk, dv)."""
    q, k, v, grad_out, lse, delta, scale = inputs
    scores = q @ k.transpose(-1, -2) * scale
    lse = lse[..., None]
    p = torch.exp(scores - lse) if weights is None else weights(scores, lse)
    p = torch.where(pairs, p, 0.0)
    grad_p = grad_out @ v.transpose(-1, -2)
    grad_scores = p * (grad_p - delta[..., None] if subtract_delta else grad_p)
    factor = scale if scaled else 1.0
    return grad_scores @ k * factor, grad_scores.transpose(-1, -2) @ q * factor, p.transpose(-1, -2) @ grad_out


def _local_attention_backward_hint(got, q, k, v, forward_out, grad_out, lse, window, block_q, block_k, expected):
    """The usual mistake behind wrong gradients of exercise 7.3, or None: each candidate is
    the solution with one mistake in the pass over key tiles (dk, dv), the pass over query
    tiles (dq) or both, and it must match all three gradients."""
    if not (isinstance(got, tuple) and len(got) == 3) or any(
            not isinstance(g, torch.Tensor) or g.shape != e.shape for g, e in zip(got, expected)):
        return None
    got = [g.detach().to("cpu", torch.float64) for g in got]
    n = q.shape[1]
    delta = (forward_out.double() * grad_out.double()).sum(dim=-1)
    inputs = tuple(t.detach().to("cpu", torch.float64) for t in (q, k, v, grad_out, lse, delta)) + (
        q.shape[-1] ** -0.5,)
    # The (query, key) pairs each pass visits, tile by tile, as the solution's loops bound them.
    tiles = {"kv": _pairs_by_tiles(n, block_k, block_q, lambda start_k: start_k,
                                   lambda start_k: min(start_k + block_k - 1 + window, n)).T,
             "q": _pairs_by_tiles(n, block_q, block_k, lambda start_q: max(start_q - window + 1, 0),
                                  lambda start_q: min(start_q + block_q, n))}
    visible = _visible(n, window)
    both = ("q", "kv")
    # (the mistake: what it changes in a pass, the passes it can be in, its message)
    mistakes = [
        (dict(subtract_delta=False), both,
         "dS lacks the - D: the softmax's gradient is dS = P ∘ (dP - D), where D_i = Σ_j P_ij dP_ij = "
         "rowsum(dO ∘ O) is the delta the launcher passes: subtract delta[:, None] from dP"),
        (dict(scaled=False), both,
         "{grads} 1/scale times too large: the scores are q·kᵀ·scale, so their gradient carries the factor "
         "scale into dq and dk alike (dS = P ∘ (dP - D) · scale)"),
        (dict(weights=lambda scores, lse: torch.exp(scores)), both,
         "P is recomputed without the saved log-sum-exp: the forward's weights are P = exp(scores - lse), lse "
         "holding each query's maximum and the log of its sum"),
        (dict(weights=lambda scores, lse: torch.exp(scores - lse * math.log(2))), both,
         "P mixes bases: the lse is a natural log, so P = exp(scores - lse), or exp2((scores - lse) · log2(e)); "
         "exp2(scores · log2(e) - lse) is another number"),
        (dict(weights=lambda scores, lse: torch.exp2(scores - lse)), both,
         "P mixes bases: the lse is a natural log, so P = exp(scores - lse), or exp2((scores - lse) · log2(e))"),
        (dict(mask=_visible(n, window, diagonal=False)), both,
         "the diagonal is hidden in the backward: query i sees key i itself (key j <= query i, not j < i)"),
        (dict(mask=_visible(n, window, window_start=0)), both,
         f"the backward's window is one key too wide: query i sees window = {window} keys, i - window < j <= i"),
        (dict(mask=_visible(n, n + 1)), both,
         "keys before the window count in the backward: P must be 0 outside i - window < j <= i, at both ends "
         "(the tiles a loop visits hold such pairs too)"),
        (dict(mask=torch.ones(n, n, dtype=torch.bool)), both,
         "nothing is hidden in the backward: the tiles a loop visits hold pairs that query i does not see (later "
         "keys, keys before its window), whose P must be 0: tl.where(visible, tl.exp(scores - lse), 0.0)"),
        (dict(tiles=_pairs_by_tiles(n, block_k, block_q, lambda start_k: max(start_k - window + 1, 0),
                                    lambda start_k: min(start_k + block_k, n)).T), ("kv",),
         "dk and dv miss queries: the queries that see key j are j ... j + window - 1, after it, so the loop over "
         "query tiles runs from the key tile's first key to its last key + window - 1 (not over the forward's "
         "key range, which lies before the tile)"),
        (dict(tiles=_pairs_by_tiles(n, block_k, block_q, lambda start_k: start_k,
                                    lambda start_k: min(start_k + window, n)).T), ("kv",),
         "dk and dv of the tile's later keys miss their last queries: key j is seen up to query j + window - 1, "
         "so the loop over query tiles must reach the tile's last key + window - 1, not its first key's"),
        (dict(tiles=_pairs_by_tiles(n, block_q, block_k, lambda start_q: max(start_q - window + 1, 0),
                                    lambda start_q: start_q)), ("q",),
         "dq misses the keys on the diagonal: the loop over key tiles must visit the tile that holds the tile's "
         "own queries too (its end is exclusive: past the tile's last query, up to seq_len)"),
    ]

    def pass_options(side, mistake):
        mistake = dict(mistake)
        pairs = mistake.pop("mask", visible) & mistake.pop("tiles", tiles[side])
        return dict(pairs=pairs, **mistake)

    def explains(q_mistake, kv_mistake):
        dq = _pass_gradients(inputs, **pass_options("q", q_mistake))[0]
        candidate = (dq, *_pass_gradients(inputs, **pass_options("kv", kv_mistake))[1:])
        # The products round P and dS to bfloat16, so gradients of large candidates (exp(scores)
        # without the lse) are off by more than the tolerance: a match within 5% of their size.
        return all(_close_rows(g, c, 0.05, BF16_ATOL + 0.05 * float(c.pow(2).mean().sqrt())).all()
                   for g, c in zip(got, candidate))

    for mistake, passes, message in mistakes:
        for wrong in ((both, ("q",), ("kv",)) if passes == both else (passes,)):
            if not explains(mistake if "q" in wrong else {}, mistake if "kv" in wrong else {}):
                continue
            if "{grads}" in message:
                return message.format(grads={both: "dq and dk are", ("q",): "dq is (dk is right)",
                                             ("kv",): "dk is (dq is right)"}[wrong])
            if wrong == passes:
                return message
            return message + (" (in the pass over query tiles, for dq)" if wrong == ("q",) else
                              " (in the pass over key tiles, for dk and dv)")
    return None


def _kept_fill(launch, index, got, expected):
    """Prefilled.kept_fill for output ``index`` of several outputs of one shape."""
    single = Prefilled(None, None)
    single.fills = [launch.fills[-1][index]]
    return single.kept_fill(got, expected, rtol=BF16_RTOL, atol=BF16_ATOL)


def _check_backward_run(label, got, inputs, window, block_q, block_k, expected, launch=None):
    """Compare one run's (dq, dk, dv) with the reference; name the mistake where one fits."""
    if not (isinstance(got, tuple) and len(got) == 3):
        raise ExerciseError(f"{label}: the launcher returns (dq, dk, dv); got {type(got).__name__}")
    for index, (part, got_part, expected_part) in enumerate(zip(("dq", "dk", "dv"), got, expected)):
        try:
            compare(f"{label}, {part}", got_part, expected_part, rtol=BF16_RTOL, atol=BF16_ATOL,
                    outputs_start_as_nan=launch is None)
        except ExerciseError as error:
            hint = _local_attention_backward_hint(got, *inputs, window, block_q, block_k, expected)
            if hint is None and launch is not None and _kept_fill(launch, index, got_part, expected_part):
                hint = KEPT_FILL_HINT
            raise _with_hint(error, hint) from None


def check_local_attention_backward(local_attention_backward_kernel):
    """Exercise 7.3: ``local_attention_backward_kernel``, launched twice by
    :func:`launch_local_attention_backward`, writes dk and dv (FOR_KEYS) and dq of the
    local attention of exercise 7.2 from the forward's output and log-sum-exp."""
    name = "Exercise 7.3 (local_attention_backward_kernel)"
    kernel = require_kernel(name, local_attention_backward_kernel, "local_attention_backward_kernel")
    # (batch·heads, n, head_dim, window, BLOCK_Q, BLOCK_K, q, k and v views of one (bh, n, 3 d) tensor)
    cases = _with_a_hidden_attention_case([
        (2, 37, 16, 5, 16, 16, False), (1, 45, 16, 50, 16, 16, False), (2, 40, 32, 7, 32, 16, False),
        (1, 40, 16, 12, 16, 32, False), (2, 21, 16, 9, 16, 16, True), (1, 1, 16, 3, 16, 16, False)])
    for what, (q, k, v), window, block_q, block_k in _listed_attention_cases(name, cases):
        inputs = (q, k, v, *_backward_inputs(q, k, v, window))
        expected = _backward_reference(q, k, v, inputs[4], window)
        for how, got in _attention_runs(name, launch_local_attention_backward, kernel, *inputs, window, None,
                                        block_q, block_k):
            _check_backward_run(what + (f", {how}" if how else ""), got, inputs, window, block_q, block_k, expected)
    # Not counted in the line below: a sequence longer than the printed ones, with gradients filled
    # with random values beforehand rather than NaN, a new fill each run.
    for what, (q, k, v), window in _adversarial_backward_cases():
        what = f"{name}, {what}, window {window}, gradients filled with random values beforehand"
        inputs = (q, k, v, *_backward_inputs(q, k, v, window))
        expected = _backward_reference(q, k, v, inputs[4], window)
        launch = Prefilled(launch_local_attention_backward, lambda q, *rest: tuple(
            random_fill(q.shape, q.device, q.dtype) for _ in range(3)))
        for how, got in _attention_runs(name, launch, kernel, *inputs, window):
            _check_backward_run(what + (f", {how}" if how else ""), got, inputs, window, 16, 16, expected, launch)
    say(f"{name.split(' (')[0]} passed: {len(cases)} cases, dq, dk and dv, windows from 1 to past the sequence, "
        "n not a multiple of the tiles, query and key tiles of different sizes, q, k and v as views.")
    q, k, v, q4, k4, v4 = _speed_inputs()
    if q is not None:
        from ....kernels.local_attention_op import local_attention_forward

        # The forward's output and lse of a window of SPEED_WINDOW (course_lib's fixed windows:
        # values of the right size; the speed does not depend on them).
        forward_out, lse = local_attention_forward(q4, k4, v4, SPEED_WINDOW)
        forward_out = forward_out.reshape(q.shape)
        grad_out = torch.randn_like(q)
        grads = tuple(torch.empty_like(q) for _ in range(3))
        q4, k4, v4 = (t.detach().requires_grad_() for t in (q4, k4, v4))
        course_lib_out = _course_lib_attention(q4, k4, v4)
        grad_out4 = grad_out.view(SPEED_SHAPE)
    # FlashAttention-2's count: the backward is 2.5 times the forward's flops (five products of
    # the same size, the scores recomputed once).
    report_throughput(name, lambda: launch_local_attention_backward(kernel, q, k, v, forward_out, grad_out, lse,
                                                                    SPEED_WINDOW, grads, 64, 64),
                      _useful_flops(*SPEED_SHAPE, SPEED_WINDOW) * 5 // 2,
                      against=(f"the backward of {COURSE_LIB_LABEL}",
                               lambda: torch.autograd.grad(course_lib_out, (q4, k4, v4), grad_out4,
                                                           retain_graph=True)),
                      share=0.5,
                      advice="give each pass only the tiles that hold visible pairs (the key tiles' pass: the "
                             "queries from the tile's first key to its last key + window - 1), keep P and dS in "
                             "registers, and make every product a tl.dot of bfloat16 tiles")
