"""Launch plans: how a kernel's work is cut into programs, in one form for every kernel,
and the one rule that gives a program its warps.

Each kernel module keeps the table or the rule that chooses its plans beside its
launchers, with a :class:`TunedOn` saying which GPU, Triton release and sweep
(``benchmarks/tune_<name>.py``) chose it: a plan tuned on one GPU is a starting point,
not a law, on another.
"""

from typing import NamedTuple


class LaunchPlan(NamedTuple):
    """A program's tile and how it runs.

    ``block_rows`` rows (for attention, queries) of ``block_cols`` columns (keys) a tile;
    ``num_warps`` warps a program; ``num_stages`` iterations of its loop in flight
    (``tl.range``'s software pipelining: the next tiles load into shared memory while
    this one is computed; 1 is none).
    """

    block_rows: int
    block_cols: int
    num_warps: int
    num_stages: int = 1


class TunedOn(NamedTuple):
    """Where a kernel's launch plans were chosen."""

    gpu: str
    triton: str
    sweep: str  # the script that swept them

    def __str__(self):
        return f"{self.sweep} on an {self.gpu}, Triton {self.triton}"


def warps_for(amount, per_warp, *, min_warps=1, max_warps=16, fill=None):
    """Warps for a program: one for every ``per_warp`` of ``amount`` (values, bytes or
    columns of its tile), from ``min_warps`` to ``max_warps``; with ``fill``, never more
    than ``amount // fill`` (a warp with fewer than ``fill`` of them idles), and at least 1."""
    warps = max(min_warps, min(max_warps, amount // per_warp))
    if fill is not None:
        warps = max(1, min(warps, amount // fill))
    return warps
