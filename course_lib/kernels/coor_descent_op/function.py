"""The operator autograd and torch.compile run (core.operator's ``differentiable_op``) and
the public ``coor_descent``, which checks its inputs and calls it, or the PyTorch
reference for float64."""

import math
import numbers
from typing import Optional

import torch

from .checks import K_DTYPES, check_inputs, check_k_values, k_range
from .launchers import coor_descent_backward, coor_descent_forward, eps_schedule, make_eps_schedule
from ...core import references
from ...core.operator import differentiable_op
from ...core.runtime import ON_GPU, is_traced
from ...core.validation import (PUBLIC_DTYPES, _names, check_anchor, check_like, plain_inputs, runs_reference,
                                by_reference)


def _as_rows(s, mask):
    """(s, mask) viewed as (rows, n), copying only when the strides do not allow a view;
    the mask as uint8, which the kernels load as bytes. 2-D s is passed as it is: a
    reshape costs host time on every call."""
    s2d = s if s.ndim == 2 else s.reshape(-1, s.shape[-1])
    if mask is None:
        return s2d, None
    mask2d = mask.reshape(s2d.shape)
    # Traced, a copy: inductor cannot lower a view of bool as uint8.
    return s2d, mask2d.to(torch.uint8) if is_traced(mask2d) else mask2d.view(torch.uint8)


def _forward(s, logk, mask, schedule):
    """(y of s's shape, a, row max): the forward for any leading dimensions.
    ``logk``: a float, or a float32 tensor (rows,) when k is per row."""
    s2d, mask2d = _as_rows(s, mask)
    return coor_descent_forward(s2d, mask2d, logk, schedule, shape=s.shape)


# -------------------------------------------------------------------- custom operator
# One unit for torch.compile and for eager autograd (core.operator; weighted_sum_op.py
# says how the paths differ). The operators take the eps settings rather than the
# Schedule, and a per-row logk as a tensor or, when k is one number, as logk_value.
# Traced by torch.compile, the body runs on fake tensors, so it builds its Schedule there
# (a constant of the graph) rather than from eps_schedule's cache, which must only ever
# hold real tensors; eager calls take the cached one.
#
# A tensor k is checked by an operator of its own, opaque to torch.compile, which
# reads k's values at run time, except while a CUDA graph is being captured (no reads
# back then): the one check a traced body cannot make.


def _schedule_for(s, n_iters, eps, eps_init, eps_decay):
    build = make_eps_schedule if is_traced(s) else eps_schedule
    return build(n_iters, eps, eps_init, eps_decay, s.device)


