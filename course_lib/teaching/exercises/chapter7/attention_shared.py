"""What the local-attention checkers (exercises 7.2 and 7.3) share: tolerances, bfloat16
inputs, the windowed attention in float64, the listed cases and the speed settings."""

import warnings

import torch

from ....core.runtime import DEVICE, ON_GPU
from ...student_kernels import kernel_runs
from ..common import hidden_case, random_size


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


def _close_rows(a, b, rtol, atol):
    return ((a - b).abs() <= atol + rtol * b.abs()).all(dim=-1)


def _forward_reference(q, k, v, window):
    """(out, lse) in float64."""
    scale = q.shape[-1] ** -0.5
    return _windowed_attention(q, k, v, window, scale), _scores(q, k, window, scale).logsumexp(dim=-1)


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
