"""Weighted sum against `x @ w` (torch eager) and its torch.compile, forward and backward.

Bytes counted: forward reads x (M·D·es); backward reads x and writes grad_x (2·M·D·es).
"""

import torch

from course_lib import weighted_sum
from course_lib.benchmarking import median_ms, row

SHAPES = [(65536, 1024), (16384, 8192), (1048576, 128)]
DTYPES = [torch.float32, torch.bfloat16]


def matvec(x, w):
    return x @ w


IMPLS = {
    "course_lib": weighted_sum,
    "torch": matvec,
    "torch.compile": torch.compile(matvec, dynamic=False),
}


def run(copy_gbps, shapes=SHAPES, dtypes=DTYPES):
    rows = []
    for dtype in dtypes:
        for n_rows, n_cols in shapes:
            x = torch.randn(n_rows, n_cols, device="cuda", dtype=dtype, requires_grad=True)
            w = torch.randn(n_cols, device="cuda", dtype=dtype, requires_grad=True)
            grad_y = torch.randn(n_rows, device="cuda", dtype=dtype)
            n_bytes = x.numel() * x.element_size()
            for impl, fn in IMPLS.items():
                with torch.no_grad():
                    fwd_ms = median_ms(lambda: fn(x, w))
                y = fn(x, w)
                bwd_ms = median_ms(lambda: torch.autograd.grad(y, (x, w), grad_y, retain_graph=True))
                shape = (n_rows, n_cols)
                rows.append(row("weighted_sum", "fwd", impl, dtype, shape, fwd_ms, n_bytes, copy_gbps))
                rows.append(row("weighted_sum", "bwd", impl, dtype, shape, bwd_ms, 2 * n_bytes, copy_gbps))
    return rows
