"""CoLT5's conditionally routed block, assembled from the course's four kernels.

CoLT5 (Ainslie et al., 2023) gives every token a cheap *light* branch and sends only k
tokens, chosen by a learned router, through an expensive *heavy* branch. The heavy
output is scaled by the routing weights and scattered back to the routed positions, so
the router learns which tokens deserve the heavy branch. The pieces are the chapters:

- ``layernorm`` (chapter 3) normalises each branch's input;
- ``weighted_sum`` (chapter 1) scores each token against a learned routing vector;
- ``coor_descent`` (chapter 4) turns the scores into a smooth top-k, padding masked;
- ``causal_softmax`` (chapter 2) is the attention of the heavy branch (the routed
  tokens, kept in sequence order), and of the light branch (local windows) where a
  padding mask is given; without one the light branch is ``local_attention``'s fused
  kernel, which never writes its scores.

Matrix products are PyTorch's. Every module takes ``ops``, the four kernels it calls:
``COURSE_OPS`` (the Triton kernels) by default, or ``REFERENCE_OPS`` (the pure-PyTorch
references), which makes the same module the block's reference.

Where this differs from the ``colt5-attention`` package (0.11.2), by design:

- LayerNorm where the package uses RMSNorm (its ``F.normalize(x) * sqrt(d) * gamma``);
  the two agree on rows of zero mean and differ by the mean elsewhere.
- The routed attention routes one set of k tokens per sequence and attends among them
  causally in sequence order. The package's ``ConditionalRoutedAutoregressiveAttention``
  instead cuts the sequence into windows, routes queries within each window and keys
  from the windows before it, and adds a learned null key; it needs no causal mask but
  routes keys once per window.
- Routing looks at the whole sequence (a top-k does), so *which* tokens are routed
  depends on later tokens: the block is an **encoder** block, as in CoLT5's encoder, and
  must not be trained to predict the next token. Each attention is causal once the
  routing is given (the light branch within its windows, the heavy branch among the
  routed tokens in sequence order); generating token by token needs routing decided per
  window, as the package's autoregressive attention does.
"""

import inspect
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..core import references
from ..core.validation import PUBLIC_DTYPES, _names, check_tensor, not_a_tensor
from ..kernels import MAX_HEAD_DIM, causal_softmax, coor_descent, layernorm, weighted_sum
from ..kernels.coor_descent_op import check_eps_schedule
from ..kernels import local_causal_attention as fused_local_causal_attention


class Ops(NamedTuple):
    """The kernels a routed block calls: the four chapters' and, where there is one, a
    fused local attention (None: the light branch writes its scores and calls
    causal_softmax on them)."""

    layernorm: object
    weighted_sum: object
    coor_descent: object
    causal_softmax: object
    local_attention: object = None

    def __repr__(self):
        # A signature or help() shows the default by name, not as five function addresses.
        if self == COURSE_OPS:
            return "COURSE_OPS"
        if self == REFERENCE_OPS:
            return "REFERENCE_OPS"
        names = (f"{field}={getattr(value, '__module__', '')}.{getattr(value, '__qualname__', repr(value))}"
                 for field, value in zip(self._fields, self))
        return f"Ops({', '.join(names)})"


COURSE_OPS = Ops(layernorm, weighted_sum, coor_descent, causal_softmax, fused_local_causal_attention)
REFERENCE_OPS = Ops(references.layernorm, references.weighted_sum, references.coor_descent,
                    references.causal_softmax)


# ----------------------------------------------------------------------------- checks


def check_count(op, name, value, least=1):
    """A count of tokens, heads, steps...: a Python int of at least ``least``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{op}: {name} must be an int, got {type(value).__name__} {value!r}")
    if value < least:
        raise ValueError(f"{op}: {name} must be at least {least}, got {value}")


def _check_width_multiplier(op, name, mult, dim):
    """A feed-forward's hidden width, int(dim * mult), must be at least 1."""
    if isinstance(mult, bool) or not isinstance(mult, (int, float)):
        raise TypeError(f"{op}: {name} must be a number, got {type(mult).__name__}")
    if not int(dim * mult) >= 1:
        raise ValueError(f"{op}: {name} = {mult} gives a hidden width int({dim} * {mult}) < 1; "
                         f"accepted: at least {1 / dim:g}")


