"""The host side of the kernels: the plans that pick tiles, warps and grids, the ε
schedule the kernels read, and the functions that launch the forward and the backward."""

import functools
from typing import NamedTuple

import torch

from .kernels import (LOG2E, coor_descent_backward_kernel, coor_descent_backward_partials_kernel,
                      coor_descent_forward_kernel)
from ...core.plans import TunedOn, warps_for
from ...core.runtime import (ON_GPU, cdiv, is_cooperative_refusal, launch, multiprocessor_count, next_power_of_2,
                             spin_waits_allowed)
from ...core.split_rows import slots_block
from ...core.validation import on_device_of

# The plans below were chosen by this sweep:
TUNED_ON = TunedOn("NVIDIA H200", "3.6.0", "benchmarks/tune_coor_descent.py")
# Rows up to this many columns are one program each, held in registers (128 float32
# values a thread at 8 warps); longer rows are split into tiles, which must exchange
# every iteration's sums through memory.
ROW_BLOCK_MAX = 32768
# When few rows leave multiprocessors idle, split rows down to tiles of this many
# columns so that every multiprocessor gets one.
SPLIT_TILE_MIN = 4096
# The backward holds s and ds: whole rows up to this many columns, longer ones in
# tiles of BACKWARD_SPLIT_TILE.
BACKWARD_ROW_BLOCK_MAX = 16384
BACKWARD_SPLIT_TILE = 4096
MAX_COUNTED_TILE = 2**16 - 1  # count_two's 16-bit counts: the widest backward tile
# Columns a warp (the best of benchmarks/tune_coor_descent.py's sweep). A row's
# twenty iterations are a chain of reductions, each waiting on the last: the fewer
# warps a reduction crosses, the shorter the chain. Whole rows all run at once at these
# sizes, so fewer warps cost no parallelism. A split tile is one of few programs and
# needs more warps; so does the backward.
ROW_COLUMNS_PER_WARP = 4096
TILE_COLUMNS_PER_WARP = 1024
MIN_TILE_WARPS = 4
# The backward holds s, dy and ds: 32 values of each a thread at these warps. Left to
# itself the compiler takes 161 registers a thread for rows of 4096 (3 programs of 4
# warps a multiprocessor); capped at 128 it spills nothing and fits 4.
BACKWARD_MAX_REGISTERS = 128


class ForwardPlan(NamedTuple):
    block: int  # columns a program holds: the whole row, or one tile of it
    tiles: int  # programs a row is split across
    row_programs: int  # programs along the rows; each takes rows in turn
    num_warps: int
    single_launch: bool  # all steps in one launch (split rows then wait on each other)


class BackwardPlan(NamedTuple):
    block: int
    tiles: int
    num_warps: int


def _warps(block, columns_per_warp, min_warps=1):
    """One warp for every ``columns_per_warp`` columns of the block, from ``min_warps`` to
    16, and never more than the block fills (32 columns a warp)."""
    return warps_for(block, columns_per_warp, min_warps=min_warps, fill=32)


