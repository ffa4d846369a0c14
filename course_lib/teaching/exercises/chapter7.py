"""Checkers of chapter 7, routed block: one function an exercise."""

import math
import warnings

import torch
import triton

from ...core.runtime import DEVICE, ON_GPU
from ..checking import ExerciseError, compare
from ..student_kernels import kernel_runs, report_speed, report_throughput, require_kernel
from .common import KEPT_FILL_HINT, Exercise, Prefilled, hidden_case, random_fill, random_size, say

__all__ = ["launch_add_routed_rows", "check_add_routed_rows",
           "launch_local_attention_forward", "check_local_attention_forward",
           "launch_local_attention_backward", "check_local_attention_backward"]
# The chapter's exercises, in order, for the instructors' notes.
EXERCISES = (
    Exercise('7.1', 'add the heavy rows back', 'check_add_routed_rows', kernel=True, skills='index loads, gather and scatter addresses, a read-modify-write', difficulty=3, minutes=30),
    Exercise('7.2', 'the local-attention forward in bfloat16 with tl.dot', 'check_local_attention_forward', kernel=True, skills='tl.dot on bfloat16 tiles with float32 sums, the online softmax across key tiles, causal and window masks, loop bounds from the mask, the log-sum-exp for the backward', difficulty=5, minutes=90),
    Exercise('7.3', 'the local-attention backward with tl.dot', 'check_local_attention_backward', kernel=True, skills='the FlashAttention-2 backward: P recomputed from the log-sum-exp, dS = P ∘ (dP - D), a pass over key tiles for dk and dv and one over query tiles for dq, the loop bounds of each', difficulty=5, minutes=120),
)


def _as_rows(t):
    """t (..., d) as the 2-D view of its rows where its strides allow: the same memory, and
    what the picture of an out-of-bounds access can draw (it draws 1-D and 2-D tensors)."""
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:
        return t


def _with_hint(error, hint):
    return ExerciseError(f"{error}\n  hint: {hint}") if hint else error


# ------------------------------------------------------------------ 7.1: add the heavy rows back


def launch_add_routed_rows(add_routed_rows_kernel, light, heavy, indices, out=None, block_tokens=8, block_dim=32):
    """How exercise 7.1's checker launches the kernel: ``out`` starts as a copy of ``light``
    (b, n, d) (or is the given tensor, which the kernel changes in place), and program
    (t, c, b) adds the heavy rows ``heavy[b, r]`` of routed tokens ``r`` of tile t, columns
    of tile c, into row ``indices[b, r]`` of ``out[b]``. Returns ``out``."""
    if out is None:
        out = light.clone()
    batch, num_routed, dim = heavy.shape
    grid = (triton.cdiv(num_routed, block_tokens), triton.cdiv(dim, block_dim), batch)
    add_routed_rows_kernel[grid](_as_rows(out), _as_rows(heavy), indices, num_routed, dim, out.stride(0), out.stride(1),
                                 heavy.stride(0), heavy.stride(1), indices.stride(0),
                                 BLOCK_TOKENS=block_tokens, BLOCK_DIM=block_dim)
    return out


def _add_routed_rows_hint(got, light, heavy, indices):
    """The usual mistake behind a wrong answer of exercise 7.1, or None."""
    if not isinstance(got, torch.Tensor) or got.shape != light.shape:
        return None
    got, light, heavy, indices = (t.detach().cpu() for t in (got, light, heavy, indices))
    if torch.equal(got, light):
        return "out is the light output unchanged: no heavy row was added (is there a store, and is its mask right?)"
    routed = torch.zeros(light.shape[:2], dtype=torch.bool).scatter(1, indices, True)
    if got.shape[0] > 1:
        into_first = light.clone()
        for b in range(light.shape[0]):
            into_first[0].index_add_(0, indices[b], heavy[b])
        if torch.allclose(got, into_first, rtol=1e-5, atol=1e-6):
            return ("every sequence's heavy rows were added into the first sequence: the program of sequence b "
                    "starts at b * stride_out_b in out (and b * stride_heavy_b, b * stride_indices_b)")
    if not torch.equal(got[~routed], light[~routed]):
        return ("rows the router did not pick have changed. An index is a row number, not an address: row p of "
                "a sequence starts p * stride_out_n elements after the sequence's first row")
    picked = indices[..., None].expand(-1, -1, light.shape[-1])
    if torch.equal(got.gather(1, picked), heavy):
        return ("the routed rows hold the heavy rows alone, and the light branch's output there is lost: the "
                "block adds the two, so load what out holds, add, and store the sum")
    return None


