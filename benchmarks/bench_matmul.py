"""Matrix multiplication against torch.matmul (cuBLAS) and its torch.compile: forward,
backward, the training step, and the fused epilogue ("matmul_bias_gelu": course_lib's
one kernel against torch's matmul, bias and gelu as separate operations).

Work counted: the forward 2·M·N·K floating-point operations, the backward twice that
(two products); rows carry TFLOP/s (``tflops``, ``gpu_tflops``), the measure that counts
here. Bytes counted: the forward reads A and B and writes C, (MK + KN + MN)·es; the
backward reads grad_C twice, A and B, and writes grad_A and grad_B, 2·(MK + KN + MN)·es;
the step both.
"""

import torch
import torch.nn.functional as F

from course_lib import matmul
from course_lib.kernels import matmul_op
from course_lib.core.benchmarking import forward_backward_ms, fresh_compile, row, step_rows

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 1024, 4096)]  # (M, N, K)
DTYPES = [torch.bfloat16, torch.float16]
# bfloat16 at every shape, float16 at the first; the training step in bfloat16 at one shape
# (each compile takes seconds, and each new size a round of autotuning).
SHAPES_OF = {torch.bfloat16: SHAPES, torch.float16: SHAPES[:1]}
STEP_SHAPE = (4096, 4096, 4096)


def torch_matmul(a, b):
    return a @ b


def bias_gelu(a, b, bias):
    return matmul(a, b, bias=bias, activation="gelu")


def torch_bias_gelu(a, b, bias):
    return F.gelu(a @ b + bias, approximate="tanh")


def _product_rows(kernel, impls, inputs, dtype, shape, copy_gbps):
    """fwd and bwd rows of every implementation of one product."""
    m, n, k = shape
    n_bytes = (m * k + k * n + m * n) * inputs[0].element_size()
    flops = 2 * m * n * k
    # which of course_lib's kernels multiplied (matmul_op.takes_tma), for the book to name
    a, b = (t.detach() for t in inputs[:2])
    triton_kernel = ("matmul_tma_kernel" if matmul_op.takes_tma(a, b, torch.empty(m, n, device=a.device, dtype=a.dtype))
                     else "matmul_kernel")
    rows = []
    for impl, fn in impls.items():
        fwd, bwd = forward_backward_ms(fn, *inputs)
        rows.append(row(kernel, "fwd", impl, dtype, shape, fwd, n_bytes, copy_gbps, flops=flops))
        rows.append(row(kernel, "bwd", impl, dtype, shape, bwd, 2 * n_bytes, copy_gbps, flops=2 * flops))
        if impl == "course_lib":
            rows[-2]["triton_kernel"] = rows[-1]["triton_kernel"] = triton_kernel
    return rows


def run(copy_gbps, shapes=SHAPES, dtypes=DTYPES, steps_only=False):
    rows = []
    for dtype in dtypes:
        for shape in shapes:
            with_step = dtype == torch.bfloat16 and shape == STEP_SHAPE
            if shape not in SHAPES_OF.get(dtype, shapes) or (steps_only and not with_step):
                continue
            m, n, k = shape
            a = torch.randn(m, k, device="cuda", dtype=dtype, requires_grad=True)
            b = (torch.randn(k, n, device="cuda", dtype=dtype) / k**0.5).requires_grad_()
            bias = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
            if not steps_only:
                rows += _product_rows("matmul", {"course_lib": matmul, "torch": torch_matmul,
                                                 "torch.compile": fresh_compile(torch_matmul)},
                                      (a, b), dtype, shape, copy_gbps)
                rows += _product_rows("matmul_bias_gelu", {"course_lib": bias_gelu, "torch": torch_bias_gelu,
                                                           "torch.compile": fresh_compile(torch_bias_gelu)},
                                      (a, b, bias), dtype, shape, copy_gbps)
            if with_step:
                n_bytes = 3 * (m * k + k * n + m * n) * a.element_size()
                rows += step_rows("matmul", dtype, shape, matmul, torch_matmul, (a, b), n_bytes, copy_gbps,
                                  flops=6 * m * n * k)
    return rows
