"""Small kernels for tests/teaching/test_student_kernels.py (``@triton.jit`` reads source from a file)."""

import triton
import triton.language as tl


@triton.jit
def doubled(value):
    return value * 2


@triton.jit
def double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, doubled(tl.load(x_ptr + offsets, mask=offsets < n)), mask=offsets < n)


@triton.jit
def double_past_the_end_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, doubled(tl.load(x_ptr + offsets, mask=offsets <= n)), mask=offsets <= n)


@triton.jit
def endless_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    count = n
    while count > 0:
        count = count + 1
    offsets = tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n), mask=offsets < n)


@triton.jit
def misspelt_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.load(x_ptr + ofsets, mask=offsets < n), mask=offsets < n)  # noqa: F821


@triton.jit
def sum_without_other_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.zeros((BLOCK,), tl.float32) + tl.sum(tl.load(x_ptr + offsets, mask=offsets < n)),
             mask=offsets < n)


@triton.jit
def sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    total = tl.sum(tl.load(x_ptr + offsets, mask=offsets < n, other=0.0))
    tl.store(out_ptr + offsets, tl.zeros((BLOCK,), tl.float32) + total, mask=offsets < n)
