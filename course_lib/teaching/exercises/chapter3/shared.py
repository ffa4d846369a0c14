"""What chapter 3's kernel checkers share: outputs filled with NaN, the forward's saved
statistics in float64, and the hint that names a masked load without ``other=``."""

import inspect

import torch

from ....core.runtime import DEVICE
from ...checking import ExerciseError
from ...student_kernels import run_interpreted


EPS = 1e-5


def _with_nan_rows(n_rows, n_cols, row_stride=None):
    """A float32 (n_rows, n_cols) output filled with NaN, rows ``row_stride`` elements apart."""
    row_stride = row_stride or n_cols
    return torch.full((n_rows, row_stride), float("nan"), device=DEVICE)[:, :n_cols]


def _layernorm_stats64(x, eps):
    """mean and rstd of each row of a float64 x, shapes x.shape[:-1]: the forward's saved statistics."""
    mean = x.mean(dim=-1)
    var = ((x - mean[..., None]) ** 2).mean(dim=-1)
    return mean, torch.rsqrt(var + eps)


def _masked_loads_without_other(kernel):
    """The tl.load calls of the kernel's source that have a mask= and no other=."""
    try:
        source = inspect.getsource(kernel.fn)
    except (AttributeError, OSError, TypeError):
        return []
    loads, start = [], source.find("tl.load(")
    while start != -1:
        depth, end = 0, start
        for end in range(start + len("tl.load"), len(source)):
            depth += {"(": 1, ")": -1}.get(source[end], 0)
            if depth == 0:
                break
        call = " ".join(source[start:end + 1].split())
        if "mask=" in call and "other=" not in call:
            loads.append(call)
        start = source.find("tl.load(", end)
    return loads


def _with_hint(error, hint, kernel, outputs):
    """``error`` with its hint line; without one, NaN in the outputs and a masked load without
    other= in the kernel name that load."""
    if hint is None and any(isinstance(t, torch.Tensor) and t.isnan().any() for t in outputs):
        loads = _masked_loads_without_other(kernel)
        if loads:
            hint = (f"{loads[0]} has a mask but no other=: its masked lanes hold whatever memory held (NaN in "
                    "the checker's interpreted run), and a sum over the tile spreads them; give other=0.0")
    return ExerciseError(str(error) + (f"\n  hint: {hint}" if hint else ""))


def _fresh_like(out):
    """New NaN-filled outputs laid out as ``out`` (a tensor, a tuple of them, or None)."""
    if out is None:
        return None
    if isinstance(out, tuple):
        return tuple(_fresh_like(t) for t in out)
    if out.ndim == 2:
        return _with_nan_rows(out.shape[0], out.shape[1], out.stride(0))
    return torch.full(out.shape, float("nan"), device=out.device)


def _undefined_lanes_hint(rerun, out, outputs):
    """When the outputs hold NaN that a masked load without other= put there, a hint naming
    that load (not the pattern of wrong rows). ``rerun(out)`` runs the case again into
    ``out`` with the masked lanes the interpreter's 0 (``run_interpreted(...,
    undefined_as_nan=False)``): NaN that disappear there came from those lanes."""
    if not any(isinstance(t, torch.Tensor) and t.isnan().any() for t in outputs):
        return None
    loads = _masked_loads_without_other(rerun.kernel)
    if not loads:
        return None
    try:
        again = rerun(_fresh_like(out))
    except ExerciseError:
        return None
    again = again if isinstance(again, tuple) else (again,)
    if any(not isinstance(t, torch.Tensor) or t.isnan().any() for t in again):
        return None
    return (f"{' and '.join(loads)} {'has' if len(loads) == 1 else 'have'} a mask but no other=: the lanes the mask "
            "switches off hold no defined value (NaN in the checker's interpreted run, whatever memory held on a "
            "GPU), and they reach the results (with those lanes 0 the NaN are gone); give other=0.0, or keep "
            "those lanes out with tl.where before they are used")


def _rerun(name, launch, kernel, before, after=()):
    """``rerun(out)`` for _undefined_lanes_hint: the launch again into ``out``, masked lanes 0."""
    def rerun(out):
        return run_interpreted(name, launch, kernel, *before, out, *after, undefined_as_nan=False)

    rerun.kernel = kernel
    return rerun