def check_tokens(op, x, dim, dtype, ops):
    """x must be (batch, seq, dim) in the module's float dtype, and dense on a device the
    kernels' functions take when ``ops`` are the kernels (they compute with their references
    where the kernels cannot run: float64, CPU tensors without the interpreter, torch.func)."""
    if not isinstance(x, torch.Tensor):
        raise not_a_tensor(op, "x", x)
    if x.dtype != dtype:
        raise TypeError(f"{op}: x has dtype {x.dtype}; accepted: the module's dtype, {dtype} "
                        f"(the kernels take {_names(PUBLIC_DTYPES)}: cast the module with .to(dtype))")
    if ops is COURSE_OPS:  # named as the caller, not as the first kernel that would refuse it
        if dtype not in PUBLIC_DTYPES:
            raise TypeError(f"{op}: the module is in {dtype}, which the kernels do not take; accepted: "
                            f"{_names(PUBLIC_DTYPES)} (cast the module with .to(dtype))")
        check_tensor(op, "x", x, dtypes=(dtype,), min_ndim=0)
    if x.ndim != 3 or x.shape[-1] != dim:
        raise ValueError(f"{op}: x must have shape (batch, seq, {dim}), got {tuple(x.shape)}")


def check_mask(op, mask, x):
    """mask, if given, is bool (batch, seq): True where a token is real, False for padding."""
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"{op}: mask must be a bool tensor, got "
                        f"{mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__}")
    if tuple(mask.shape) != tuple(x.shape[:2]):
        raise ValueError(f"{op}: mask must have shape (batch, seq) = {tuple(x.shape[:2])}, got {tuple(mask.shape)}")
    if mask.device != x.device:
        raise ValueError(f"{op}: mask is on {mask.device} but the tokens are on {x.device}; "
                         "put them on the same device")


def check_router_kwargs(op, router_kwargs):
    """router_kwargs: None or a dict of CoordinateDescentRouter's settings, by name."""
    if router_kwargs is None:
        return
    if not isinstance(router_kwargs, dict):
        raise TypeError(f"{op}: router_kwargs must be a dict or None, got {type(router_kwargs).__name__}")
    # The router's keyword settings, read from its signature (dim and ops come from the block).
    settings = [name for name, parameter in inspect.signature(CoordinateDescentRouter).parameters.items()
                if parameter.kind is parameter.KEYWORD_ONLY and name != "ops"]
    unknown = sorted(set(router_kwargs) - set(settings))
    if unknown:
        raise TypeError(f"{op}: router_kwargs has {', '.join(map(repr, unknown))}; the router takes "
                        f"{', '.join(settings)}")


def check_flag(op, name, value):
    if not isinstance(value, bool):
        raise TypeError(f"{op}: {name} must be True or False, got {value!r}")


def check_ops(op, ops):
    if not isinstance(ops, Ops):
        raise TypeError(f"{op}: ops must be COURSE_OPS or REFERENCE_OPS (an Ops of five functions), got {ops!r}")


def check_fetch_k_ratio(op, fetch_k_ratio):
    if isinstance(fetch_k_ratio, bool) or not isinstance(fetch_k_ratio, (int, float)):
        raise TypeError(f"{op}: fetch_k_ratio must be a number of at least 1, got {fetch_k_ratio!r}")
    if not 1 <= fetch_k_ratio < float("inf"):  # NaN too
        raise ValueError(f"{op}: fetch_k_ratio must be a finite number of at least 1, got {fetch_k_ratio}")


def check_num_tokens(op, name, num_tokens, seq_len):
    check_count(op, name, num_tokens)
    if num_tokens > seq_len:
        raise ValueError(f"{op}: {name} = {num_tokens} is larger than the sequence ({seq_len} tokens); "
                         f"route at most {seq_len}")


# ----------------------------------------------------------------------- gather, scatter


def gather_tokens(x, indices):
    """x (b, n, d), indices (b, k) -> the k tokens (b, k, d) at those positions."""
    return x.gather(1, indices[..., None].expand(-1, -1, x.shape[-1]))


