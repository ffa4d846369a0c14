"""The eager floor: each kernel's training step with nothing around its Triton kernels.

For every kernel of benchmarks/host.py, a torch.autograd.Function that launches the kernels
course_lib launches, on the launch plans course_lib picks, with plain ``kernel[grid](...)``
and outputs from ``torch.empty``: no checks, no custom operator, no dispatch on shapes, no
lookups. Plans, grids and every integer argument are worked out once, when the floor is
built for its inputs (``FLOORS[kernel](*inputs)``), as a model of fixed shapes could; a
call only allocates and launches. What it costs is autograd's and Triton's launcher's own
host time: the least a step of these kernels can cost in eager mode, which course_lib's
"host" rows are set beside (impl "floor").

A floor takes inputs of the shapes, dtype and (contiguous) strides it was built for, and
its incoming gradients contiguous, as the benchmark's steps pass them; each holds rows in
one block, as course_lib does at the benchmark's shapes. tests/test_floor.py checks their
values against course_lib's functions under the interpreter.
"""

import math
from typing import NamedTuple

import torch

from course_lib.core.rows import column_sum_blocks, column_sum_kernel, vector_width, width_hint
from course_lib.core.runtime import cdiv, multiprocessor_count
from course_lib.core.split_rows import slots_block
from course_lib.kernels import coor_descent_op, softmax_op, weighted_sum_op
from course_lib.kernels.layernorm_op import parts as layernorm_parts
from course_lib.kernels.layernorm_op import whole_rows as layernorm_whole_rows


class Launch(NamedTuple):
    """One kernel launch with everything but its tensors fixed: ``launch(*tensors)``."""

    kernel: object
    grid: tuple
    scalars: tuple  # the kernel's arguments after its tensors
    options: dict  # constexprs and launch options

    def __call__(self, *tensors):
        self.kernel[self.grid](*tensors, *self.scalars, **self.options)


def _column_sum(n_partial_rows, width):
    """rows.sum_partial_rows' launch: partial (n_partial_rows, width) float32 -> (width,)."""
    block_rows, block_cols = column_sum_blocks(n_partial_rows, width)
    return Launch(column_sum_kernel, (cdiv(width, block_cols),), (n_partial_rows, width, width),
                  dict(BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols, NUM_STAGES=3))


def _whole_rows(name, block_cols, n_cols):
    if block_cols < n_cols:
        raise ValueError(f"floor {name}: rows of {n_cols} take course_lib's looped kernels, which the floor lacks")


# ------------------------------------------------------------------------ weighted_sum


class WeightedSumPlan(NamedTuple):
    forward: Launch
    backward: Launch
    column_sum: Launch
    row_groups: int


class WeightedSumFloor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, plan):
        y = torch.empty(x.shape[:-1], device=x.device, dtype=x.dtype)
        plan.forward(x, weight, y)
        ctx.save_for_backward(x, weight)
        ctx.plan = plan
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        plan = ctx.plan
        grad_x = torch.empty(x.shape, device=x.device, dtype=x.dtype)
        partial = torch.empty((plan.row_groups, x.shape[-1]), device=x.device, dtype=torch.float32)
        plan.backward(x, weight, grad_y, grad_x, partial)
        grad_weight = torch.empty(weight.shape, device=x.device, dtype=weight.dtype)
        plan.column_sum(partial, grad_weight)
        return grad_x, grad_weight, None


def weighted_sum(x, weight):
    """The floor of ``course_lib.weighted_sum`` for 2-D x like this one (weighted_sum_op's launchers)."""
    n_rows, n_cols = x.shape
    size = x.element_size()
    vec = vector_width(x)
    rows, cols, warps, stages = weighted_sum_op.forward_tiles(n_cols, size, wide_loads=vec * size == 16)
    forward = Launch(weighted_sum_op.weighted_sum_forward_kernel, (cdiv(n_rows, rows),),
                     (n_rows, n_cols, *x.stride(), weight.stride(0), 1),
                     dict(BLOCK_ROWS=rows, BLOCK_COLS=cols, NUM_STAGES=stages, WHOLE_ROWS=cols >= n_cols,
                          VEC=width_hint(x, vec=vec), num_warps=warps))
    rows, cols, warps, stages = weighted_sum_op.backward_tiles(n_cols, size)
    col_blocks = cdiv(n_cols, cols)
    rows_per_program, row_groups = weighted_sum_op.backward_row_groups(n_rows, col_blocks, rows)
    backward = Launch(weighted_sum_op.weighted_sum_backward_kernel, (col_blocks, row_groups),
                      (n_rows, n_cols, rows_per_program, *x.stride(), weight.stride(0), 1, n_cols, 1, n_cols),
                      dict(BLOCK_ROWS=rows, BLOCK_COLS=cols, NUM_STAGES=stages,
                           VEC=width_hint(x, torch.empty_like(x)), num_warps=warps))
    plan = WeightedSumPlan(forward, backward, _column_sum(row_groups, n_cols), row_groups)
    return lambda x, weight: WeightedSumFloor.apply(x, weight, plan)


