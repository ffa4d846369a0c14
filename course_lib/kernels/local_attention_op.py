"""Local causal attention in one pass over the keys, never writing the scores.

Chapter 7. Query p of a sequence cut into windows of ``window`` tokens sees the keys
of its own window up to itself and every key of the window before:

    keys (p // window - 1) * window <= j <= p   (from 0 in the first window)

as local-attention's ``LocalMHA(causal=True, exact_windowsize=False)``. Written with
the course's pieces, that is a (window, 2 * window) score matrix per window and
``causal_softmax(scores, diagonal=window)``: the scores are written, read, and written
and read again as their gradient, several passes over the largest tensor of a step.
Here a program holds a tile of queries, walks the keys it may see a tile at a time,
and keeps chapter 2's online softmax (a running max and sum) beside a running
weighted sum of the values: the scores live in registers only. The backward
recomputes them from q, k and the forward's log-sum-exp of every row.

Read top to bottom: the key range of a query tile, the forward kernel, the two
backward kernels (keys' and values' gradients by key tile, queries' by query tile),
the launchers, the autograd.Function and custom operators, and the public function.
"""

import math
import numbers

import torch
import triton
import triton.language as tl

from ..core import references
from ..core.operator import differentiable_op
from ..core.plans import LaunchPlan, TunedOn
from ..core.runtime import cdiv, launch, next_power_of_2, upcasts_dot
from ..core.validation import (FLOAT_DTYPES, PUBLIC_DTYPES, check_index_range, check_like, check_same_device_and_dtype,
                               check_tensor, on_device_of, runs_reference, by_reference, autocast_as_matmul)

LOG2E = tl.constexpr(1.4426950408889634)
# Head sizes up to this are held in registers whole; larger heads take the
# materialized path (routed.local_causal_attention).
MAX_HEAD_DIM = 128
# The launch grid's second dimension, one program a (batch, head), holds at most this many.
MAX_GRID_Y = 65535

# ---------------------------------------------------------------------------- kernels