def add_tokens(out, routed, indices):
    """out (b, n, d) with routed (b, k, d) added at the positions indices (b, k): the heavy
    branch's rows added back into the light branch's output.

    Out of place (``scatter_add``, not an indexed ``+=``), so autograd and torch.compile
    see one ordinary operation: a copy of ``out`` with k rows changed. The indices of a row
    are distinct (a top-k's), so no position receives two tokens.
    """
    # routed.to: under autocast the branches may come out in different dtypes (no copy otherwise).
    return out.scatter_add(1, indices[..., None].expand(-1, -1, routed.shape[-1]), routed.to(out.dtype))


# ---------------------------------------------------------------------------- router


class Routed(NamedTuple):
    """What the router hands a heavy branch: the k positions of each sequence, their
    weights (1 in the forward with the straight-through trick, 0 for padding), the
    tokens there and, if a mask was given, which of them are real."""

    indices: torch.Tensor
    scores: torch.Tensor
    tokens: torch.Tensor
    mask: torch.Tensor | None


def top_k_routing(s, num_tokens, mask=None, *, n_iters=20, fetch_k_ratio=9 / 8, eps=0.03, eps_init=4.0,
                  eps_decay=0.7, straight_through=True, sequence_order=False, ops=COURSE_OPS):
    """The num_tokens routed tokens of each row of router scores, in score order (best
    first) or, with ``sequence_order``, by position.

    Coordinate descent makes the smooth top-k (asked for a few more than num_tokens, so
    that the last routed token's weight is still far from 0 and learns); padding (mask
    False) takes no part. With ``straight_through`` the weights are exactly 1 in the
    forward while their gradient is coordinate descent's; a padded token that still
    lands among the routed (a row with fewer real tokens than num_tokens) gets weight 0.

    Args:
        s (Tensor): router scores, float32, float16, bfloat16 or float64.
        num_tokens (int): tokens to route in each row, at most n.
        mask (Tensor, optional): bool, True for real tokens.
        n_iters, fetch_k_ratio, eps, eps_init, eps_decay: keyword only, the coordinate
            descent's settings (as :class:`CoordinateDescentRouter`).
        straight_through (bool): weights of 1 in the forward, coordinate descent's gradient.
        sequence_order (bool): indices by position rather than by score.
        ops: the kernels (``COURSE_OPS``) or the PyTorch references (``REFERENCE_OPS``).

    Shape:
        - s, mask: (batch, n)
        - Output: indices, weights and routed_mask, each (batch, num_tokens)

    Returns:
        tuple: (indices, weights, routed_mask): int64 positions, their weights in s's
        dtype, and the mask at them (None without a mask).

    Example::

        >>> indices, weights, _ = top_k_routing(torch.randn(2, 16), 4)
        >>> indices.shape
        torch.Size([2, 4])
    """
    op = "top_k_routing"
    if not isinstance(s, torch.Tensor):
        raise TypeError(f"{op}: s must be a torch.Tensor of router scores (batch, n), got {type(s).__name__}")
    if s.ndim != 2:
        raise ValueError(f"{op}: s must be router scores of shape (batch, n), got {tuple(s.shape)}")
    check_mask(op, mask, s)
    check_ops(op, ops)
    check_num_tokens(op, "num_tokens", num_tokens, s.shape[1])
    check_fetch_k_ratio(op, fetch_k_ratio)
    check_count(op, "n_iters", n_iters)
    check_eps_schedule(op, eps, eps_init, eps_decay)
    check_flag(op, "straight_through", straight_through)
    check_flag(op, "sequence_order", sequence_order)
    n = s.shape[-1]
    weights = ops.coor_descent(s, n_iters=n_iters, k=min(num_tokens * fetch_k_ratio, n), eps=eps,
                               eps_init=eps_init, eps_decay=eps_decay, mask=mask)
    # Chosen by score, not by weight. Within a row the weight exp(min(s + a, 0) / eps) never
    # falls as the score rises, so the largest scores are the largest weights; but weights
    # of real tokens underflow to exactly 0 in float32 while their scores still differ, and
    # a tie at 0 with the padding's zeros let topk route a padded token over a real one,
    # and route differently in float32 and float64. Padding scores -inf: it comes last.
    by_score = s.float() if mask is None else s.float().masked_fill(~mask, float("-inf"))
    indices = by_score.topk(num_tokens, dim=-1).indices
    if sequence_order:  # sorted before anything is gathered at them: one gather each, not two
        indices = indices.sort(dim=-1).values
    weights = weights.gather(1, indices)
    routed_mask = None if mask is None else mask.gather(1, indices)
    if straight_through:
        weights = weights + (1.0 - weights).detach()
        if routed_mask is not None:
            weights = weights.masked_fill(~routed_mask, 0.0)
    return indices, weights, routed_mask