def _backward_op(
    s: torch.Tensor, mask: Optional[torch.Tensor], logk: Optional[torch.Tensor], logk_value: float, n_iters: int,
    eps: float, eps_init: Optional[float], eps_decay: float, a: torch.Tensor, row_max: torch.Tensor, dy: torch.Tensor,
    anchor: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    s2d, mask2d = _as_rows(s, mask)
    schedule = _schedule_for(s, n_iters, eps, eps_init, eps_decay)
    rows_only = s.ndim == 2  # no reshapes then (see _as_rows)
    ds, dlogk = coor_descent_backward(s2d, mask2d, logk_value if logk is None else logk, schedule, a, row_max,
                                      dy if rows_only else dy.reshape(s2d.shape), anchor=anchor)
    return ds if rows_only else ds.reshape(s.shape), dlogk


def _values_readable(tensor):
    """Whether a check may read ``tensor``'s values back: it has values (not traced) and no
    CUDA graph is being captured (no reads back then)."""
    return not is_traced(tensor) and not (ON_GPU and torch.cuda.is_current_stream_capturing())


@torch.library.custom_op("course_lib::coor_descent_check_k", mutates_args=())
def check_k_op(k: torch.Tensor, n_cols: int) -> torch.Tensor:
    op = "coor_descent_check_k"
    if k.dtype not in K_DTYPES:
        raise TypeError(f"{op}: k has dtype {k.dtype}; accepted: {_names(K_DTYPES)}")
    if n_cols < 1:
        raise ValueError(f"{op}: n_cols, the row length, must be at least 1, got {n_cols}")
    if _values_readable(k):
        check_k_values("coor_descent", k, n_cols)
    return k.clone()  # an operator's output may not alias its input


@check_k_op.register_fake
def _(k, n_cols):
    return torch.empty_like(k)


check_k_op.register_autograd(lambda ctx, grad: (grad, None))


def _save_for_backward(ctx, inputs, output):
    s, mask, logk, logk_value, *ctx.settings = inputs
    _, a, row_max = output
    ctx.save_for_backward(s, mask, logk, a, row_max)
    ctx.logk_value = logk_value


def _gradients(ctx, backward, dy):
    s, mask, logk, a, row_max = ctx.saved_tensors
    ds, dlogk = backward(s, mask, logk, ctx.logk_value, *ctx.settings, a, row_max, dy)
    return ds, None, (dlogk if logk is not None else None), None, None, None, None, None


def _check_operator_inputs(s, mask, logk, logk_value, n_iters, eps, eps_init, eps_decay, op="coor_descent"):
    """The operator's inputs, checked as coor_descent checks its own: k as log k, a float32
    tensor of one value a row or one number. A tensor's values are read back (a sync)
    where they can be: called directly, not traced (compiled, check_k_op reads k's)."""
    check_inputs(op, s, n_iters, 1, eps, eps_init, eps_decay, mask, 1)
    rows = s.numel() // s.shape[-1]
    if logk is not None:  # log k of each row of s
        check_like(op, "logk", logk, (rows,), s, dtype=torch.float32, contiguous=True)
        if _values_readable(logk) and not bool(((logk > -math.inf) & (logk <= math.log(s.shape[-1]))).all()):
            raise ValueError(f"{op}: every logk must be log k with {k_range(s.shape[-1])}; "
                             "logk holds values outside it")
    elif not (isinstance(logk_value, numbers.Real) and -math.inf < logk_value <= math.log(s.shape[-1])):
        raise ValueError(f"{op}: logk_value must be log k with {k_range(s.shape[-1])}, got {logk_value!r}")


def _check_backward(s, mask, logk, logk_value, n_iters, eps, eps_init, eps_decay, a, row_max, dy, anchor=None):
    op = "coor_descent_backward"
    if anchor is not None:
        check_anchor(op, anchor, s)
    _check_operator_inputs(s, mask, logk, logk_value, n_iters, eps, eps_init, eps_decay, op=op)
    rows = s.numel() // s.shape[-1]
    check_like(op, "a", a, (rows, n_iters), s, dtype=torch.float64, contiguous=True)
    check_like(op, "row_max", row_max, (rows,), s, dtype=torch.float32, contiguous=True)
    check_like(op, "dy", dy, s.shape, s)


@differentiable_op(
    "coor_descent", backward=_backward_op, save=_save_for_backward, gradients=_gradients,
    check=_check_operator_inputs, check_backward=_check_backward, differentiable={"s": 0, "k": 2}, anchored=True,
)
def COOR_DESCENT(
    s: torch.Tensor, mask: Optional[torch.Tensor], logk: Optional[torch.Tensor], logk_value: float,
    n_iters: int, eps: float, eps_init: Optional[float], eps_decay: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    schedule = _schedule_for(s, n_iters, eps, eps_init, eps_decay)
    return _forward(s, logk_value if logk is None else logk, mask, schedule)


# ------------------------------------------------------------------------------ public


def coor_descent(s, *, n_iters, k, eps=0.1, eps_init=None, eps_decay=1.0, mask=None, checkpoint_segments=1):
    """CoLT5's coordinate descent with Triton kernels: a drop-in for ``triton_coor_descent``,
    a smoothed top-k of each row.

    Computes in float32, differentiable in s and in k; float64 scores (on any device) are
    computed by the PyTorch reference instead, differentiable to any order. A row with
    fewer than k unmasked scores has no y summing to k: its y rises towards 1 on every
    unmasked position, and a fully masked row gives zeros.

    Args:
        s (Tensor): the scores, float32, float16, bfloat16 or float64, any strides.
        n_iters (int): 1 to MAX_N_ITERS (10000) iterations; keyword only, as all below.
        k (float or Tensor): the budget, 0 < k <= n: a number, or a tensor broadcasting to
            s.shape[:-1] (one per row; any real dtype, differentiable when it requires
            grad). Checking tensor k reads it back to the host once.
        eps, eps_init, eps_decay (float): ε-scaling, eps falling from max(eps_init, eps)
            by eps_decay each iteration, never below eps; eps and eps_init are normal
            float32 numbers (from about 1.2e-38 to 3.4e38: the kernels divide by them).
        mask (Tensor, optional): bool, True where a score counts; y and the gradient are
            exactly 0 elsewhere.
        checkpoint_segments (int): accepted for compatibility, no effect: the forward
            saves one scalar per row per iteration and the backward needs nothing more.

    Shape:
        - s: (..., n)
        - k: a number, or broadcasting to (...)
        - mask: (..., n)
        - Output: (..., n)

    Returns:
        Tensor: y, near 1 for about the k largest scores of each row and summing to
        about k, of s's shape and dtype.

    Example::

        >>> s = torch.randn(2, 16)
        >>> y = coor_descent(s, n_iters=50, k=4, eps=0.05)
        >>> y.sum(-1)  # about 4 a row
    """
    op = "coor_descent"
    # k a tensor and the mask are checked in full: plain_inputs takes float tensors only
    plain = mask is None and not isinstance(k, torch.Tensor) and plain_inputs(s)
    settings = check_inputs(op, s, n_iters, k, eps, eps_init, eps_decay, mask, checkpoint_segments, PUBLIC_DTYPES,
                            plain)
    if not plain and runs_reference(s, k, mask):
        return by_reference(references.coor_descent, s, n_iters=n_iters, k=k, eps=eps, eps_init=eps_init,
                            eps_decay=eps_decay, mask=mask)
    if isinstance(k, torch.Tensor):
        if torch.compiler.is_compiling():
            k = check_k_op(k, s.shape[-1])
        rows = s.numel() // s.shape[-1]
        logk = torch.log(k.float().clamp(min=1e-20)).expand(s.shape[:-1]).reshape(rows).contiguous()
    else:
        logk = math.log(max(float(k), 1e-20))
    if isinstance(logk, torch.Tensor):
        return COOR_DESCENT(s, mask, logk, 0.0, *settings)
    return COOR_DESCENT(s, mask, None, logk, *settings)
