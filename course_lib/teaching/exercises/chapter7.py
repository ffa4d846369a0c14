"""Checkers of chapter 7, routed block: one function an exercise."""

import warnings

import torch
import triton

from ...core.runtime import DEVICE
from ..checking import ExerciseError, compare
from ..student_kernels import kernel_runs, report_speed, require_kernel
from .common import KEPT_FILL_HINT, Exercise, Prefilled, hidden_case, random_fill, random_size, say

__all__ = ["launch_add_routed_rows", "check_add_routed_rows",
           "launch_local_attention_forward", "check_local_attention_forward"]
# The chapter's exercises, in order, for the instructors' notes.
EXERCISES = (
    Exercise('7.1', 'add the heavy rows back', 'check_add_routed_rows', kernel=True, skills='index loads, gather and scatter addresses, a read-modify-write', difficulty=3, minutes=30),
    Exercise('7.2', 'the local-attention forward with tl.dot', 'check_local_attention_forward', kernel=True, skills='tl.dot, the online softmax across key tiles, causal and window masks, loop bounds from the mask', difficulty=5, minutes=90),
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
    if DEVICE != "cpu":
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


# ------------------------------------------------- 7.2: the local-attention forward with tl.dot


def launch_local_attention_forward(local_attention_forward_kernel, q, k, v, window, out=None, block_q=16,
                                   block_k=16):
    """How exercise 7.2's checker launches the kernel: q, k, v are (batch·heads, n,
    head_dim) with head_dim contiguous; program (m, bh) writes the outputs of queries
    m * block_q ... of head bh into ``out`` (contiguous, filled with NaN when not given)."""
    if out is None:
        out = torch.full(q.shape, float("nan"), device=q.device, dtype=q.dtype)
    heads, seq_len, head_dim = q.shape
    grid = (triton.cdiv(seq_len, block_q), heads)
    local_attention_forward_kernel[grid](*map(_as_rows, (q, k, v, out)), seq_len, window, head_dim ** -0.5,
                                         q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                                         v.stride(0), v.stride(1), out.stride(0), out.stride(1),
                                         HEAD_DIM=head_dim, BLOCK_Q=block_q, BLOCK_K=block_k)
    return out


def _visible(n, window, *, diagonal=True, window_start=1):
    """(n, n) bool: query i sees key j when i - window + window_start <= j <= i (j < i
    without the diagonal). The exercise's mask has window_start 1."""
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    return ((j <= i) if diagonal else (j < i)) & (j >= i - window + window_start)


def _windowed_attention(q, k, v, window, scale, **mask_options):
    """softmax(q kᵀ · scale, hiding what _visible hides) v in float64; a row that sees
    no key is NaN."""
    q, k, v = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) * scale
    scores = scores.masked_fill(~_visible(q.shape[1], window, **mask_options), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


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

    def close(a, b):
        return ((a - b).abs() <= atol + rtol * b.abs()).all(dim=-1)

    wrong = ~close(got, expected)
    undefined = candidate.isnan().any(dim=-1)
    matching = close(got, candidate)
    return bool(wrong.any() and (matching | undefined)[wrong].all() and (matching & ~undefined & wrong).any())


def _local_attention_hint(got, q, k, v, window, block_q, block_k, expected, rtol, atol, compiled_after_interpreter):
    """The usual mistake behind a wrong answer of exercise 7.2, or None."""
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
    if compiled_after_interpreter:
        return ("the interpreter's answer was right and the GPU's is off by more than float32's rounding: on the "
                "GPU, tl.dot rounds float32 inputs to TF32 (10 bits of mantissa) unless it is told "
                "input_precision=\"ieee\"; pass it to both products")
    return None


def _adversarial_attention_cases():
    """(what, (q, k, v), window): scores far below 0 and far above, and a longer sequence."""
    heads, n, d = 2, 37, 16
    noise = [torch.randn(heads, n, d, device=DEVICE) * 0.3 for _ in range(3)]
    far = (noise[0] + 6, noise[1] - 6, torch.randn(heads, n, d, device=DEVICE))  # scores near -144
    near = (noise[0] + 6, noise[2] + 6, torch.randn(heads, n, d, device=DEVICE))  # scores near +144
    long = tuple(torch.randn(1, 150, 16, device=DEVICE) for _ in range(3))
    return [("2 heads of 37 tokens, scores near -144", far, 9), ("2 heads of 37 tokens, scores near +144", near, 9),
            ("1 head of 150 tokens", long, 40)]


def check_local_attention_forward(local_attention_forward_kernel):
    """Exercise 7.2: ``local_attention_forward_kernel``, launched by
    :func:`launch_local_attention_forward`, writes softmax(q kᵀ / sqrt(d)) v where query i
    sees keys i - window < j <= i, in float32 with products in full precision."""
    name = "Exercise 7.2 (local_attention_forward_kernel)"
    kernel = require_kernel(name, local_attention_forward_kernel, "local_attention_forward_kernel")
    rtol = atol = 5e-5
    # (batch·heads, n, head_dim, window, BLOCK_Q, BLOCK_K, q, k and v views of one (bh, n, 3 d) tensor)
    cases = [(2, 37, 16, 5, 16, 16, False), (3, 29, 32, 1, 16, 16, False), (1, 45, 16, 50, 16, 16, False),
             (2, 40, 32, 7, 32, 16, False), (2, 21, 16, 9, 16, 16, True), (1, 1, 16, 3, 16, 16, False)]
    cases += hidden_case(lambda: (lambda n: (random_size(1, 3), n, 16 * random_size(1, 2), random_size(1, n + 5),
                                             16, 16, False))(random_size(2, 60)))
    for heads, seq_len, head_dim, window, block_q, block_k, fused in cases:
        what = (f"{name}, {heads} head{'s' * (heads > 1)} of {seq_len} token{'s' * (seq_len > 1)}, "
                f"head_dim {head_dim}, window {window}, BLOCK_Q {block_q}, BLOCK_K {block_k}")
        if fused:  # q, k and v as the thirds of one projection: their rows are 3 * head_dim apart
            q, k, v = torch.randn(heads, seq_len, 3 * head_dim, device=DEVICE).split(head_dim, dim=-1)
            what += f", q, k and v views whose rows are {q.stride(1)} elements apart"
        else:
            q, k, v = (torch.randn(heads, seq_len, head_dim, device=DEVICE) for _ in range(3))
        expected = _windowed_attention(q, k, v, window, head_dim ** -0.5)
        passed_interpreted = False
        with warnings.catch_warnings():  # padded query rows compute 0 / 0 under NumPy; they are never stored
            warnings.simplefilter("ignore", RuntimeWarning)
            for how, got in kernel_runs(name, launch_local_attention_forward, kernel, q, k, v, window, None,
                                        block_q, block_k):
                try:
                    compare(f"{what}" + (f", {how}" if how else ""), got, expected, rtol=rtol, atol=atol)
                except ExerciseError as error:
                    hint = _local_attention_hint(got, q, k, v, window, block_q, block_k, expected, rtol, atol,
                                                 compiled_after_interpreter=passed_interpreted)
                    raise _with_hint(error, hint) from None
                passed_interpreted = True
    # Not counted in the line below: scores far below and far above 0 (no shift that is the largest
    # only near 0 survives them), a sequence longer than the printed ones, and an output filled with
    # random values beforehand rather than NaN, a new fill each run.
    for what, (q, k, v), window in _adversarial_attention_cases():
        what = f"{name}, {what}, window {window}, output filled with random values beforehand"
        expected = _windowed_attention(q, k, v, window, q.shape[-1] ** -0.5)
        launch = Prefilled(launch_local_attention_forward, lambda q, *rest: random_fill(q.shape, q.device, q.dtype))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for how, got in kernel_runs(name, launch, kernel, q, k, v, window):
                try:
                    compare(f"{what}" + (f", {how}" if how else ""), got, expected, rtol=rtol, atol=atol,
                            outputs_start_as_nan=False)
                except ExerciseError as error:
                    hint = _local_attention_hint(got, q, k, v, window, 16, 16, expected, rtol, atol,
                                                 compiled_after_interpreter=False)
                    if hint is None and launch.kept_fill(got, expected, rtol=rtol, atol=atol):
                        hint = KEPT_FILL_HINT
                    if hint is None and not got.detach().isfinite().all():
                        hint = ("inf or NaN where the answer is a number, on scores far from 0: the running max "
                                "must start at -inf (not 0) and every exponent be taken after subtracting it")
                    raise _with_hint(error, hint) from None
    say(f"{name.split(' (')[0]} passed: {len(cases)} cases, windows from 1 to past the sequence, n not a "
          "multiple of the tile, head_dim 16 and 32, q, k and v as views.")
    batch, heads, seq_len, head_dim, window = 4, 8, 4096, 64, 128
    if DEVICE != "cpu":
        q, k, v = (torch.randn(batch * heads, seq_len, head_dim, device=DEVICE) for _ in range(3))
        out = torch.empty_like(q)
        q4, k4, v4 = (t.view(batch, heads, seq_len, head_dim) for t in (q, k, v))
    else:
        q = k = v = out = q4 = k4 = v4 = None
    import course_lib

    report_speed(name, lambda: launch_local_attention_forward(kernel, q, k, v, window, out, 64, 64),
                 4 * batch * heads * seq_len * head_dim * 4,
                 against=(f"course_lib.local_causal_attention (windows of {window} fixed blocks, so each query sees "
                          f"{window} to {2 * window} keys)",
                          lambda: course_lib.local_causal_attention(q4, k4, v4, window)),
                 advice="visit only the key tiles the query tile can see, from its first query's window to its last "
                        "query, and keep the scores and weights in registers (two tl.dot a key tile, nothing stored "
                        "in the loop)")