class CoordinateDescentRouter(nn.Module):
    """Picks k tokens of each sequence: colt5_attention's ``CoordinateDescentRouter``.

    Scores s = x · routing_token (a weighted sum per token), then ``top_k_routing``.

    Args:
        dim: the tokens' width (the routing token's length).
        n_iters: coordinate-descent iterations (at least 1).
        fetch_k_ratio: the descent aims at ``fetch_k_ratio · k`` tokens (at least 1), then the
            top k of its weights are kept.
        eps, eps_init, eps_decay: the smoothing ε of the last iteration, of the first, and its
            decay per iteration.
        straight_through: scores of the routed tokens as ``w + (1 - w).detach()``, so gradients
            reach the router while the forward multiplies by 1.
        ops: the kernels (``COURSE_OPS``) or the PyTorch references (``REFERENCE_OPS``).

    Shape:
        - x: (batch, n, dim); mask: (batch, n)
        - Output (``forward``): indices and scores (batch, num_tokens), tokens
          (batch, num_tokens, dim)

    Returns:
        CoordinateDescentRouter: the module; ``forward`` returns ``Routed``.

    Example::

        >>> router = CoordinateDescentRouter(16)
        >>> router(torch.randn(2, 10, 16), num_tokens=4).tokens.shape
        torch.Size([2, 4, 16])
    """

    def __init__(self, dim, *, n_iters=20, fetch_k_ratio=9 / 8, eps=0.03, eps_init=4.0, eps_decay=0.7,
                 straight_through=True, ops=COURSE_OPS):
        super().__init__()
        op = "CoordinateDescentRouter"
        check_count(op, "dim", dim)
        check_count(op, "n_iters", n_iters)
        check_fetch_k_ratio(op, fetch_k_ratio)
        check_eps_schedule(op, eps, eps_init, eps_decay)
        check_flag(op, "straight_through", straight_through)
        check_ops(op, ops)
        self.n_iters, self.fetch_k_ratio = n_iters, fetch_k_ratio
        self.eps, self.eps_init, self.eps_decay = eps, eps_init, eps_decay
        self.straight_through = straight_through
        self.ops = ops
        self.routing_token = nn.Parameter(torch.randn(dim))

    def forward(self, x, *, num_tokens, mask=None, sequence_order=False):
        """Route ``num_tokens`` tokens of each sequence.

        x: (batch, n, dim) in the router's dtype; mask: (batch, n) bool, True for real tokens,
        or None. Returns ``Routed(indices, scores, tokens, mask)``: indices (batch, num_tokens)
        int64 (the chosen positions, best first, or by position with ``sequence_order``:
        a causal mask over the routed tokens needs row i to be the i-th earliest; padding
        never while a real token is left), scores (batch, num_tokens) their weights, tokens
        (batch, num_tokens, dim) gathered, and the mask of the routed tokens (None without a mask).
        """
        op = "CoordinateDescentRouter"
        check_tokens(op, x, self.routing_token.shape[0], self.routing_token.dtype, self.ops)
        check_mask(op, mask, x)
        check_num_tokens(op, "num_tokens", num_tokens, x.shape[1])
        check_flag(op, "sequence_order", sequence_order)
        indices, scores, routed_mask = top_k_routing(
            self.ops.weighted_sum(x, self.routing_token), num_tokens, mask, n_iters=self.n_iters,
            fetch_k_ratio=self.fetch_k_ratio, eps=self.eps, eps_init=self.eps_init, eps_decay=self.eps_decay,
            straight_through=self.straight_through, sequence_order=sequence_order, ops=self.ops,
        )
        return Routed(indices, scores, gather_tokens(x, indices), routed_mask)


