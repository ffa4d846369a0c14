"""The checks of coor_descent's inputs, shared by the public function and its operators:
they raise the errors a caller sees, naming the argument."""

import functools
import math
import numbers

import torch

from ...core.validation import FLOAT_DTYPES, check_index_range, check_same_device, check_tensor

K_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16,
            torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


# type() in (...) first: isinstance against the numbers ABCs costs a microsecond a call.
def _check_count(op, name, value):
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
        raise TypeError(f"{op}: {name} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{op}: {name} must be at least 1, got {value}")


def _check_positive(op, name, value):
    if type(value) not in (float, int) and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
        raise TypeError(f"{op}: {name} must be a number, got {type(value).__name__} {value!r}")
    if not (0 < value < math.inf):
        raise ValueError(f"{op}: {name} must be positive and finite, got {value}")


FLOAT32 = torch.finfo(torch.float32)
MAX_N_ITERS = 10_000  # a (rows, n_iters) float64 table is saved; colt5 uses tens


def check_eps_schedule(op, eps, eps_init, eps_decay):
    """eps, eps_init (None: eps) and eps_decay as coor_descent takes them; ``op`` names the
    caller in errors (the router checks its own when built)."""
    _check_smoothing(op, "eps", eps)
    if eps_init is not None:
        _check_smoothing(op, "eps_init", eps_init)
    _check_positive(op, "eps_decay", eps_decay)


def _check_smoothing(op, name, value):
    """eps and eps_init: divisors of float32 sums, so normal float32 numbers."""
    _check_positive(op, name, value)
    if not FLOAT32.tiny <= value <= FLOAT32.max:
        raise ValueError(f"{op}: {name} must be between {FLOAT32.tiny:.3g} and {FLOAT32.max:.3g} (the kernels "
                         f"divide float32 scores by it), got {value}")


def k_range(n_cols):
    return f"0 < k <= n, the row length ({n_cols})"


def check_k_values(op, k, n_cols):
    """One read of k back to the host: a per-row k is checked at the cost of a sync."""
    if k.numel() and not bool(((k > 0) & (k <= n_cols)).all()):
        raise ValueError(f"{op}: every k must satisfy {k_range(n_cols)}; k holds values outside it")


def _check_k(op, k, s):
    n_cols, leading = s.shape[-1], s.shape[:-1]
    if isinstance(k, torch.Tensor):
        check_tensor(op, "k", k, dtypes=K_DTYPES, min_ndim=0)
        check_same_device(op, s=s, k=k)
        try:
            fits = torch.broadcast_shapes(k.shape, leading) == leading
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(
                f"{op}: k must be a number or a tensor of shape s.shape[:-1] = {tuple(leading)} "
                f"(or one that broadcasts to it); got k of shape {tuple(k.shape)}"
            )
        if not torch.compiler.is_compiling():  # compiled, the operator checks the values it is given
            check_k_values(op, k, n_cols)
    elif type(k) in (float, int) or (isinstance(k, numbers.Real) and not isinstance(k, bool)):
        if not (0 < k <= n_cols):
            raise ValueError(f"{op}: k must satisfy {k_range(n_cols)}; got k = {k}")
    else:
        raise TypeError(f"{op}: k must be a number or a torch.Tensor, got {type(k).__name__}")


def _check_settings(op, n_iters, eps, eps_init, eps_decay, checkpoint_segments):
    """The settings checked; returned as the operators take them (int, float, float or None, float)."""
    _check_count(op, "n_iters", n_iters)
    if n_iters > MAX_N_ITERS:
        raise ValueError(f"{op}: n_iters must be at most {MAX_N_ITERS}, got {n_iters}")
    _check_count(op, "checkpoint_segments", checkpoint_segments)
    check_eps_schedule(op, eps, eps_init, eps_decay)
    return int(n_iters), float(eps), None if eps_init is None else float(eps_init), float(eps_decay)


# A model passes the same settings every step: each combination is checked once. typed=True
# keeps True apart from 1 and 1.0 apart from 1, which the checks treat differently; only
# settings that passed are kept (a failing check raises before anything is cached).
_check_settings_once = functools.lru_cache(maxsize=256, typed=True)(_check_settings)


def check_settings(op, n_iters, eps, eps_init, eps_decay, checkpoint_segments):
    """coor_descent's settings checked (see _check_settings), once a combination where they can be kept."""
    if torch.compiler.is_compiling():  # torch.compile traces the checks once, and warns of a cache it would skip
        return _check_settings(op, n_iters, eps, eps_init, eps_decay, checkpoint_segments)
    try:
        return _check_settings_once(op, n_iters, eps, eps_init, eps_decay, checkpoint_segments)
    except TypeError:  # a setting that cannot be a cache key (a list): the checks name it
        return _check_settings(op, n_iters, eps, eps_init, eps_decay, checkpoint_segments)


def check_inputs(op, s, n_iters, k, eps, eps_init, eps_decay, mask, checkpoint_segments, dtypes=FLOAT_DTYPES,
                 plain=False):
    """``dtypes``: the kernels' (the operator's check), or the public function's, float64 too.
    ``plain``: what plain_inputs said of s. Returns the settings as check_settings does."""
    check_tensor(op, "s", s, dtypes=dtypes, plain=plain)
    if s.shape[-1] == 0:
        raise ValueError(f"{op}: the last dimension of s must be at least 1, got s of shape {tuple(s.shape)}")
    check_index_range(op, columns=s.shape[-1], rows=s.numel() // s.shape[-1])
    settings = check_settings(op, n_iters, eps, eps_init, eps_decay, checkpoint_segments)
    if mask is not None:
        check_tensor(op, "mask", mask, dtypes=(torch.bool,))
        check_same_device(op, s=s, mask=mask)
        if mask.shape != s.shape:
            raise ValueError(
                f"{op}: mask must have the shape of s, {tuple(s.shape)}; got {tuple(mask.shape)}"
            )
    _check_k(op, k, s)
    return settings
