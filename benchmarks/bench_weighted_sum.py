"""Weighted sum against `x @ w` (torch eager) and its torch.compile: forward, backward,
and the training step (forward and backward as a user's loop calls them, also inside
torch.compile(mode="reduce-overhead")).

Bytes counted: forward reads x (M·D·es); backward reads x and writes grad_x (2·M·D·es);
the step both (3·M·D·es).
"""

import torch

from course_lib import weighted_sum
from course_lib.core.benchmarking import forward_backward_ms, fresh_compile, row, step_rows

SHAPES = [(65536, 1024), (16384, 8192), (1048576, 128)]
# The training step, eager and compiled, at two of them (each compile takes seconds).
STEP_SHAPES = [(65536, 1024), (16384, 8192)]
DTYPES = [torch.float32, torch.bfloat16]


def matvec(x, w):
    return x @ w


def run(copy_gbps, shapes=SHAPES, dtypes=DTYPES, steps_only=False):
    rows = []
    for dtype in dtypes:
        for shape in shapes:
            if steps_only and shape not in STEP_SHAPES:
                continue
            x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
            w = torch.randn(shape[-1], device="cuda", dtype=dtype, requires_grad=True)
            n_bytes = x.numel() * x.element_size()
            impls = {"course_lib": weighted_sum, "torch": matvec, "torch.compile": fresh_compile(matvec)}
            for impl, fn in () if steps_only else impls.items():
                fwd, bwd = forward_backward_ms(fn, x, w)
                rows.append(row("weighted_sum", "fwd", impl, dtype, shape, fwd, n_bytes, copy_gbps))
                rows.append(row("weighted_sum", "bwd", impl, dtype, shape, bwd, 2 * n_bytes, copy_gbps))
            if shape in STEP_SHAPES:
                rows += step_rows("weighted_sum", dtype, shape, weighted_sum, matvec, (x, w), 3 * n_bytes, copy_gbps)
    return rows