# ------------------------------------------------------------------------ feed-forward


class Norm(nn.Module):
    """LayerNorm over the last dimension through ``ops.layernorm`` (chapter 3's kernel
    or its reference); parameters named as torch.nn.LayerNorm's."""

    def __init__(self, dim, ops=COURSE_OPS):
        super().__init__()
        self.ops = ops
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        return self.ops.layernorm(x, self.weight, self.bias)


def feed_forward(dim, mult, ops=COURSE_OPS):
    """Norm, Linear, GELU, Linear: the package's FeedForward with LayerNorm for RMSNorm."""
    hidden = int(dim * mult)
    return nn.Sequential(Norm(dim, ops), nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))


class RoutedFeedForward(nn.Module):
    """colt5_attention's ``ConditionalRoutedFeedForward``: a narrow feed-forward for
    every token plus a wide one for the ``num_heavy_tokens`` routed tokens."""

    def __init__(self, dim, *, num_heavy_tokens, light_ff_mult=0.5, heavy_ff_mult=4, router_kwargs=None,
                 ops=COURSE_OPS):
        super().__init__()
        check_count("RoutedFeedForward", "num_heavy_tokens", num_heavy_tokens)
        _check_width_multiplier("RoutedFeedForward", "light_ff_mult", light_ff_mult, dim)
        _check_width_multiplier("RoutedFeedForward", "heavy_ff_mult", heavy_ff_mult, dim)
        self.num_heavy_tokens = num_heavy_tokens
        self.router = CoordinateDescentRouter(dim, ops=ops, **(router_kwargs or {}))
        self.light_ff = feed_forward(dim, light_ff_mult, ops)
        self.heavy_ff = feed_forward(dim, heavy_ff_mult, ops)

    def forward(self, x, mask=None):
        routed = self.router(x, num_tokens=self.num_heavy_tokens, mask=mask)
        heavy = self.heavy_ff(routed.tokens) * routed.scores[..., None]
        return add_tokens(self.light_ff(x), heavy, routed.indices)


# --------------------------------------------------------------------------- attention


def split_heads(t, heads):
    """(b, n, h * d) -> (b, h, n, d)."""
    b, n, width = t.shape
    return t.reshape(b, n, heads, width // heads).transpose(1, 2)  # not -1: b or n may be 0


def merge_heads(t):
    """(b, h, n, d) -> (b, n, h * d)."""
    b, h, n, d = t.shape
    return t.transpose(1, 2).reshape(b, n, h * d)


def hide_keys(scores, visible):
    """-inf where a key is not ``visible`` (bool, broadcasting to scores): the softmax
    then gives it no weight, and a query that sees no key at all gets zeros."""
    return scores.masked_fill(~visible, float("-inf"))


def causal_attention(q, k, v, ops=COURSE_OPS, key_mask=None):
    """softmax(q kᵀ / sqrt(d)) v where query i sees keys j <= i (and, with key_mask
    (b, n), only keys that are real): causal_softmax over the (..., n, n) scores.
    q is scaled before the product, as the package does: a pass over (n, d), not (n, n)."""
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2)
    if key_mask is not None:
        scores = hide_keys(scores, key_mask[:, None, None, :])
    return ops.causal_softmax(scores) @ v


