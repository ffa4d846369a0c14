"""Causal softmax against torch eager (`masked_fill` + `softmax`) and its torch.compile:
forward, backward and the training step (both, as a user's loop calls them, also inside
torch.compile(mode="reduce-overhead")); and a wide plain softmax, 2**17 columns, against
`x.softmax(-1)`.

Bytes counted for causal softmax, per (n, n) matrix: the forward reads the lower
triangle and writes everything, 1.5·n²·es; the backward reads the lower triangles of
y and grad_y and writes grad_x, 2·n²·es; the step both, 3.5·n²·es. For the plain softmax
of (M, N): forward 2·M·N·es (read x, write y), backward 3·M·N·es (read y and grad_y,
write grad_x), the step 5·M·N·es.
"""

import torch

from course_lib.core.benchmarking import forward_backward_ms, fresh_compile, row, step_rows
from course_lib.kernels.softmax_op import causal_softmax, softmax

SHAPES = [(64, 1024), (16, 4096), (4, 8192)]  # (batch, n): batch matrices of n x n
# The training step, eager and compiled, at the smallest and the largest matrices.
STEP_SHAPES = [(64, 1024), (4, 8192)]
DTYPES = [torch.float32, torch.bfloat16]
WIDE_SHAPE = (512, 2**17)


def masked_softmax(x, hidden):
    return x.masked_fill(hidden, float("-inf")).softmax(-1)


def plain_softmax(x):
    return x.softmax(-1)


def run(copy_gbps, shapes=SHAPES, dtypes=DTYPES, wide_shape=WIDE_SHAPE, steps_only=False):
    rows = []
    for dtype in dtypes:
        for batch, n in shapes:
            if steps_only and (batch, n) not in STEP_SHAPES:
                continue
            x = torch.randn(batch, n, n, device="cuda", dtype=dtype, requires_grad=True)
            hidden = torch.ones(n, n, device="cuda", dtype=torch.bool).triu(diagonal=1)
            matrix_bytes = batch * n * n * x.element_size()
            compiled = fresh_compile(masked_softmax)
            impls = {"course_lib": lambda t: causal_softmax(t), "torch": lambda t: masked_softmax(t, hidden),
                     "torch.compile": lambda t: compiled(t, hidden)}
            for impl, fn in () if steps_only else impls.items():
                fwd, bwd = forward_backward_ms(fn, x)
                shape = (batch, n, n)
                rows.append(row("causal_softmax", "fwd", impl, dtype, shape, fwd, 1.5 * matrix_bytes, copy_gbps))
                rows.append(row("causal_softmax", "bwd", impl, dtype, shape, bwd, 2 * matrix_bytes, copy_gbps))
            if (batch, n) in STEP_SHAPES:
                rows += step_rows("causal_softmax", dtype, (batch, n, n), causal_softmax,
                                  lambda t, hidden=hidden: masked_softmax(t, hidden), (x,), 3.5 * matrix_bytes,
                                  copy_gbps)
        x = torch.randn(wide_shape, device="cuda", dtype=dtype, requires_grad=True)
        n_bytes = x.numel() * x.element_size()
        impls = {"course_lib": softmax, "torch": plain_softmax, "torch.compile": fresh_compile(plain_softmax)}
        for impl, fn in () if steps_only else impls.items():
            fwd, bwd = forward_backward_ms(fn, x)
            rows.append(row("softmax", "fwd", impl, dtype, wide_shape, fwd, 2 * n_bytes, copy_gbps))
            rows.append(row("softmax", "bwd", impl, dtype, wide_shape, bwd, 3 * n_bytes, copy_gbps))
        rows += step_rows("softmax", dtype, wide_shape, softmax, plain_softmax, (x,), 5 * n_bytes, copy_gbps)
    return rows
