"""Coordinate descent (CoLT5's router) against the PyTorch reference, eager and under
torch.compile: forward, backward, and the training step (both, as a user's loop calls
them, also inside torch.compile(mode="reduce-overhead")).

    python -m benchmarks --only coor_descent

Float32, 20 iterations with eps_init = 4, eps_decay = 0.7, eps = 0.03 and k = n / 8.
Bytes counted: the forward reads s and writes y, 2·rows·n·4; the backward reads s and
dy and writes ds, 3·rows·n·4; the step both, 5·rows·n·4. The kernels do 20 passes over
rows held in registers, so the speed ratios say more than the fractions of C. Each row also has peak_extra_bytes:
the most memory allocated during a forward and backward, beyond what was allocated
before them (s and dy): y, ds and every workspace.
"""

import torch

from course_lib.core import references
from course_lib.core.benchmarking import forward_backward_ms, fresh_compile, row, step_rows
from course_lib.kernels.coor_descent_op import coor_descent

SHAPES = [(1024, 4096), (256, 32768), (4096, 1024), (4, 131072)]
# The training step, eager and compiled, at two of them (each compile takes seconds).
STEP_SHAPES = [(1024, 4096), (4096, 1024)]
SETTINGS = dict(n_iters=20, eps=0.03, eps_init=4, eps_decay=0.7)


def peak_extra_bytes(fn, s):
    grad_y = torch.randn_like(s)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    torch.autograd.grad(fn(s), s, grad_y)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def run(copy_gbps, shapes=SHAPES, steps_only=False):
    rows = []
    for n_rows, n_cols in shapes:
        if steps_only and (n_rows, n_cols) not in STEP_SHAPES:
            continue
        s = torch.randn(n_rows, n_cols, device="cuda", requires_grad=True)
        settings = dict(k=n_cols / 8, **SETTINGS)
        compiled = fresh_compile(references.coor_descent)
        impls = {
            "course_lib": lambda t: coor_descent(t, **settings),
            "torch": lambda t: references.coor_descent(t, **settings),
            "torch.compile": lambda t: compiled(t, **settings),
        }
        n_bytes = s.numel() * s.element_size()
        for impl, fn in () if steps_only else impls.items():
            fwd, bwd = forward_backward_ms(fn, s)
            peak = peak_extra_bytes(fn, s)
            for pass_, timings, moved in (("fwd", fwd, 2 * n_bytes), ("bwd", bwd, 3 * n_bytes)):
                result = row("coor_descent", pass_, impl, torch.float32, (n_rows, n_cols), timings, moved, copy_gbps)
                result["peak_extra_bytes"] = peak
                rows.append(result)
        if (n_rows, n_cols) in STEP_SHAPES:
            rows += step_rows("coor_descent", torch.float32, (n_rows, n_cols), impls["course_lib"],
                              lambda t, settings=settings: references.coor_descent(t, **settings), (s,),
                              5 * n_bytes, copy_gbps)
    return rows