def local_causal_attention(q, k, v, window, ops=COURSE_OPS, key_mask=None):
    """Causal attention within a window and the one before it: local-attention's
    ``LocalMHA(causal=True, exact_windowsize=False)``.

    q, k, v (b, h, n, d) with n a multiple of ``window``. The queries of window w see
    the keys of windows w - 1 and w up to their own position. Stacking the two windows'
    keys, the scores of window w's queries are (window, 2 * window) and query i sees
    keys j <= i + window: causal_softmax with ``diagonal=window``. The first window has
    no window before it: those keys are hidden.
    """
    b, h, n, d = q.shape
    n_windows = n // window

    def windows(t):
        return t.reshape(*t.shape[:2], n_windows, window, t.shape[-1])

    def with_previous(t):  # (b, h, W, 2 * window, ...): window w - 1 (zeros before the first), then w
        t = windows(t)
        return torch.cat([F.pad(t, (0, 0, 0, 0, 1, 0))[:, :, :-1], t], dim=3)

    keys, values = with_previous(k), with_previous(v)
    scores = windows(q * d**-0.5) @ keys.transpose(-1, -2)  # (b, h, W, window, 2 * window)
    if key_mask is None:
        # In place: the product's output is not saved for its backward, and a fill of
        # the first window's hidden half writes 1/W of the scores, not all of them.
        scores[:, :, 0, :, :window] = float("-inf")
    else:
        keys_real = with_previous(key_mask[:, None, :, None].to(q.dtype))[..., 0] > 0  # (b, 1, W, 2 * window)
        has_previous = torch.arange(n_windows, device=q.device)[:, None] > 0
        visible = keys_real & (has_previous | (torch.arange(2 * window, device=q.device) >= window))
        scores = hide_keys(scores, visible[:, :, :, None, :])
    weights = ops.causal_softmax(scores, diagonal=window)
    return (weights @ values).reshape(b, h, n, values.shape[-1])  # not -1: b may be 0


class LocalCausalAttention(nn.Module):
    """The light branch of the routed attention: every token attends to the tokens of
    its window and the window before, causally. Parameters as local-attention's
    ``LocalMHA(prenorm=True)`` (norm, to_qkv, to_out), so its weights load as they are."""

    def __init__(self, dim, *, window_size=128, heads=8, dim_head=64, ops=COURSE_OPS):
        super().__init__()
        for name, value in (("dim", dim), ("window_size", window_size), ("heads", heads), ("dim_head", dim_head)):
            check_count("LocalCausalAttention", name, value)
        self.window_size, self.heads, self.ops = window_size, heads, ops
        self.norm = Norm(dim, ops)
        self.to_qkv = nn.Linear(dim, 3 * heads * dim_head, bias=False)
        self.to_out = nn.Linear(heads * dim_head, dim, bias=False)

    def forward(self, x, mask=None):
        op = "LocalCausalAttention"
        check_tokens(op, x, self.norm.weight.shape[0], self.norm.weight.dtype, self.ops)
        check_mask(op, mask, x)
        n = x.shape[1]
        q, k, v = (split_heads(t, self.heads) for t in self.to_qkv(self.norm(x)).chunk(3, dim=-1))
        if self.ops.local_attention is not None and mask is None and q.shape[-1] <= MAX_HEAD_DIM:
            return self.to_out(merge_heads(self.ops.local_attention(q, k, v, self.window_size)))
        padding = -n % self.window_size  # padded keys come after every real token: causality hides them
        key_mask = mask
        if padding:  # F.pad copies even when it adds nothing
            q, k, v = (F.pad(t, (0, 0, 0, padding)) for t in (q, k, v))
            key_mask = None if mask is None else F.pad(mask, (0, padding), value=False)
        out = local_causal_attention(q, k, v, self.window_size, self.ops, key_mask)[:, :, :n]
        return self.to_out(merge_heads(out))


