"""Pure-PyTorch references: the specification every kernel is tested against.

They favour clarity over speed. Tests call them on float64 copies of the inputs, so the
reference is more precise than the kernel it checks.
"""

import functools

import torch


def weighted_sum(x, weight):
    """y[..., ] = sum_d x[..., d] * weight[d]."""
    return (x * weight).sum(dim=-1)


def weighted_sum_backward(x, weight, grad_y):
    """Gradients of ``weighted_sum``: grad_x is an outer product, grad_weight a column sum."""
    grad_x = grad_y[..., None] * weight
    grad_weight = (x * grad_y[..., None]).reshape(-1, x.shape[-1]).sum(dim=0)
    return grad_x, grad_weight


def softmax(x):
    """Softmax over the last dimension, exp(x - max) / sum(exp(x - max)) (torch.softmax).

    A row whose every entry is -inf has nothing to weigh: it gives zeros (and a zero
    gradient) instead of the NaN of ``torch.softmax``. A NaN entry makes its row NaN.
    """
    row_max = x.amax(dim=-1, keepdim=True)
    if _every_row_finite(x, row_max):
        # the common case, where torch.softmax alone is exact: 0 at every -inf entry
        return torch.softmax(x, dim=-1)
    # -inf raised to the lowest finite value still weighs exactly 0 beside a finite maximum
    # (and gets no gradient); a row of nothing but -inf turns finite, and the product with
    # False zeroes it (a masked_fill of a column costs a pass more than this multiply)
    lowest = torch.finfo(x.dtype).min
    return torch.softmax(x.clamp(min=lowest), dim=-1) * (row_max != float("-inf"))  # True for NaN rows


def causal_mask(n, device=None):
    """(n, n) bool, True above the diagonal: the keys j > i that query i must not see."""
    return torch.ones(n, n, dtype=torch.bool, device=device).triu(diagonal=1)


def causal_softmax(x, diagonal=0):
    """Softmax of x (..., m, n) where query row i sees keys j <= i + diagonal; exactly 0
    at the keys it does not see."""
    hidden = torch.ones(x.shape[-2:], dtype=torch.bool, device=x.device).triu(diagonal=diagonal + 1)
    return softmax(x.masked_fill(hidden, float("-inf"))).masked_fill(hidden, 0.0)


def _every_row_finite(x, row_max):
    """Whether every row of x has a finite maximum, asked only where the answer costs no
    GPU synchronisation and nothing traces the computation: a plain CPU tensor outside
    torch.func's transforms and torch.compile (elsewhere the guarded path, whose answer is
    the same)."""
    return (type(x) is torch.Tensor and x.device.type == "cpu" and not torch.compiler.is_compiling()
            and not torch._C._functorch.is_functorch_wrapped_tensor(x)
            and bool(torch.isfinite(row_max).all()))


def softmax_backward(y, grad_y):
    """Gradient of softmax from its output y: grad_x = y * (grad_y - sum(y * grad_y))."""
    return y * (grad_y - (y * grad_y).sum(dim=-1, keepdim=True))


def layernorm(x, gamma, beta=None, eps=1e-5, stable=False):
    """LayerNorm over the last dimension: (z - mean) / sqrt(var + eps) * gamma + beta.

    z is x, or with ``stable=True`` x divided by its row maximum (the seed's option,
    whatever the sign of the maximum). The variance is biased (divides by N), as in
    torch.nn.LayerNorm. gamma and beta may be None.
    """
    if stable:
        x = x / x.amax(dim=-1, keepdim=True)
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    y = (x - mean) * torch.rsqrt(var + eps)
    if gamma is not None:
        y = y * gamma
    if beta is not None:
        y = y + beta
    return y