def check_add_routed_rows(add_routed_rows_kernel):
    """Exercise 7.1: ``add_routed_rows_kernel``, launched by :func:`launch_add_routed_rows`,
    adds ``heavy[b, r]`` into ``out[b, indices[b, r]]`` for every sequence b and routed
    token r, leaving the other rows of ``out`` (the light branch's output) as they are."""
    name = "Exercise 7.1 (add_routed_rows_kernel)"
    kernel = require_kernel(name, add_routed_rows_kernel, "add_routed_rows_kernel")

    def check_case(what, light, heavy, indices):
        expected = light.clone()
        for b in range(light.shape[0]):
            expected[b].index_add_(0, indices[b], heavy[b])
        for how, got in kernel_runs(name, launch_add_routed_rows, kernel, light, heavy, indices):
            try:
                compare(f"{what}" + (f", {how}" if how else ""), got, expected, rtol=1e-6, atol=0)
            except ExerciseError as error:
                raise _with_hint(error, _add_routed_rows_hint(got, light, heavy, indices)) from None

    cases = [(1, 1, 1, 1, False), (2, 9, 5, 3, False), (3, 40, 20, 70, False), (2, 16, 16, 33, True)]
    cases += hidden_case(lambda: (lambda n: (random_size(1, 3), n, random_size(1, n), random_size(1, 80), False))(
        random_size(1, 50)))
    for batch, seq_len, num_routed, dim, sliced in cases:
        what = (f"{name}, {batch} sequence{'s' * (batch > 1)} of {seq_len} token{'s' * (seq_len > 1)} of width "
                f"{dim}, {num_routed} routed")
        light = torch.randn(batch, seq_len, dim, device=DEVICE)
        if sliced:  # the heavy rows as a view of a wider tensor: stride_heavy_k is not dim
            heavy = torch.randn(batch, num_routed, dim + 7, device=DEVICE)[..., :dim]
            what += f", heavy a view whose rows are {heavy.stride(1)} elements apart"
        else:
            heavy = torch.randn(batch, num_routed, dim, device=DEVICE)
        indices = torch.rand(batch, seq_len, device=DEVICE).topk(num_routed, dim=-1).indices  # distinct, any order
        check_case(what, light, heavy, indices)
    # Not counted in the line below: sizes past the printed cases' (a long sequence, many routed tokens,
    # a wide row), one sequence's positions all routed in reverse order.
    for batch, seq_len, num_routed, dim in ((2, 300, 130, 70), (1, 40, 40, 200)):
        what = f"{name}, {batch} sequence(s) of {seq_len} tokens of width {dim}, {num_routed} routed"
        light = torch.randn(batch, seq_len, dim, device=DEVICE)
        heavy = torch.randn(batch, num_routed, dim, device=DEVICE)
        indices = torch.rand(batch, seq_len, device=DEVICE).topk(num_routed, dim=-1).indices
        check_case(what, light, heavy, indices)
    say(f"{name.split(' (')[0]} passed: {len(cases)} shapes, the routed rows added and the others untouched.")
    batch, seq_len, num_routed, dim = 8, 4096, 512, 1024
    if ON_GPU:
        light = torch.randn(batch, seq_len, dim, device=DEVICE)
        heavy = torch.randn(batch, num_routed, dim, device=DEVICE)
        indices = torch.rand(batch, seq_len, device=DEVICE).topk(num_routed, dim=-1).indices
        picked = indices[..., None].expand(-1, -1, dim).contiguous()
    else:
        light = heavy = indices = picked = None
    # Read the heavy rows and the routed rows of out, write those rows back, read the indices.
    n_bytes = 3 * batch * num_routed * dim * 4 + batch * num_routed * 8
    report_speed(name, lambda: launch_add_routed_rows(kernel, light, heavy, indices, light, 16, 256), n_bytes,
                 against=("torch's scatter_add_", lambda: light.scatter_add_(1, picked, heavy)),
                 advice="give each program a tile of routed rows and a run of contiguous columns (BLOCK_DIM of "
                        "them), so that every row's loads and stores combine into wide vectors")


# ----------------------------------------------- 7.2 and 7.3: local attention in bfloat16
# q, k and v are bfloat16, products run on the tensor cores (tl.dot's default precision on
# bfloat16 tiles: exact products, float32 sums) and everything else in float32. The outputs
# are bfloat16, rounded to 8 bits of mantissa (a relative 2**-9), and the weights and score
# gradients are rounded to bfloat16 before the second product: the tolerance allows that.
BF16_RTOL = BF16_ATOL = 2e-2
# The log-sum-exp is float32 from float32 sums of exact products: much tighter.
LSE_RTOL = LSE_ATOL = 1e-3

def _attention_runs(name, launch, kernel, *args):
    """kernel_runs for the attention exercises, the interpreter's warnings quiet: padded query
    rows compute 0 / 0 and -inf - (-inf) under NumPy, and they are never stored. (Its bfloat16
    arithmetic is made a GPU's by course_lib.core.runtime.)"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield from kernel_runs(name, launch, kernel, *args)


def _bf16(*shape, shift=0.0, spread=1.0):
    return (torch.randn(*shape, device=DEVICE) * spread + shift).to(torch.bfloat16)


def _nan_like(t, dtype=None):
    return torch.full(t.shape, float("nan"), device=t.device, dtype=dtype or t.dtype)


def _visible(n, window, *, diagonal=True, window_start=1):
    """(n, n) bool: query i sees key j when i - window + window_start <= j <= i (j < i
    without the diagonal). The exercises' mask has window_start 1."""
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    return ((j <= i) if diagonal else (j < i)) & (j >= i - window + window_start)