class RoutedAttention(nn.Module):
    """Conditionally routed self-attention: causal local attention for every token, and
    causal attention among the ``num_heavy_tokens`` routed tokens. Which tokens are routed
    depends on the whole sequence, so the module as a whole is not causal (an encoder's).

    The heavy branch takes the routed tokens in sequence order, so causal_softmax over
    their (k, k) scores lets a routed query see exactly the routed keys at or before its
    own position. As in colt5_attention, values are scaled by their routing weights
    (the router's gradient from the keys' side) and outputs by the queries' weights;
    unrouted positions get no heavy output. Padding (mask False) is never a key.
    """

    def __init__(self, dim, *, num_heavy_tokens, light_window_size=128, light_heads=8, light_dim_head=64,
                 heavy_heads=8, heavy_dim_head=64, router_kwargs=None, ops=COURSE_OPS):
        super().__init__()
        for name, value in (("num_heavy_tokens", num_heavy_tokens), ("heavy_heads", heavy_heads),
                            ("heavy_dim_head", heavy_dim_head)):
            check_count("RoutedAttention", name, value)
        self.num_heavy_tokens, self.heavy_heads, self.ops = num_heavy_tokens, heavy_heads, ops
        self.light_attn = LocalCausalAttention(dim, window_size=light_window_size, heads=light_heads,
                                               dim_head=light_dim_head, ops=ops)
        self.router = CoordinateDescentRouter(dim, ops=ops, **(router_kwargs or {}))
        self.norm = Norm(dim, ops)
        self.to_qkv = nn.Linear(dim, 3 * heavy_heads * heavy_dim_head, bias=False)
        self.to_out = nn.Linear(heavy_heads * heavy_dim_head, dim, bias=False)

    def heavy_attention(self, routed):
        """Causal attention among the routed tokens (in sequence order), weighted."""
        q, k, v = (split_heads(t, self.heavy_heads) for t in self.to_qkv(self.norm(routed.tokens)).chunk(3, dim=-1))
        v = v * routed.scores[:, None, :, None]
        out = causal_attention(q, k, v, self.ops, key_mask=routed.mask)
        return self.to_out(merge_heads(out)) * routed.scores[..., None]

    def forward(self, x, mask=None):
        routed = self.router(x, num_tokens=self.num_heavy_tokens, mask=mask, sequence_order=True)
        return add_tokens(self.light_attn(x, mask), self.heavy_attention(routed), routed.indices)


class RoutedBlock(nn.Module):
    """An encoder block: x + routed attention(x), then + routed feed-forward, as
    colt5_attention's ``ConditionalRoutedTransformerBlock`` adds its branches.

    Args:
        dim: the tokens' width.
        num_heavy_tokens: tokens each router sends to the heavy branch (at most the sequence length).
        light_window_size: the light attention's window (tokens).
        heads, dim_head: attention heads and their width (``dim_head`` at most MAX_HEAD_DIM, 128).
        router_kwargs: arguments of both :class:`CoordinateDescentRouter` (n_iters, eps, ...).
        ops: the kernels (``COURSE_OPS``) or the PyTorch references (``REFERENCE_OPS``). In
            float64 (``.double()``) the kernels' functions compute with the references too,
            differentiable to any order.

    Shape:
        - x: (batch, n, dim); mask: (batch, n) bool
        - Output: (batch, n, dim)

    Returns:
        RoutedBlock: the module; call it on x (and mask).

    Example::

        >>> block = RoutedBlock(32, num_heavy_tokens=4, light_window_size=8, heads=2, dim_head=16)
        >>> block(torch.randn(2, 16, 32)).shape
        torch.Size([2, 16, 32])
    """

    def __init__(self, dim, *, num_heavy_tokens, light_window_size=128, heads=8, dim_head=64,
                 router_kwargs=None, ops=COURSE_OPS):
        super().__init__()
        op = "RoutedBlock"
        for name, value in (("dim", dim), ("num_heavy_tokens", num_heavy_tokens),
                            ("light_window_size", light_window_size), ("heads", heads), ("dim_head", dim_head)):
            check_count(op, name, value)
        check_ops(op, ops)
        check_router_kwargs(op, router_kwargs)
        self.dim = dim
        self.attn = RoutedAttention(
            dim, num_heavy_tokens=num_heavy_tokens, light_window_size=light_window_size, light_heads=heads,
            light_dim_head=dim_head, heavy_heads=heads, heavy_dim_head=dim_head, router_kwargs=router_kwargs,
            ops=ops,
        )
        self.ff = RoutedFeedForward(dim, num_heavy_tokens=num_heavy_tokens, router_kwargs=router_kwargs, ops=ops)

    def forward(self, x, mask=None):
        """x: (batch, n, dim) in the block's dtype (float32, float16 or bfloat16) on its device;
        mask: (batch, n) bool, True for real tokens, or None. Returns (batch, n, dim) in x's dtype.
        Bad input raises naming the argument."""
        op = "RoutedBlock"
        check_tokens(op, x, self.dim, self.attn.norm.weight.dtype, self.attn.ops)
        check_mask(op, mask, x)
        check_num_tokens(op, "num_heavy_tokens", self.attn.num_heavy_tokens, x.shape[1])
        x = x + self.attn(x, mask)
        return x + self.ff(x, mask)
