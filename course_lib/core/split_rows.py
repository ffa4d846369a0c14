"""Rows split across programs that run at once: how they exchange their parts of a row's sums.

Chapter 3's wide LayerNorm backward and chapter 4's coordinate descent both cut a row
into tiles, one program a tile, and need sums over the whole row while each program
still holds its tile in registers. Each program ``publish``es its part into the row's
slot for its tile, then ``gather`` waits until every tile's slot holds the part of this
round and combines them. All programs of a row must be resident at once, or the wait
never ends: the launchers check it.

A slot is one 64-bit word: the part's float32 bits in the low half, the round's ``tag``
in the high half, written in one atomic exchange, so a reader sees a part and its tag
together or not at all. Tags start at 1 and slots at 0, so a fresh slot is "nothing
published". A slot may be reused by a later round with a later tag.

Memory order. The word is all a reader needs, so publishing is relaxed; acquire-release
would also make the program wait until its earlier stores (the previous row's output)
had reached memory. Reusing a slot is safe without it: a program publishes round r + 2
only after reading every part of round r + 1, each published only after its program had
read round r, and a value computed from a load cannot be published before that load.
"""

import triton
import triton.language as tl

from .runtime import next_power_of_2


@triton.jit
def publish(slot_ptr, part, tag):
    """Write this tile's float32 ``part`` and the round's ``tag`` into its slot, in one word."""
    bits = part.to(tl.uint32, bitcast=True).to(tl.int64)  # unsigned: zero-extended
    tl.atomic_xchg(slot_ptr, (tl.cast(tag, tl.int64) << 32) | bits, sem="relaxed")


@triton.jit
def _combine(published_a, first_a, second_a, largest_a, published_b, first_b, second_b, largest_b):
    return (tl.minimum(published_a, published_b), first_a + first_b, second_a + second_b,
            tl.maximum(largest_a, largest_b))


@triton.jit
def gather(row_slots_ptr, tag, n_tiles, N_PARTS: tl.constexpr, TILES_BLOCK: tl.constexpr):
    """Spin until every tile has published ``tag`` into the row's N_PARTS (1 or 2) rows of
    ``n_tiles`` slots; return the sum of the first parts, of the second (0 when N_PARTS
    is 1), and the largest first part, each combined in a fixed order: the same totals
    in every program, on every run.

    One reduction both checks that every slot is published and combines the parts. Two,
    one for the check and one for the sums, are not safe: where several threads hold
    copies of a word, loaded at different moments, the check may see one copy and the
    sum add up another, still empty. TILES_BLOCK, from ``slots_block``, keeps copies
    within a warp.
    """
    word = tl.arange(0, 2 * TILES_BLOCK)
    which, tile = word // TILES_BLOCK, word % TILES_BLOCK  # part, tile
    present = (which < N_PARTS) & (tile < n_tiles)
    slot_ptrs = row_slots_ptr + which * n_tiles + tile
    published = tl.full((), 0, tl.int32)
    first = tl.full((), 0.0, tl.float32)
    second = tl.full((), 0.0, tl.float32)
    largest = tl.full((), float("-inf"), tl.float32)
    while published == 0:
        words = tl.load(slot_ptrs, mask=present, other=0, volatile=True)
        parts = words.to(tl.uint32).to(tl.float32, bitcast=True)  # the low 32 bits
        is_first = present & (which == 0)
        published, first, second, largest = tl.reduce(
            ((((words >> 32) == tag) | ~present).to(tl.int32),
             tl.where(is_first, parts, 0.0), tl.where(present & (which == 1), parts, 0.0),
             tl.where(is_first, parts, float("-inf"))),
            0, _combine,
        )
    return first, second, largest


def slots_block(n_tiles, num_warps):
    """TILES_BLOCK for ``gather``: a power of 2 covering n_tiles.

    ``gather`` reads a tile of 2 x TILES_BLOCK words. Where it has fewer words than the
    program has threads, Triton gives several threads a copy of one word, each loaded at
    its own moment, and while the word is being published the copies may disagree. So
    either every word fits in one warp (32 threads), and each warp checks and adds up a
    copy of its own, or the tile is widened until every thread holds words of its own.
    """
    block = next_power_of_2(n_tiles)
    if 2 * block <= 32:
        return block
    return max(block, 32 * num_warps // 2)