def forward_plan(n_rows, n_cols):
    """Whole rows in registers when they fit; otherwise tiles, more of them when there
    are too few rows to give each multiprocessor a program.

    Split rows wait on each other, so a single launch needs every program resident at
    once: at most one a multiprocessor. More tiles than that, or the interpreter (which
    runs programs one after another), take one launch a step.
    """
    if n_cols <= ROW_BLOCK_MAX:
        block = next_power_of_2(n_cols)
        return ForwardPlan(block, 1, n_rows, _warps(block, ROW_COLUMNS_PER_WARP), True)
    sms = multiprocessor_count()
    tiles = max(cdiv(n_cols, ROW_BLOCK_MAX), min(sms // n_rows, cdiv(n_cols, SPLIT_TILE_MIN)))
    block = next_power_of_2(cdiv(n_cols, tiles))
    tiles = cdiv(n_cols, block)
    single_launch = ON_GPU and tiles <= sms
    row_programs = min(n_rows, max(1, sms // tiles)) if single_launch else n_rows
    return ForwardPlan(block, tiles, row_programs, _warps(block, TILE_COLUMNS_PER_WARP, MIN_TILE_WARPS), single_launch)


def backward_plan(n_rows, n_cols):
    """Whole rows when they fit in registers, else tiles of BACKWARD_SPLIT_TILE."""
    block = next_power_of_2(n_cols) if n_cols <= BACKWARD_ROW_BLOCK_MAX else BACKWARD_SPLIT_TILE
    return BackwardPlan(block, cdiv(n_cols, block), _warps(block, TILE_COLUMNS_PER_WARP))


class Schedule(NamedTuple):
    """The ε of every iteration, as the kernels read it (eps_schedule)."""

    n_iters: int
    eps: torch.Tensor  # (n_iters + 1,) float64: iterations 0 .. n_iters-1, then the final one y divides by
    exp2_scale: torch.Tensor  # (n_iters + 1,) float64: LOG2E / eps, what the backward multiplies by


def make_eps_schedule(n_iters, eps, eps_init, eps_decay, device):
    """The Schedule on the device (eps_schedule keeps one for each setting). The backward multiplies
    by LOG2E / eps instead of dividing: float64 divisions are slow, and it would do two an
    iteration. In the forward the division overlaps the row's sum, and reading a second
    table measured slower, so it divides."""
    current = max(eps if eps_init is None else eps_init, eps)
    values = []
    for _ in range(n_iters + 1):
        values.append(current)
        current = max(current * eps_decay, eps)
    table = torch.tensor([values, [LOG2E.value / v for v in values]], dtype=torch.float64, device=device)
    return Schedule(n_iters, table[0], table[1])


eps_schedule = functools.lru_cache(maxsize=64)(make_eps_schedule)


def _logk_args(logk):
    """(tensor or None, scalar, per row?) for the kernels' logk arguments."""
    if isinstance(logk, torch.Tensor):
        return logk, 0.0, True
    return None, float(logk), False


def coor_descent_forward(s2d, mask2d, logk, schedule, plan=None, shape=None):
    """Launch the forward; return y in s's dtype, a (rows, n_iters) float64 with
    a[:, t] = a_{t+1}, and the row maxima (rows,) float32.

    ``logk`` is a float or a float32 tensor (rows,); ``mask2d`` a uint8 view or None.
    y has ``shape`` (s's, of which s2d is the rows), by default (rows, n): allocated so,
    not a view of its rows, so that a caller may change it in place.
    """
    n_rows, n_cols = s2d.shape
    n_iters = schedule.n_iters
    # The kernel gets y itself (row-major: row r at r * n_cols), not a view of its rows:
    # traced by torch.compile, a view written by a kernel would make the output a view.
    y = torch.empty(shape or (n_rows, n_cols), device=s2d.device, dtype=s2d.dtype)
    a = torch.empty((n_rows, n_iters), device=s2d.device, dtype=torch.float64)
    row_max = torch.empty(n_rows, device=s2d.device, dtype=torch.float32)
    if n_rows == 0:
        return y, a, row_max
    plan = plan or forward_plan(n_rows, n_cols)
    split = plan.tiles > 1
    if split and plan.single_launch and ON_GPU and not spin_waits_allowed(s2d):
        # torch.compile's launches (or a Triton without them) are not cooperative: one launch a step.
        plan = plan._replace(single_launch=False, row_programs=n_rows)
    if split and plan.single_launch and not (ON_GPU and plan.tiles * plan.row_programs <= multiprocessor_count()):
        raise ValueError(
            f"coor_descent: {plan} would hang: split rows in one launch wait on each other, so all "
            f"{plan.tiles * plan.row_programs} programs must run at once, at most one a multiprocessor "
            f"({multiprocessor_count()}), and not in the interpreter, which runs them one after another"
        )
    # Tags start at 1, so zeros mean "nothing published yet". Whole rows need no slots.
    slots = torch.zeros((n_rows, 2, plan.tiles), device=s2d.device, dtype=torch.int64) if split else None
    logk_tensor, logk_value, per_row = _logk_args(logk)
    mask_strides = mask2d.stride() if mask2d is not None else (0, 0)

    def launch_steps(row_programs, first_step, last_step, cooperative=False):
        launch(coor_descent_forward_kernel, (row_programs, plan.tiles),
            s2d, mask2d, logk_tensor, schedule.eps, a, row_max, y, slots,
            n_rows, n_cols, n_iters, logk_value, first_step, last_step,
            *s2d.stride(), *mask_strides, n_cols,
            HAS_MASK=mask2d is not None, LOGK_PER_ROW=per_row, SPLIT=split,
            BLOCK=plan.block, TILES_BLOCK=slots_block(plan.tiles, plan.num_warps), num_warps=plan.num_warps,
            cooperative=cooperative,
        )

    n_steps = n_iters + 2
    with on_device_of(s2d):
        if not split:
            launch_steps(plan.row_programs, 0, n_steps)
            return y, a, row_max
        if plan.single_launch:
            try:  # cooperative: CUDA starts it only with every program resident, as the waits need
                launch_steps(plan.row_programs, 0, n_steps, cooperative=True)
                return y, a, row_max
            except RuntimeError as error:
                if not is_cooperative_refusal(error):
                    raise
                slots.zero_()  # refused before any program ran; cleared all the same
        for step in range(n_steps):  # one launch a step: no program waits on another
            launch_steps(n_rows, step, step + 1)
    return y, a, row_max


def coor_descent_backward(s2d, mask2d, logk, schedule, a, row_max, dy2d, plan=None, anchor=None):
    """Launch the backward; return ds (rows, n) in s's dtype and dlogk (rows,) float32.
    ``anchor``, a tensor the kernels take and never read, is for torch.compile
    (core.operator's ``anchored``): s itself, where the kernels' s2d is a view of it."""
    n_rows, n_cols = s2d.shape
    n_iters = schedule.n_iters
    ds = torch.empty((n_rows, n_cols), device=s2d.device, dtype=s2d.dtype)
    dlogk = torch.empty(n_rows, device=s2d.device, dtype=torch.float32)
    if n_rows == 0:
        return ds, dlogk
    plan = plan or backward_plan(n_rows, n_cols)
    if plan.block > MAX_COUNTED_TILE:
        raise ValueError(f"coor_descent: {plan} has tiles of more than {MAX_COUNTED_TILE} columns, "
                         f"which the backward's 16-bit counts (count_two) cannot hold")
    split = plan.tiles > 1
    logk_tensor, logk_value, per_row = _logk_args(logk)
    mask_strides = mask2d.stride() if mask2d is not None else (0, 0)
    common = dict(HAS_MASK=mask2d is not None, LOGK_PER_ROW=per_row, BLOCK=plan.block, num_warps=plan.num_warps,
                  maxnreg=BACKWARD_MAX_REGISTERS)
    grid = (n_rows, plan.tiles)
    anchor = s2d if anchor is None else anchor
    with on_device_of(s2d):
        if split:
            partials = torch.empty((n_rows, n_iters, plan.tiles), device=s2d.device, dtype=torch.float64)
            launch(coor_descent_backward_partials_kernel, grid,
                s2d, mask2d, dy2d, logk_tensor, schedule.eps, schedule.exp2_scale, a, row_max, partials, anchor,
                n_cols, n_iters, logk_value, *s2d.stride(), *mask_strides, *dy2d.stride(), **common,
            )
            sums = partials.sum(dim=-1)  # in a fixed order: the same sums on every run
        else:
            sums = None  # whole rows compute their own sums
        launch(coor_descent_backward_kernel, grid,
            s2d, mask2d, dy2d, logk_tensor, schedule.eps, schedule.exp2_scale, a, row_max, sums, ds, dlogk, anchor,
            n_cols, n_iters, logk_value, *s2d.stride(), *mask_strides, *dy2d.stride(), ds.stride(0),
            SPLIT=split, **common,
        )
    return ds, dlogk