# ------------------------------------------------------------------ softmax, causal_softmax


class SoftmaxPlan(NamedTuple):
    forward: Launch
    backward: Launch


class SoftmaxFloor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, plan):
        y = torch.empty(x.shape, device=x.device, dtype=x.dtype)
        plan.forward(x, y)
        ctx.save_for_backward(y)
        ctx.plan = plan
        return y

    @staticmethod
    def backward(ctx, grad_y):
        (y,) = ctx.saved_tensors
        grad_x = torch.empty(y.shape, device=y.device, dtype=y.dtype)
        ctx.plan.backward(y, grad_y, grad_x, y)  # y again as the anchor, as softmax_backward passes it
        return grad_x, None


def _softmax(x, causal):
    """The floor of softmax (causal: causal_softmax) for x of 2 or 3 dimensions like this one."""
    name = "causal_softmax" if causal else "softmax"
    n_cols, rows_per_matrix = x.shape[-1], x.shape[-2]
    n_rows = x.numel() // n_cols
    # (matrix, row, column) strides, as softmax_op._as_matrices gives them
    strides = x.stride() if x.ndim == 3 else (rows_per_matrix * x.stride(0), *x.stride())
    size = x.element_size()
    rows, cols, warps, _ = softmax_op.forward_tiles(n_cols, size)
    _whole_rows(name, cols, n_cols)
    forward = Launch(softmax_op.softmax_forward_kernel, (cdiv(n_rows, rows),),
                     (n_rows, rows_per_matrix, n_cols, 0, *strides, n_cols),
                     dict(CAUSAL=causal, BLOCK_ROWS=rows, BLOCK_COLS=cols, num_warps=warps))
    rows, cols, warps, _ = softmax_op.backward_tiles(n_cols, size, causal=causal)
    _whole_rows(name, cols, n_cols)
    backward = Launch(softmax_op.softmax_backward_kernel, (cdiv(n_rows, rows),),
                      (n_rows, rows_per_matrix, n_cols, 0, n_cols, *strides, n_cols),
                      dict(CAUSAL=causal, BLOCK_ROWS=rows, BLOCK_COLS=cols, num_warps=warps))
    plan = SoftmaxPlan(forward, backward)
    return lambda x: SoftmaxFloor.apply(x, plan)


def softmax(x):
    return _softmax(x, causal=False)


def causal_softmax(x):
    return _softmax(x, causal=True)


# --------------------------------------------------------------------------- layernorm


class LayerNormPlan(NamedTuple):
    forward: Launch
    backward: Launch
    column_sum: Launch
    row_groups: int


class LayerNormFloor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gamma, beta, plan):
        n_rows = x.shape[0]
        y = torch.empty(x.shape, device=x.device, dtype=x.dtype)
        mean = torch.empty(n_rows, device=x.device, dtype=torch.float32)
        rstd = torch.empty(n_rows, device=x.device, dtype=torch.float32)
        plan.forward(x, gamma, beta, y, mean, rstd)
        ctx.save_for_backward(x, gamma, mean, rstd)
        ctx.plan = plan
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, gamma, mean, rstd = ctx.saved_tensors
        plan = ctx.plan
        n_cols = x.shape[-1]
        grad_x = torch.empty(x.shape, device=x.device, dtype=x.dtype)
        partial = torch.empty((plan.row_groups, 2 * n_cols), device=x.device, dtype=torch.float32)
        plan.backward(x, gamma, grad_y, mean, rstd, grad_x, partial)
        sums = torch.empty(2 * n_cols, device=x.device, dtype=gamma.dtype)  # dgamma, then dbeta
        plan.column_sum(partial, sums)
        return grad_x, sums[:n_cols], sums[n_cols:], None


