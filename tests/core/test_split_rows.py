import pytest
import torch

from course_lib.core import runtime  # before triton: it may select the interpreter
from course_lib.core.split_rows import gather, publish, slots_block
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

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