def layernorm_by_torch(x, gamma, beta=None, eps=1e-5, stable=False):
    """``layernorm``, computed by torch's own fused ``F.layer_norm`` (one kernel, where the
    specification above takes six): what the public functions run where PyTorch computes."""
    if stable:
        x = x / x.amax(dim=-1, keepdim=True)
    # F.layer_norm wants one dtype: the widest of them, as the specification's arithmetic promotes
    tensors = [t for t in (x, gamma, beta) if t is not None]
    dtype = functools.reduce(torch.promote_types, [t.dtype for t in tensors])
    x, gamma, beta = (None if t is None else t.to(dtype) for t in (x, gamma, beta))
    return torch.nn.functional.layer_norm(x, x.shape[-1:], gamma, beta, eps)


def coor_descent(s, *, n_iters, k, eps=0.1, eps_init=None, eps_decay=1.0, mask=None):
    """CoLT5's coordinate descent (colt5_attention/coor_descent.py): a smoothed top-k.

    Scores s (..., n), budget k (a number, or a tensor of shape s.shape[:-1]: one per
    row). eps starts at max(eps_init, eps) and decays by eps_decay each iteration, never
    below eps. Each iteration sets a = eps * (log k - logsumexp((s + b) / eps)) per row
    and b = -relu(s + a); the result y = exp((s + a + b) / eps_final) is near 1 for about
    the k largest scores of each row and sums to about k. Masked scores (mask False)
    take no part and give exactly 0.
    """
    mask_value = -torch.finfo(s.dtype).max
    k = torch.as_tensor(k, dtype=s.dtype, device=s.device)
    logk = torch.log(k.clamp(min=1e-20))[..., None]
    if mask is not None:
        s = s.masked_fill(~mask, mask_value)
    a = 0.0
    b = -s
    current_eps = max(eps if eps_init is None else eps_init, eps)
    for _ in range(n_iters):
        sb = (s + b) / current_eps
        if mask is not None:
            sb = sb.masked_fill(~mask, mask_value)
        a = current_eps * (logk - sb.logsumexp(dim=-1, keepdim=True))
        b = -torch.relu(s + a)
        current_eps = max(current_eps * eps_decay, eps)
    y = ((s + a + b) / current_eps).exp()
    if mask is not None:
        y = y.masked_fill(~mask, 0.0)
    return y


def routed_causal_attention(q, k, v, routed, real=None):
    """Causal attention among routed tokens, written densely over the whole sequence.

    q, k, v: (b, h, n, d); routed: (b, n) bool, the positions the router picked; real:
    (b, n) bool or None, False for padding. Query i, if routed, sees keys j <= i that are
    routed and real; an unrouted query gets zeros. The same as gathering the routed
    tokens in sequence order and applying causal_softmax to their (k, k) scores, which
    is what the block computes, without an n × n matrix.
    """
    n = q.shape[-2]
    visible = routed[:, None, None, :] & ~causal_mask(n, q.device)
    if real is not None:
        visible = visible & real[:, None, None, :]
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    weights = softmax(scores.masked_fill(~visible, float("-inf")))
    return (weights @ v) * routed[:, None, :, None]


def matmul(a, b, bias=None, activation=None):
    """act(a @ b + bias): a (..., K), b (K, N), bias (N,) or None; activation None,
    "relu" or "gelu" (the tanh approximation, torch's gelu(approximate="tanh"))."""
    out = a @ b
    if bias is not None:
        out = out + bias
    if activation == "relu":
        out = torch.relu(out)
    elif activation == "gelu":
        out = torch.nn.functional.gelu(out, approximate="tanh")
    return out


def local_causal_attention(q, k, v, window, scale=None):
    """Local causal attention written densely: query i sees keys j with
    (i // window - 1) * window <= j <= i, its own window up to itself and the window
    before; scores scaled by ``scale``, by default 1 / sqrt(d). q, k, v: (b, h, n, d).
    An n × n mask: for tests and the CPU, not for long sequences on a GPU."""
    position = torch.arange(q.shape[-2], device=q.device)
    first_key = (position // window - 1) * window
    visible = (position[None, :] <= position[:, None]) & (position[None, :] >= first_key[:, None])
    scores = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    # every query sees itself, so no row is empty: torch.softmax needs no guard here
    return torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ v
