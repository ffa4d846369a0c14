import subprocess
import sys

import pytest
import torch

from course_lib.core import runtime  # before triton: it may select the interpreter
from course_lib.core.split_rows import gather, publish, slots_block
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from conftest import gpu_only  # noqa: E402

DEVICE = runtime.DEVICE


@triton.jit
def publish_kernel(slots_ptr, parts_ptr, tag, n_tiles):
    """Program (p, t) publishes part p of tile t."""
    which = tl.program_id(0)
    tile = tl.program_id(1)
    publish(slots_ptr + which * n_tiles + tile, tl.load(parts_ptr + which * n_tiles + tile), tag)


@triton.jit
def gather_kernel(slots_ptr, out_ptr, tag, n_tiles, N_PARTS: tl.constexpr, TILES_BLOCK: tl.constexpr):
    first, second, largest = gather(slots_ptr, tag, n_tiles, N_PARTS, TILES_BLOCK)
    tl.store(out_ptr, first)
    tl.store(out_ptr + 1, second)
    tl.store(out_ptr + 2, largest)


@pytest.mark.parametrize("n_parts", [1, 2])
@pytest.mark.parametrize("n_tiles", [1, 3, 40])
def test_published_parts_are_gathered_in_a_fixed_order(n_tiles, n_parts):
    parts = torch.randn(n_parts, n_tiles, device=DEVICE)
    slots = torch.zeros((n_parts, n_tiles), device=DEVICE, dtype=torch.int64)
    out = torch.empty(3, device=DEVICE)
    runtime.launch(publish_kernel, (n_parts, n_tiles), slots, parts, 7, n_tiles)
    assert ((slots >> 32) == 7).all()
    runtime.launch(gather_kernel, (1,), slots, out, 7, n_tiles, N_PARTS=n_parts,
                   TILES_BLOCK=slots_block(n_tiles, num_warps=4), num_warps=4)
    torch.testing.assert_close(out[0], parts[0].sum(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out[1], parts[1].sum() if n_parts == 2 else out.new_tensor(0.0), rtol=1e-6, atol=1e-6)
    assert out[2] == parts[0].max()


@pytest.mark.parametrize("num_warps", [1, 4, 8, 16])
def test_slots_block_keeps_copies_of_a_slot_within_a_warp(num_warps):
    for n_tiles in range(1, 600):
        block = slots_block(n_tiles, num_warps)
        assert block >= n_tiles and block & (block - 1) == 0
        words = 2 * block  # gather reads two rows of slots
        # All of them in one warp, or at least one for every thread of the program.
        assert words <= 32 or words >= 32 * num_warps, (n_tiles, block)
        assert block == runtime.next_power_of_2(n_tiles) or words == 32 * num_warps  # no wider than needed


# Programs that wait on each other need all of their launch resident at once. The kernels
# that do (LayerNorm's split-row backward, coordinate descent's single-launch split rows)
# launch cooperatively: CUDA starts them only when they can all be resident. Here they run
# while another stream's kernel holds most of the GPU's threads, and two of them at once on
# two streams (which, not cooperative, can take each other's places and wait forever). Each
# runs in a child process with a time limit, so that a hang fails the test instead of the run.
SHARED_GPU_SCRIPT = r"""
import sys
import torch
import triton
import triton.language as tl
import course_lib
from course_lib.core import references
from course_lib.core.runtime import multiprocessor_count


@triton.jit
def busy_kernel(out_ptr, n_iters):
    value = tl.program_id(0).to(tl.float32)
    for _ in range(n_iters):
        value = value * 0.9999999 + 1.0
    tl.store(out_ptr + tl.program_id(0), value)


def occupy_most_threads(stream):
    # Two 1024-thread programs fill a multiprocessor's threads; leave four multiprocessors free.
    programs = 2 * (multiprocessor_count() - 4)
    out = torch.empty(programs, device="cuda")
    with torch.cuda.stream(stream):
        busy_kernel[(programs,)](out, 3_000_000, num_warps=32)


def layernorm_grads(x, gamma, dy):
    x = x.detach().requires_grad_()
    course_lib.layernorm(x, gamma).backward(dy)
    return x.grad


torch.manual_seed(0)
wide = 200_000  # LayerNorm rows split across programs; coordinate-descent rows too (> 32768)
x = torch.randn(8, wide, device="cuda")
gamma = torch.randn(wide, device="cuda")
dy = torch.randn(8, wide, device="cuda")
scores = torch.randn(4, wide, device="cuda")
x64 = x.double().requires_grad_()
torch.nn.functional.layer_norm(x64, (wide,), gamma.double()).backward(dy.double())
expected_dx = x64.grad
expected_y = references.coor_descent(scores.double(), n_iters=5, k=1000)

main, other, busy = torch.cuda.current_stream(), torch.cuda.Stream(), torch.cuda.Stream()
occupy_most_threads(busy)
dx = layernorm_grads(x, gamma, dy)
y = course_lib.coor_descent(scores, n_iters=5, k=1000)
with torch.cuda.stream(other):  # the same kernels on a second stream, at the same time
    dx_other = layernorm_grads(x, gamma, dy)
    y_other = course_lib.coor_descent(scores, n_iters=5, k=1000)
torch.cuda.synchronize()
for got in (dx, dx_other):
    torch.testing.assert_close(got.double(), expected_dx, rtol=1e-4, atol=1e-4)
for got in (y, y_other):
    torch.testing.assert_close(got.double(), expected_y, rtol=1e-4, atol=1e-4)
print("finished, right values")
"""


@gpu_only
def test_waiting_programs_finish_on_a_shared_gpu(tmp_path):
    script = tmp_path / "shared_gpu.py"  # a file: @triton.jit reads its kernel's source
    script.write_text(SHARED_GPU_SCRIPT)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "finished, right values" in result.stdout, result.stderr[-3000:]