def layernorm(x, gamma, beta, eps=1e-5):
    """The floor of ``course_lib.layernorm`` (gamma and beta given) for 2-D x like this one."""
    n_rows, n_cols = x.shape
    size = x.element_size()
    rows, cols, warps, _ = layernorm_parts.forward_tiles(n_cols, size)
    _whole_rows("layernorm", cols, n_cols)
    forward = Launch(layernorm_whole_rows.layernorm_forward_kernel, (cdiv(n_rows, rows),),
                     (n_rows, n_cols, eps, *x.stride(), gamma.stride(0), beta.stride(0), n_cols),
                     dict(HAS_GAMMA=True, HAS_BETA=True, SAVE_STATS=True, BLOCK_ROWS=rows, BLOCK_COLS=cols,
                          VEC=width_hint(x, torch.empty_like(x)), num_warps=warps))
    config = layernorm_parts.backward_config(n_cols, size)
    rows, cols, warps, stages = config.tiles
    _whole_rows("layernorm", cols, n_cols)
    rows_per_group, partial = layernorm_parts.partial_rows(
        n_rows, rows, config.programs_per_sm * multiprocessor_count(), 2 * n_cols, x.device)
    row_groups = partial.shape[0]
    backward = Launch(layernorm_whole_rows.layernorm_backward_kernel, (row_groups,),
                      (n_rows, n_cols, rows_per_group, *x.stride(), gamma.stride(0), n_cols, 1, n_cols, 2 * n_cols),
                      dict(HAS_GAMMA=True, HAS_BETA=True, BLOCK_ROWS=rows, BLOCK_COLS=cols, NUM_STAGES=stages,
                           VEC=width_hint(x, torch.empty_like(x), torch.empty_like(x)), num_warps=warps))
    plan = LayerNormPlan(forward, backward, _column_sum(row_groups, 2 * n_cols), row_groups)
    return lambda x, gamma, beta: LayerNormFloor.apply(x, gamma, beta, plan)


# ------------------------------------------------------------------------ coor_descent


class CoorDescentPlan(NamedTuple):
    forward: Launch
    backward: Launch
    schedule: coor_descent_op.Schedule
    n_iters: int


class CoorDescentFloor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, s, plan):
        n_rows = s.shape[0]
        y = torch.empty(s.shape, device=s.device, dtype=s.dtype)
        a = torch.empty((n_rows, plan.n_iters), device=s.device, dtype=torch.float64)
        row_max = torch.empty(n_rows, device=s.device, dtype=torch.float32)
        # no mask, k one number (no logk tensor), whole rows (no slots)
        plan.forward(s, None, None, plan.schedule.eps, a, row_max, y, None)
        ctx.save_for_backward(s, a, row_max)
        ctx.plan = plan
        return y

    @staticmethod
    def backward(ctx, grad_y):
        s, a, row_max = ctx.saved_tensors
        plan = ctx.plan
        grad_s = torch.empty(s.shape, device=s.device, dtype=s.dtype)
        grad_logk = torch.empty(s.shape[0], device=s.device, dtype=torch.float32)  # written; k is a number
        plan.backward(s, None, grad_y, None, plan.schedule.eps, plan.schedule.exp2_scale, a, row_max, None,
                      grad_s, grad_logk, s)  # s again as the anchor, as coor_descent_backward passes it
        return grad_s, None


def coor_descent(s, *, n_iters, k, eps, eps_init, eps_decay):
    """The floor of ``course_lib.coor_descent`` with these settings (k one number, no mask)
    for 2-D s like this one."""
    n_rows, n_cols = s.shape
    logk = math.log(max(float(k), 1e-20))
    plan = coor_descent_op.forward_plan(n_rows, n_cols)
    if plan.tiles > 1:
        raise ValueError(f"floor coor_descent: rows of {n_cols} are split, which the floor does not do")
    forward = Launch(coor_descent_op.coor_descent_forward_kernel, (plan.row_programs, 1),
                     (n_rows, n_cols, n_iters, logk, 0, n_iters + 2, *s.stride(), 0, 0, n_cols),
                     dict(HAS_MASK=False, LOGK_PER_ROW=False, SPLIT=False, BLOCK=plan.block,
                          TILES_BLOCK=slots_block(1, plan.num_warps), num_warps=plan.num_warps))
    plan = coor_descent_op.backward_plan(n_rows, n_cols)
    if plan.tiles > 1:
        raise ValueError(f"floor coor_descent: rows of {n_cols} take the split backward, which the floor lacks")
    backward = Launch(coor_descent_op.coor_descent_backward_kernel, (n_rows, 1),
                      (n_cols, n_iters, logk, *s.stride(), 0, 0, *s.stride(), n_cols),
                      dict(SPLIT=False, HAS_MASK=False, LOGK_PER_ROW=False, BLOCK=plan.block, num_warps=plan.num_warps,
                           maxnreg=coor_descent_op.BACKWARD_MAX_REGISTERS))
    schedule = coor_descent_op.make_eps_schedule(n_iters, float(eps), float(eps_init), float(eps_decay), s.device)
    floor_plan = CoorDescentPlan(forward, backward, schedule, n_iters)
    return lambda s: CoorDescentFloor.apply(s, floor_plan)


# kernel -> the floor's builder, called with the benchmark's inputs (coor_descent: and its settings)
FLOORS = {"weighted_sum": weighted_sum, "softmax": softmax, "causal_softmax": causal_softmax,
          "layernorm": layernorm, "coor_descent": coor_descent}