@triton.jit
def _visible(queries, keys, n, WINDOW: tl.constexpr):
    """(queries, keys) bool: key j is in the window before query p's or in its own,
    up to p."""
    first_key = (queries // WINDOW - 1) * WINDOW
    return ((keys[None, :] <= queries[:, None]) & (keys[None, :] >= first_key[:, None])
            & (queries[:, None] < n) & (keys[None, :] < n))


@triton.jit
def _dot(a, b, DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr):
    """tl.dot, or the same product of float32 copies where UPCAST_DOT says so (runtime.upcasts_dot)."""
    if UPCAST_DOT:
        product = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        product = tl.dot(a, b, input_precision=DOT_PRECISION)
    return product


@triton.jit
def _load_rows(ptr, b, h, rows, dims, stride_b, stride_h, stride_n, stride_d, n, HEAD_DIM: tl.constexpr):
    """The (rows, dims) tile of head (b, h) of a (batch, heads, n, head_dim) tensor, 0
    past n and past HEAD_DIM (so padded rows and dims add nothing to a product)."""
    offsets = (b * stride_b + h * stride_h + rows[:, None].to(tl.int64) * stride_n
               + dims.to(tl.int64)[None, :] * stride_d)
    return tl.load(ptr + offsets, mask=(rows < n)[:, None] & (dims < HEAD_DIM)[None, :], other=0.0)


@triton.jit
def _store_rows(ptr, value, b, h, rows, dims, stride_b, stride_h, stride_n, n, HEAD_DIM: tl.constexpr):
    """Store a (rows, dims) tile of head (b, h) of a heads-last output (its dims contiguous)."""
    offsets = b * stride_b + h * stride_h + rows[:, None].to(tl.int64) * stride_n + dims[None, :]
    tl.store(ptr + offsets, value.to(ptr.dtype.element_ty), mask=(rows < n)[:, None] & (dims < HEAD_DIM)[None, :])


@triton.jit
def local_attention_forward_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
    n, heads,
    stride_q_b, stride_q_h, stride_q_n, stride_q_d,
    stride_k_b, stride_k_h, stride_k_n, stride_k_d,
    stride_v_b, stride_v_h, stride_v_n, stride_v_d,
    stride_o_b, stride_o_h, stride_o_n,
    WINDOW: tl.constexpr, HEAD_DIM: tl.constexpr, SCALE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr, WEIGHT_LOG2: tl.constexpr,
):
    """Program (m, bh) computes the outputs of queries m * BLOCK_M ... of head bh.

    Each weight exp(score - max) is taken 2**WEIGHT_LOG2 times smaller (weight_log2 says
    why); the running sum shares the factor, so their ratio, the output, does not see it."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = (bh // heads).to(tl.int64)
    h = (bh % heads).to(tl.int64)
    queries = start_m + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    q = _load_rows(q_ptr, b, h, queries, dims, stride_q_b, stride_q_h, stride_q_n, stride_q_d, n, HEAD_DIM)

    running_max = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    running_sum = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    key_start = tl.maximum(0, (start_m // WINDOW - 1) * WINDOW)
    key_end = tl.minimum(n, start_m + BLOCK_M)
    for start_n in range(key_start, key_end, BLOCK_N):
        keys = start_n + tl.arange(0, BLOCK_N)
        k = _load_rows(k_ptr, b, h, keys, dims, stride_k_b, stride_k_h, stride_k_n, stride_k_d, n, HEAD_DIM)
        v = _load_rows(v_ptr, b, h, keys, dims, stride_v_b, stride_v_h, stride_v_n, stride_v_d, n, HEAD_DIM)
        scores = _dot(q, tl.trans(k), DOT_PRECISION, UPCAST_DOT) * SCALE
        scores = tl.where(_visible(queries, keys, n, WINDOW), scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        # A row with nothing visible yet (or a query past n) shifts by 0, as chapter 2's kernels do.
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        weights = tl.exp2((scores - shift[:, None]) * LOG2E - WEIGHT_LOG2)
        rescale = tl.exp2((running_max - shift) * LOG2E)
        running_sum = running_sum * rescale + tl.sum(weights, axis=1)
        acc = acc * rescale[:, None] + _dot(weights.to(v.dtype), v, DOT_PRECISION, UPCAST_DOT)
        running_max = new_max

    # Every query sees at least itself, so a real row's sum is at least 2**-WEIGHT_LOG2.
    total = tl.where(running_sum == 0.0, 1.0, running_sum)
    _store_rows(o_ptr, acc / total[:, None], b, h, queries, dims, stride_o_b, stride_o_h, stride_o_n, n, HEAD_DIM)
    lse = running_max + tl.log(total) + WEIGHT_LOG2 / LOG2E  # the scores' own, without the weights' factor
    tl.store(lse_ptr + bh.to(tl.int64) * n + queries, lse, mask=queries < n)


@triton.jit
def local_attention_backward_kv_kernel(
    q_ptr, k_ptr, v_ptr, grad_o_ptr, lse_ptr, delta_ptr, grad_k_ptr, grad_v_ptr,
    n, heads,
    stride_q_b, stride_q_h, stride_q_n, stride_q_d,
    stride_k_b, stride_k_h, stride_k_n, stride_k_d,
    stride_v_b, stride_v_h, stride_v_n, stride_v_d,
    stride_go_b, stride_go_h, stride_go_n, stride_go_d,
    stride_g_b, stride_g_h, stride_g_n,
    WINDOW: tl.constexpr, HEAD_DIM: tl.constexpr, SCALE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr,
):
    """Program (n, bh): dk and dv of keys n * BLOCK_N ..., from every query that sees
    them (their own window from the key on, and the next window)."""
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1)
    b = (bh // heads).to(tl.int64)
    h = (bh % heads).to(tl.int64)
    keys = start_n + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    k = _load_rows(k_ptr, b, h, keys, dims, stride_k_b, stride_k_h, stride_k_n, stride_k_d, n, HEAD_DIM)
    v = _load_rows(v_ptr, b, h, keys, dims, stride_v_b, stride_v_h, stride_v_n, stride_v_d, n, HEAD_DIM)
    grad_k = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    grad_v = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    last_key = tl.minimum(start_n + BLOCK_N, n) - 1
    query_end = tl.minimum(n, (last_key // WINDOW + 2) * WINDOW)
    for start_m in range(start_n, query_end, BLOCK_M):
        queries = start_m + tl.arange(0, BLOCK_M)
        q = _load_rows(q_ptr, b, h, queries, dims, stride_q_b, stride_q_h, stride_q_n, stride_q_d, n, HEAD_DIM)
        grad_o = _load_rows(grad_o_ptr, b, h, queries, dims, stride_go_b, stride_go_h, stride_go_n, stride_go_d,
                            n, HEAD_DIM)
        lse = tl.load(lse_ptr + bh.to(tl.int64) * n + queries, mask=queries < n, other=0.0)
        delta = tl.load(delta_ptr + bh.to(tl.int64) * n + queries, mask=queries < n, other=0.0)
        scores = _dot(q, tl.trans(k), DOT_PRECISION, UPCAST_DOT) * SCALE  # (BLOCK_M, BLOCK_N)
        probs = tl.where(_visible(queries, keys, n, WINDOW), tl.exp2((scores - lse[:, None]) * LOG2E), 0.0)
        grad_v += _dot(tl.trans(probs.to(grad_o.dtype)), grad_o, DOT_PRECISION, UPCAST_DOT)
        grad_probs = _dot(grad_o, tl.trans(v), DOT_PRECISION, UPCAST_DOT)
        grad_scores = probs * (grad_probs - delta[:, None])
        grad_k += _dot(tl.trans(grad_scores.to(q.dtype)), q, DOT_PRECISION, UPCAST_DOT)
    _store_rows(grad_k_ptr, grad_k * SCALE, b, h, keys, dims, stride_g_b, stride_g_h, stride_g_n, n, HEAD_DIM)
    _store_rows(grad_v_ptr, grad_v, b, h, keys, dims, stride_g_b, stride_g_h, stride_g_n, n, HEAD_DIM)


@triton.jit
def local_attention_backward_q_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, grad_o_ptr, lse_ptr, delta_ptr, grad_q_ptr,
    n, heads,
    stride_q_b, stride_q_h, stride_q_n, stride_q_d,
    stride_k_b, stride_k_h, stride_k_n, stride_k_d,
    stride_v_b, stride_v_h, stride_v_n, stride_v_d,
    stride_go_b, stride_go_h, stride_go_n, stride_go_d,
    stride_g_b, stride_g_h, stride_g_n,  # of grad_q, and of out: both laid out heads-last
    WINDOW: tl.constexpr, HEAD_DIM: tl.constexpr, SCALE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr,
):
    """Program (m, bh): dq of queries m * BLOCK_M ..., over the keys they see, as the
    forward. First it stores each query's delta = sum(out * grad_out), the softmax
    backward's dot product (chapter 2), which the keys' kernel, launched next, reads."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = (bh // heads).to(tl.int64)
    h = (bh % heads).to(tl.int64)
    queries = start_m + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    q = _load_rows(q_ptr, b, h, queries, dims, stride_q_b, stride_q_h, stride_q_n, stride_q_d, n, HEAD_DIM)
    grad_o = _load_rows(grad_o_ptr, b, h, queries, dims, stride_go_b, stride_go_h, stride_go_n, stride_go_d,
                        n, HEAD_DIM)
    out = _load_rows(o_ptr, b, h, queries, dims, stride_g_b, stride_g_h, stride_g_n, 1, n, HEAD_DIM)
    delta = tl.sum(out.to(tl.float32) * grad_o.to(tl.float32), axis=1)
    tl.store(delta_ptr + bh.to(tl.int64) * n + queries, delta, mask=queries < n)
    lse = tl.load(lse_ptr + bh.to(tl.int64) * n + queries, mask=queries < n, other=0.0)
    grad_q = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    key_start = tl.maximum(0, (start_m // WINDOW - 1) * WINDOW)
    key_end = tl.minimum(n, start_m + BLOCK_M)
    for start_n in range(key_start, key_end, BLOCK_N):
        keys = start_n + tl.arange(0, BLOCK_N)
        k = _load_rows(k_ptr, b, h, keys, dims, stride_k_b, stride_k_h, stride_k_n, stride_k_d, n, HEAD_DIM)
        v = _load_rows(v_ptr, b, h, keys, dims, stride_v_b, stride_v_h, stride_v_n, stride_v_d, n, HEAD_DIM)
        scores = _dot(q, tl.trans(k), DOT_PRECISION, UPCAST_DOT) * SCALE
        probs = tl.where(_visible(queries, keys, n, WINDOW), tl.exp2((scores - lse[:, None]) * LOG2E), 0.0)
        grad_probs = _dot(grad_o, tl.trans(v), DOT_PRECISION, UPCAST_DOT)
        grad_scores = probs * (grad_probs - delta[:, None])
        grad_q += _dot(grad_scores.to(k.dtype), k, DOT_PRECISION, UPCAST_DOT)
    _store_rows(grad_q_ptr, grad_q * SCALE, b, h, queries, dims, stride_g_b, stride_g_h, stride_g_n, n, HEAD_DIM)


# -------------------------------------------------------------------------- launchers


# Each kernel's LaunchPlan (block_rows queries, block_cols keys a tile) for heads up to
# 64 and up to 128 (MAX_HEAD_DIM), from benchmarks/tune_local_attention.py on an H200
# ((8, 8, 4096, d) bfloat16, windows of 128): 64 x 64 tiles at 4 warps, the size of
# Triton's attention tutorial, were within 3% of the best of 48 plans everywhere but the
# forward of heads of 128, where narrower key tiles and a deeper pipeline took 8% off
# (143 to 132 us).
TUNED_ON = TunedOn("NVIDIA H200", "3.6.0", "benchmarks/tune_local_attention.py")
FORWARD_TILES = {64: LaunchPlan(64, 64, 4, 2), 128: LaunchPlan(64, 32, 4, 3)}
BACKWARD_Q_TILES = {64: LaunchPlan(64, 64, 4, 2), 128: LaunchPlan(64, 64, 4, 2)}
BACKWARD_KV_TILES = {64: LaunchPlan(64, 64, 4, 2), 128: LaunchPlan(64, 64, 4, 2)}


def tiles_for(table, head_dim):
    return table[64 if head_dim <= 64 else 128]


def _heads_last(like):
    """An empty (b, h, n, d) tensor laid out as (b, n, h, d): merging the heads of the
    output (or of its gradients) back into tokens is then a view, not a copy. A tensor of
    its own, not a view: an operator may return it, and a caller may change it in place."""
    b, h, n, d = like.shape
    return torch.empty_strided((b, h, n, d), (n * h * d, d, h * d, 1), device=like.device, dtype=like.dtype)


def _options(q, tiles):
    """A kernel's constexprs and launch options for q's head size and dtype and its tiles."""
    head_dim = q.shape[-1]
    return dict(
        HEAD_DIM=head_dim, BLOCK_M=tiles.block_rows, BLOCK_N=tiles.block_cols,
        BLOCK_D=max(16, next_power_of_2(head_dim)),
        # A constexpr: inductor passes a float argument as float64, and the scores would follow.
        SCALE=head_dim**-0.5,
        # float32 products in full precision: tf32 would cost them 3 decimal digits.
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else None,
        UPCAST_DOT=upcasts_dot(q.dtype),
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )


def weight_log2(window, dtype):
    """The forward's WEIGHT_LOG2: weights exp(score - max) <= 1 of at most 2 * window keys
    a query add up to at most 2 * window, and so would its float32 sum of weighted values,
    times the largest value: past float32's range where the values lie near bfloat16's (or
    float32's) largest, though the output, a convex combination of them, does not. Weights
    2**WEIGHT_LOG2 >= 4 * window times smaller keep that sum at most half the largest value.
    float16 values (at most 65504) cannot reach it, and their weights, rounded to float16
    for the product, would lose bits below its smallest normal number: there it is 0."""
    return 0 if dtype == torch.float16 else (4 * window - 1).bit_length()


def _effective_window(window, n):
    """A window of n or more tokens is one window, plain causal attention: kernels see
    at most n, so a window of any size (2**31 and beyond) compiles to one constexpr."""
    return min(window, max(n, 1))


def local_attention_forward(q, k, v, window, tiles=None, out=None):
    """Launch the forward; return (out, lse): out (b, h, n, d) laid out heads-last (into
    ``out``, such a tensor, where given), and the float32 log-sum-exp of every query's
    scores, (b * h, n)."""
    b, h, n, d = q.shape
    window = _effective_window(window, n)
    tiles = tiles or tiles_for(FORWARD_TILES, d)
    out = _heads_last(q) if out is None else out
    lse = torch.empty((b * h, n), device=q.device, dtype=torch.float32)
    if out.numel():
        with on_device_of(q):
            launch(local_attention_forward_kernel, (cdiv(n, tiles.block_rows), b * h),
                q, k, v, out, lse, n, h, *q.stride(), *k.stride(), *v.stride(), *out.stride()[:3],
                WINDOW=window, WEIGHT_LOG2=weight_log2(window, q.dtype), **_options(q, tiles),
            )
    return out, lse


def local_attention_backward(grad_out, q, k, v, out, lse, window, q_tiles=None, kv_tiles=None):
    """Launch the backward; return (grad_q, grad_k, grad_v), each laid out heads-last."""
    b, h, n, d = q.shape
    window = _effective_window(window, n)
    q_tiles = q_tiles or tiles_for(BACKWARD_Q_TILES, d)
    kv_tiles = kv_tiles or tiles_for(BACKWARD_KV_TILES, d)
    grad_q, grad_k, grad_v = _heads_last(q), _heads_last(k), _heads_last(v)
    if not grad_q.numel():
        return grad_q, grad_k, grad_v
    delta = torch.empty_like(lse)  # written by the queries' kernel, read by the keys'
    if out.stride() != grad_q.stride():  # the queries' kernel reads out with grad_q's strides
        out = _heads_last(out).copy_(out)
    arguments = (n, h, *q.stride(), *k.stride(), *v.stride(), *grad_out.stride())
    with on_device_of(q):
        launch(local_attention_backward_q_kernel, (cdiv(n, q_tiles.block_rows), b * h),
            q, k, v, out, grad_out, lse, delta, grad_q, *arguments, *grad_q.stride()[:3],
            WINDOW=window, **_options(q, q_tiles),
        )
        launch(local_attention_backward_kv_kernel, (cdiv(n, kv_tiles.block_cols), b * h),
            q, k, v, grad_out, lse, delta, grad_k, grad_v, *arguments, *grad_k.stride()[:3],
            WINDOW=window, **_options(q, kv_tiles),
        )
    return grad_q, grad_k, grad_v


# -------------------------------------------------------------------- custom operator
# One unit for torch.compile and for eager autograd (core.operator; weighted_sum_op.py
# says how the paths differ). The output and the gradients are (b, h, n, d) tensors laid
# out heads-last (_heads_last), tensors of their own, which an operator may return.


def _backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
              lse: torch.Tensor, window: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return local_attention_backward(grad_out, q, k, v, out, lse, window)


def _save_for_backward(ctx, inputs, output):
    q, k, v, window = inputs
    out, lse = output
    ctx.window = window
    ctx.save_for_backward(q, k, v, lse)
    # Saved, out would make `out += residual` an autograd error, where torch's attention
    # allows it eagerly. A detached alias (no grad_fn: no reference cycle) shares out's
    # version counter, so the backward sees such a change instead.
    ctx.out, ctx.out_version = out.detach(), out._version


def _saved_out(ctx, q, k, v):
    """The forward's output for the backward: the one kept, unless it was changed in
    place since the forward (or a backward already used it), then recomputed."""
    out, ctx.out = ctx.out, None  # held no longer than saved tensors are, past the backward
    if out is None or out._version != ctx.out_version:
        out = LOCAL_ATTENTION.operator(q, k, v, ctx.window)[0]  # an operator, for torch.compile to trace
    return out


def _gradients(ctx, backward, grad_out):
    q, k, v, lse = ctx.saved_tensors
    out = _saved_out(ctx, q, k, v)
    return (*backward(grad_out, q, k, v, out, lse, ctx.window), None)


def _check_backward(grad_out, q, k, v, out, lse, window):
    op = "local_attention_backward"
    _check_inputs(op, q, k, v, window)
    check_like(op, "grad_out", grad_out, q.shape, q)
    check_like(op, "out", out, q.shape, q)
    b, h, n, _ = q.shape
    check_like(op, "lse", lse, (b * h, n), q, dtype=torch.float32, contiguous=True)


@differentiable_op(
    "local_attention", backward=_backward, save=_save_for_backward, gradients=_gradients,
    check=lambda q, k, v, window: _check_inputs("local_causal_attention", q, k, v, window),
    check_backward=_check_backward,
    differentiable={"q": 0, "k": 1, "v": 2},
    error_name="local_causal_attention",
)
def LOCAL_ATTENTION(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    window: int) -> tuple[torch.Tensor, torch.Tensor]:
    return local_attention_forward(q, k, v, window)


# ------------------------------------------------------------------------------ public


def _check_inputs(op, q, k, v, window, dtypes=FLOAT_DTYPES):
    """``dtypes``: the kernels' (the operators' check), or the public function's, float64 too."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(op, name, t, dtypes=dtypes, min_ndim=4)
        if t.ndim != 4:
            raise ValueError(f"{op}: {name} must have 4 dimensions (batch, heads, n, head_dim), got shape "
                             f"{tuple(t.shape)}")
    check_same_device_and_dtype(op, q=q, k=k, v=v)
    if not q.shape == k.shape == v.shape:
        raise ValueError(f"{op}: q, k and v must have one shape (batch, heads, n, head_dim); got "
                         f"{tuple(q.shape)}, {tuple(k.shape)} and {tuple(v.shape)}")
    if not 1 <= q.shape[-1] <= MAX_HEAD_DIM:
        raise ValueError(f"{op}: head_dim must be between 1 and {MAX_HEAD_DIM}, got {q.shape[-1]}")
    # A SymInt: traced by torch.compile with dynamic shapes, window=n is one.
    if isinstance(window, bool) or not isinstance(window, (int, torch.SymInt)):
        raise TypeError(f"{op}: window must be an int, got {type(window).__name__} {window!r}")
    if window < 1:
        raise ValueError(f"{op}: window must be at least 1, got {window}")
    b, h, n, _ = q.shape
    check_index_range(op, n=n)
    if b * h > MAX_GRID_Y:
        raise ValueError(f"{op}: batch * heads = {b * h} is more than the {MAX_GRID_Y} programs a launch grid's "
                         "second dimension holds; call it on part of the batch at a time")


def _check_scale(op, scale):
    if scale is None:
        return
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"{op}: scale must be a number or None, got {type(scale).__name__} {scale!r}")
    if not math.isfinite(scale):
        raise ValueError(f"{op}: scale must be finite, got {scale}")


def local_causal_attention(q, k, v, window, *, scale=None):
    """softmax(q kᵀ · scale) v where query p sees the keys of its window up to itself
    and every key of the window before (windows of ``window`` tokens from position 0),
    without writing the scores.

    Computes in float32; float64 inputs (on any device) are computed by the PyTorch
    reference instead (an n × n matrix), differentiable to any order. The result is laid
    out as (batch, n, heads, head_dim), so that merging the heads is a view.

    Args:
        q, k, v (Tensor): queries, keys and values, one dtype (float32, float16, bfloat16
            or float64), any strides, head_dim at most MAX_HEAD_DIM (128), any n (the last
            window may be short).
        window (int): the window's length in tokens, at least 1.
        scale (float, optional): keyword only, the scores' factor; by default
            1 / sqrt(head_dim), as ``F.scaled_dot_product_attention``. Another value
            multiplies q by it (times sqrt(head_dim)) before the kernels: one pass over q.

    Shape:
        - q, k, v: (batch, heads, n, head_dim)
        - Output: (batch, heads, n, head_dim)

    Returns:
        Tensor: the attention's output, in q's dtype.

    Example::

        >>> q, k, v = torch.randn(3, 2, 4, 10, 16).unbind(0)  # (batch, heads, n, head_dim)
        >>> local_causal_attention(q, k, v, window=4).shape
        torch.Size([2, 4, 10, 16])
    """
    op = "local_causal_attention"
    q, k, v = autocast_as_matmul(q, k, v)
    _check_inputs(op, q, k, v, window, PUBLIC_DTYPES)
    _check_scale(op, scale)
    if runs_reference(q, k, v):
        return by_reference(references.local_causal_attention, q, k, v, window, scale=scale)
    if scale is not None:  # the kernels scale the scores by 1/sqrt(head_dim), a constant they are compiled with
        q = q * (scale * q.shape[-1] ** 0.5)
    # int(): the kernels take the window as a constant, so a traced SymInt is specialised on.
    return LOCAL_ATTENTION(q, k, v, int(window))