def _scores(q, k, window, scale, **mask_options):
    """q kᵀ · scale in float64, -inf where _visible hides the key."""
    scores = q.to("cpu", torch.float64) @ k.to("cpu", torch.float64).transpose(-1, -2) * scale
    return scores.masked_fill(~_visible(q.shape[1], window, **mask_options), float("-inf"))


def _windowed_attention(q, k, v, window, scale, **mask_options):
    """softmax(q kᵀ · scale, hiding what _visible hides) v in float64; a row that sees no key
    is NaN. Differentiable: tensors that require grad keep their graph."""
    return torch.softmax(_scores(q, k, window, scale, **mask_options), dim=-1) @ v.to("cpu", torch.float64)


# ------------------------------------------------- 7.2: the local-attention forward with tl.dot


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


def _close_rows(a, b, rtol, atol):
    return ((a - b).abs() <= atol + rtol * b.abs()).all(dim=-1)


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


def _adversarial_backward_cases():
    """(what, (q, k, v), window): a longer sequence. Not the forward's scores far from 0, nor
    scores spread wide: there dq = dS k and dk = dSᵀ q sum terms far larger than their
    result, and the bfloat16 roundings of dS and of the forward's output (which delta is
    computed from) leave errors past a bfloat16 tolerance in the course's own answer."""
    return [("1 head of 150 tokens", tuple(_bf16(1, 150, 16) for _ in range(3)), 40)]


def _forward_reference(q, k, v, window):
    """(out, lse) in float64."""
    scale = q.shape[-1] ** -0.5
    return _windowed_attention(q, k, v, window, scale), _scores(q, k, window, scale).logsumexp(dim=-1)


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


# Speed feedback at a training step's size, (batch, heads, n, head_dim). A sliding window of
# 192 keys and course_lib's fixed windows of 128 (a query sees 128 to 255 keys, 192.5 on
# average) are the same work, which the TFLOP/s of both count.
SPEED_SHAPE = (4, 8, 4096, 64)
SPEED_WINDOW, COURSE_LIB_WINDOW = 192, 128
COURSE_LIB_LABEL = (f"course_lib.local_causal_attention (fixed windows of {COURSE_LIB_WINDOW}: as many keys a "
                    f"query on average as your window of {SPEED_WINDOW})")


def _useful_flops(batch, heads, seq_len, head_dim, window):
    """The forward's flops as the TFLOP/s count them: 4·head_dim (a multiply and an add in
    each of its two products) per visible (query, key) pair, not the masked lanes of tiles."""
    visible_pairs = sum(min(i + 1, window) for i in range(seq_len))
    return 4 * batch * heads * visible_pairs * head_dim


def _speed_inputs():
    """q, k, v of SPEED_SHAPE, bfloat16, as (batch·heads, n, head_dim) tensors and as their
    (batch, heads, n, head_dim) views; Nones without a GPU."""
    if not ON_GPU:
        return (None,) * 6
    batch, heads, seq_len, head_dim = SPEED_SHAPE
    q, k, v = (_bf16(batch * heads, seq_len, head_dim) for _ in range(3))
    return (q, k, v, *(t.view(*SPEED_SHAPE) for t in (q, k, v)))


def _course_lib_attention(q4, k4, v4):
    import course_lib

    return course_lib.local_causal_attention(q4, k4, v4, COURSE_LIB_WINDOW)


def _with_a_hidden_attention_case(cases):
    """7.2's and 7.3's listed cases, and a case of hidden size when grading."""
    return cases + hidden_case(lambda: (lambda n: (random_size(1, 3), n, 16 * random_size(1, 2),
                                                   random_size(1, n + 5), 16, 16, False))(random_size(2, 60)))


def _listed_attention_cases(name, cases):
    """(what, (q, k, v), window, BLOCK_Q, BLOCK_K) for each case of 7.2 and 7.3: q, k and v
    bfloat16, or views of one projection where the case says."""
    for heads, seq_len, head_dim, window, block_q, block_k, fused in cases:
        what = (f"{name}, {heads} head{'s' * (heads > 1)} of {seq_len} token{'s' * (seq_len > 1)}, "
                f"head_dim {head_dim}, window {window}, BLOCK_Q {block_q}, BLOCK_K {block_k}")
        if fused:  # q, k and v as the thirds of one projection: their rows are 3 * head_dim apart
            q, k, v = _bf16(heads, seq_len, 3 * head_dim).split(head_dim, dim=-1)
            what += f", q, k and v views whose rows are {q.stride(1)} elements apart"
        else:
            q, k, v = (_bf16(heads, seq_len, head_dim) for _ in range(3))
        yield what, (q, k, v), window, block_q, block_k


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


# -------------------------------------------- 7.3: the local-attention backward with tl.dot


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
        from ...kernels.local_attention_op import local_attention_forward

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
