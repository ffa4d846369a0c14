"""Coordinate descent for CoLT5's router: a smoothed top-k over the last dimension.

Chapter 4. A rebuild of CoLT5-attention's ``triton_coor_descent``, with the same
signature and the semantics of its PyTorch ``coor_descent`` (``references.coor_descent``).
Given scores s (..., n) and a budget k, the router iterates, with eps falling from
eps_init to eps by eps_decay (ε-scaling),

    a = eps_t * (log k - logsumexp((s + b) / eps_t)),    b = -relu(s + a),

and returns y = exp((s + a + b) / eps_final): near 1 for about the k largest scores of a
row, near 0 elsewhere, summing to about k.

The reformulation
-----------------
Since b = -relu(s + a), s + b = s - relu(s + a) = min(s, -a). Once a is known, so is
b: the state of a row is one scalar. With a_t the value after iteration t,

    a_1     = eps_0 * (log k - log n_valid)         (b = -s at the start: s + b = 0)
    a_{t+1} = eps_t * log k - eps_t * LSE_j(min(s_j, -a_t) / eps_t)          t >= 1
    y_j     = exp(min(s_j + a_T, 0) / eps_T)

where LSE runs over the unmasked j and n_valid counts them. The seed kept b, a whole
row, per checkpoint; here the forward saves a_1 .. a_T (rows x n_iters scalars) and the
backward replays the recurrence from them.

The backward, by reverse mode through the scalar recurrence (PyTorch's relu'(0) = 0,
so at a tie s_j = -a_t the min counts as taking s_j):

    output:     dw_j = dy_j * y_j / eps_T * [s_j + a_T <= 0];   ds_j = dw_j;   g_T = sum_j dw_j
    step t = T-1 .. 1, with g_{t+1} the gradient reaching a_{t+1}:
                p_j = softmax_j(min(s, -a_t) / eps_t)
                    = exp((min(s_j, -a_t) + a_{t+1}) / eps_t - log k)   (no sum: the
                      saved a_{t+1} already holds the normaliser)
                ds_j  -= g_{t+1} * p_j * [s_j <= -a_t]       (where the min took s_j)
                g_t    = g_{t+1} * sum_j p_j * [s_j > -a_t]  (where it took -a_t)
                dlogk += g_{t+1} * eps_t
    step 0:     dlogk += g_1 * eps_0                         (a_1 does not depend on s)

One pass over the row per iteration, so the backward is linear in n_iters; the seed
replays each segment from its start for every step, quadratic. Masked positions take
no part and get exactly 0 in y and ds. ``checkpoint_segments`` is accepted for
compatibility and has no effect: there is nothing left to checkpoint.

Precision
---------
y divides s + a by eps, so an error in a of one float32 rounding (6e-8 |a|) becomes
6e-8 |a| / eps in y: 4e-6 for |a| = 2, eps = 0.03, as much as PyTorch's own float32
run loses. So a, a scalar per row, is kept in float64, and the elementwise work, all
float32, is done relative to a frame f: min(s, -a) = f + min(s - f, c), with f the
float32 number nearest to -a (or the row max, if lower) and c = -a - f, tiny. Only
small differences get rounded. The row max also keeps the exponentials from
underflowing when a whole row lies far below -a.

The log in a = eps * (log k - log T) - f needs no float64: T, a float32 sum, is already
uncertain in its last bits, and a float32 log adds an error of the same kind, about
|log T| * 6e-8 (log T <= log n). Multiplied by eps in a, it is divided by the same eps
in y and in the backward's p: a relative error of about 1e-6 at worst, whatever eps. A
float64 log, a long chain of float64 operations on every iteration's critical path,
would make the forward markedly slower for nothing.

Filling the GPU
---------------
A row of up to ROW_BLOCK_MAX columns is one program that reads s once, keeps it in
registers through every iteration and writes y once. Longer rows, or few long rows,
are split across programs, one tile each. In the forward each iteration needs a sum
over the whole row: every program publishes its tile's part tagged with the
iteration's number, waits until all tiles of its row have published, and adds them up
in a fixed order (so all tiles get the same a, and runs repeat bit for bit): the
protocol of ``split_rows``, which chapter 3's wide LayerNorm backward uses too.
On a GPU one launch runs every iteration, all programs resident at once: the launch is
cooperative, so CUDA starts it only when every program can be resident, whatever else
shares the GPU, and refuses it otherwise. The interpreter runs programs one after
another, so there each step is a launch of its own, as on a GPU when a row has more
tiles than there are multiprocessors, when CUDA refuses the cooperative launch, and
under torch.compile (whose launches are not cooperative). In the
backward the sums do not depend on the gradient flowing back, so a first kernel
computes every tile's part of the sums of all iterations, and a second writes ds.

Read top to bottom: the Triton kernels, the host launchers that pick tiles and grids,
the ``torch.autograd.Function``, and the public ``coor_descent``.
"""

import functools
import math
import numbers
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from ..core import references
from ..core.operator import kernel_op
from ..core.plans import TunedOn, warps_for
from ..core.runtime import (ON_GPU, cdiv, is_cooperative_refusal, is_traced, launch, multiprocessor_count,
                            next_power_of_2, spin_waits_allowed)
from ..core.split_rows import gather, publish, slots_block
from ..core.validation import (FLOAT_DTYPES, PUBLIC_DTYPES, _names, check_anchor, check_index_range, check_like,
                               check_same_device, check_tensor, on_device_of, runs_reference, by_reference)

LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x * LOG2E)


@triton.constexpr_function
def no_score():
    """The score of masked columns and columns past the row's end: -inf. A function, not
    a global constant: inductor copies a kernel's global constants into its own source
    by their repr, and -inf's repr is not Python."""
    return float("-inf")


CAP_UNREAD_EXPONENTS = tl.constexpr(not ON_GPU)  # see step_probabilities

# ---------------------------------------------------------------------------- kernels


@triton.jit
def load_scores(s_ptr, mask_ptr, row, cols, n_cols, stride_s_row, stride_s_col,
                 stride_mask_row, stride_mask_col, HAS_MASK: tl.constexpr):
    """One tile of a row in float32, -inf where masked or past the end: exp gives 0 there."""
    row64 = tl.cast(row, tl.int64)
    cols64 = cols.to(tl.int64)
    keep = cols < n_cols
    if HAS_MASK:
        mask = tl.load(mask_ptr + row64 * stride_mask_row + cols64 * stride_mask_col, mask=keep, other=0)
        keep = keep & (mask != 0)
    s = tl.load(s_ptr + row64 * stride_s_row + cols64 * stride_s_col, mask=keep, other=no_score())
    return s.to(tl.float32)


@triton.jit
def exponent_frame(row_max, a):
    """(f, c) with min(s, -a) = f + min(s - f, c): f = min(row max, -a) in float32, and
    c = -a - f, tiny when f is -a rounded. Every exponent min(s - f, c) is at most
    about 0, and the row max's is about 0, so a sum of exponentials neither overflows
    nor underflows. (A fully masked row: f = 0.)"""
    f = tl.minimum(row_max, (-a).to(tl.float32))
    f = tl.where(row_max == no_score(), 0.0, f)
    return f, (-a - f).to(tl.float32)


@triton.jit
def _shifted_scores(s, a):
    """s + a for a float64 scalar a, accurate where it is near 0: (s - f) + (a + f)."""
    f = (-a).to(tl.float32)
    return (s - f) + (a + f).to(tl.float32)


@triton.jit
def max_or_nan(s):
    """The largest score of a tile, NaN if the tile holds a NaN. A GPU's max and min skip
    a NaN, so a row with one would come out finite; the reference gives NaN, and so do the
    kernels: a NaN row max makes the whole row NaN at the end."""
    has_nan = tl.max((s != s).to(tl.int32), axis=0) > 0
    return tl.where(has_nan, float("nan"), tl.max(s, axis=0))


@triton.jit
def tile_part(s, row_max, a, eps_ptr, phase):
    """This tile's part of a phase's row reduction. Phase 0: the max. Phase 1
    (iteration 0, where s + b = 0): the count of unmasked columns. Phase t + 1: the sum
    of exp((min(s, -a_t) - f) / eps_t), f from exponent_frame."""
    if phase == 0:
        part = max_or_nan(s)
    elif phase == 1:
        part = tl.sum((s != no_score()).to(tl.float32), axis=0)
    else:
        f, c = exponent_frame(row_max, a)
        scale = (1.0 / tl.load(eps_ptr + phase - 1) * LOG2E).to(tl.float32)
        part = tl.sum(tl.exp2(tl.minimum(s - f, c) * scale), axis=0)
    return part


@triton.jit
def next_a(total, row_max, a, eps, logk, first):
    """a after an iteration, in float64, from the row's total of tile_part."""
    nothing = total == 0.0  # a fully masked row
    lse = eps * tl.log(tl.where(nothing, 1.0, total)).to(tl.float64)  # float32 log: module doc
    if not first:
        f, _ = exponent_frame(row_max, a)
        lse += f
    # Nothing unmasked: a = 0 keeps the row finite; its y is 0 anyway.
    return tl.where(nothing, 0.0, eps * logk - lse)


@triton.jit(do_not_specialize=["n_iters", "first_step", "last_step"])
def coor_descent_forward_kernel(
    s_ptr, mask_ptr, logk_ptr, eps_ptr, a_ptr, row_max_ptr, y_ptr, slots_ptr,
    n_rows, n_cols, n_iters, logk_value, first_step, last_step,
    stride_s_row, stride_s_col, stride_mask_row, stride_mask_col, stride_y_row,
    HAS_MASK: tl.constexpr, LOGK_PER_ROW: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK: tl.constexpr, TILES_BLOCK: tl.constexpr,
):
    """Program (r, c) holds tile c of rows r, r + num_programs(0), ... in registers.

    A row takes n_iters + 2 steps. Step p combines phase p - 1 (p > 0): the row max, or
    iteration p - 2 into a_{p-1}; then computes this tile's part of phase p
    (p <= n_iters); the last step writes y. A launch runs steps [first_step, last_step):
    all of them, or one (see the module doc), reading the row's state, its max and a,
    back from memory when it starts mid-way.

    Split rows (SPLIT) exchange parts through ``slots`` (rows, 2, tiles): phase q's slot
    is reused by phase q + 2, which no tile can publish before every tile has read
    phase q + 1, hence after it has read phase q.
    """
    logk_value = tl.cast(logk_value, tl.float32)  # inductor passes a Python float as float64
    tile = tl.program_id(1)
    n_tiles = tl.num_programs(1)
    cols = tile * BLOCK + tl.arange(0, BLOCK)
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        s = load_scores(s_ptr, mask_ptr, row, cols, n_cols, stride_s_row, stride_s_col,
                         stride_mask_row, stride_mask_col, HAS_MASK)
        if LOGK_PER_ROW:
            logk = tl.load(logk_ptr + row)
        else:
            logk = logk_value
        row64 = tl.cast(row, tl.int64)
        a_row = a_ptr + row64 * n_iters
        row_max = max_or_nan(s)
        a = tl.full((), 0.0, tl.float64)
        if first_step >= 2:
            row_max = tl.load(row_max_ptr + row)
        if first_step >= 3:
            a = tl.load(a_row + first_step - 3)
        part = row_max
        for step in range(first_step, last_step):
            if step > 0:
                phase = step - 1
                if SPLIT:
                    slots = slots_ptr + (row64 * 2 + phase % 2) * n_tiles
                    total, _, largest = gather(slots, phase + 1, n_tiles, 1, TILES_BLOCK)
                    # The row max (NaN when a tile's is: the sum keeps a NaN, the max skips it),
                    # or iteration phase - 2's sum.
                    total = tl.where(phase == 0, tl.where(total != total, total, largest), total)
                else:
                    total = part
                if phase == 0:
                    row_max = total
                    tl.store(row_max_ptr + row, row_max, mask=tile == 0)
                else:
                    a = next_a(total, row_max, a, tl.load(eps_ptr + phase - 1), logk, phase == 1)
                    tl.store(a_row + phase - 1, a, mask=tile == 0)
            if step <= n_iters:
                part = tile_part(s, row_max, a, eps_ptr, step)
                if SPLIT:
                    publish(slots_ptr + (row64 * 2 + step % 2) * n_tiles + tile, part, step + 1)
        if last_step == n_iters + 2:
            scale = (1.0 / tl.load(eps_ptr + n_iters) * LOG2E).to(tl.float32)
            y = tl.exp2(tl.minimum(_shifted_scores(s, a), 0.0) * scale)
            y = tl.where(row_max != row_max, float("nan"), y)  # a row with a NaN score (max_or_nan)
            tl.store(y_ptr + row64 * stride_y_row + cols, y.to(y_ptr.dtype.element_ty), mask=cols < n_cols)


@triton.jit
def output_grad(s, dy, a_last, eps_last):
    """dw = dy * dy/dw for y = exp(min(w, 0) / eps_T), w = s + a_T; 0 where masked."""
    w = _shifted_scores(s, a_last)
    inverse_eps = (1.0 / eps_last).to(tl.float32)
    y = tl.exp2(tl.minimum(w, 0.0) * (inverse_eps * LOG2E))
    return tl.where((w <= 0.0) & (s != no_score()), dy * y * inverse_eps, 0.0)


@triton.jit
def step_probabilities(s, row_max, a_row, exp2_scale_ptr, t, logk):
    """(p, takes_s, p_c) of iteration t, p = softmax(min(s, -a_t) / eps_t) from the saved
    a_{t+1} (a_row[t]; a_row[t - 1] is a_t) instead of a sum: takes_s where the min took
    s_j, p valid only there (masked columns: p = 0), and p_c, the one value every other
    p_j has (where the min took -a_t).
    So the mass sum_j p_j [s_j > -a_t] is p_c times a count, and a kernel that needs
    only the mass computes no exponential a column. And p needs no min: where it is
    used, the min is s_j; one instruction fewer a column and iteration, for the same
    bits. Elsewhere the exponent may overflow to inf,
    which is never read; numpy would warn about it, so under the interpreter it is
    capped at p_c's (CAP_UNREAD_EXPONENTS), which leaves every p that is read as it is.
    exp2_scale_ptr[t] = LOG2E / eps_t, from the schedule: no division on the way."""
    a_t, a_next, exp2_scale = tl.load(a_row + t - 1), tl.load(a_row + t), tl.load(exp2_scale_ptr + t)
    f, c = exponent_frame(row_max, a_t)
    offset = ((f + a_next) * exp2_scale - logk * LOG2E).to(tl.float32)
    scale = exp2_scale.to(tl.float32)
    above_f = s - f
    exponent, exponent_c = above_f * scale + offset, c * scale + offset
    if CAP_UNREAD_EXPONENTS:
        exponent = tl.minimum(exponent, exponent_c)
    return tl.exp2(exponent), above_f <= c, tl.exp2(exponent_c)


@triton.jit
def count_two(takes_t, takes_u):
    """(sum_j [not takes_t], sum_j [not takes_u]), the counts behind two iterations'
    masses, from one reduction: as the 16-bit halves of one int32 (a tile has fewer
    than 2**16 columns, MAX_COUNTED_TILE). A sum across warps waits at a barrier, and
    the backward's iterations are a chain of them: one barrier for two counts."""
    both = tl.sum((~takes_t).to(tl.int32) | ((~takes_u).to(tl.int32) << 16), axis=0)
    return (both & 0xFFFF).to(tl.float32), (both >> 16).to(tl.float32)


@triton.jit
def step_back(ds, grad_a, dlogk, p, takes_s, mass, eps):
    """One step back through iteration t: ds where the min took s, dlogk, and the
    gradient reaching a_t, from grad_a, the gradient reaching a_{t+1}."""
    ds = tl.where(takes_s, ds - grad_a.to(tl.float32) * p, ds)
    return ds, grad_a * mass, dlogk + grad_a * eps


@triton.jit
def backward_tile(s_ptr, mask_ptr, dy_ptr, logk_ptr, a_ptr, row_max_ptr, row, cols, n_cols, n_iters,
                   logk_value, stride_s_row, stride_s_col, stride_mask_row, stride_mask_col, stride_dy_row,
                   stride_dy_col, HAS_MASK: tl.constexpr, LOGK_PER_ROW: tl.constexpr):
    """What both backward kernels start from for the columns ``cols`` of ``row``: s and dy
    (float32), log k, the row max, and a pointer to the row's saved a.

    The caller computes ``cols``: torch.compile decides which arguments a kernel writes by
    following each store's address back, and an address built from a helper's result
    would count every pointer passed to the helper as written."""
    s = load_scores(s_ptr, mask_ptr, row, cols, n_cols, stride_s_row, stride_s_col,
                     stride_mask_row, stride_mask_col, HAS_MASK)
    row64 = tl.cast(row, tl.int64)
    dy = tl.load(dy_ptr + row64 * stride_dy_row + cols.to(tl.int64) * stride_dy_col, mask=cols < n_cols, other=0.0)
    if LOGK_PER_ROW:
        logk = tl.load(logk_ptr + row)
    else:
        logk = logk_value
    row_max = tl.load(row_max_ptr + row)
    return s, dy.to(tl.float32), logk, row_max, a_ptr + row64 * n_iters


@triton.jit(do_not_specialize=["n_iters"])
def coor_descent_backward_partials_kernel(
    s_ptr, mask_ptr, dy_ptr, logk_ptr, eps_ptr, exp2_scale_ptr, a_ptr, row_max_ptr, partials_ptr,
    anchor_ptr,  # never read (see coor_descent_backward)
    n_cols, n_iters, logk_value,
    stride_s_row, stride_s_col, stride_mask_row, stride_mask_col, stride_dy_row, stride_dy_col,
    HAS_MASK: tl.constexpr, LOGK_PER_ROW: tl.constexpr, BLOCK: tl.constexpr,
):
    """For split rows: tile c's parts of the backward's sums, partials[row, t, c]:
    t = 0 holds sum_j dw_j, t >= 1 the mass sum_j p_j [s_j > -a_t] of iteration t.
    None of them depends on the gradient flowing back, so all come from one pass."""
    logk_value = tl.cast(logk_value, tl.float32)  # inductor passes a Python float as float64
    row = tl.program_id(0)
    tile = tl.program_id(1)
    n_tiles = tl.num_programs(1)
    cols = tile * BLOCK + tl.arange(0, BLOCK)
    s, dy, logk, row_max, a_row = backward_tile(
        s_ptr, mask_ptr, dy_ptr, logk_ptr, a_ptr, row_max_ptr, row, cols, n_cols, n_iters, logk_value,
        stride_s_row, stride_s_col, stride_mask_row, stride_mask_col, stride_dy_row, stride_dy_col,
        HAS_MASK, LOGK_PER_ROW,
    )
    row64 = tl.cast(row, tl.int64)
    out = partials_ptr + row64 * n_iters * n_tiles + tile
    dw = output_grad(s, dy, tl.load(a_row + n_iters - 1), tl.load(eps_ptr + n_iters))
    # dy has either sign: the sum cancels, so it is added up in float64.
    tl.store(out, tl.sum(dw.to(tl.float64), axis=0))
    for t in range(1, n_iters, 2):  # iterations in pairs, counted together (count_two)
        u = tl.minimum(t + 1, n_iters - 1)  # u = t when t is the last: its mass is written twice
        _, takes_t, p_c_t = step_probabilities(s, row_max, a_row, exp2_scale_ptr, t, logk)
        _, takes_u, p_c_u = step_probabilities(s, row_max, a_row, exp2_scale_ptr, u, logk)
        count_t, count_u = count_two(takes_t, takes_u)
        tl.store(out + t * n_tiles, p_c_t * count_t)
        tl.store(out + u * n_tiles, p_c_u * count_u)


@triton.jit(do_not_specialize=["n_iters"])
def coor_descent_backward_kernel(
    s_ptr, mask_ptr, dy_ptr, logk_ptr, eps_ptr, exp2_scale_ptr, a_ptr, row_max_ptr, sums_ptr, ds_ptr, dlogk_ptr,
    anchor_ptr,  # never read (see coor_descent_backward)
    n_cols, n_iters, logk_value,
    stride_s_row, stride_s_col, stride_mask_row, stride_mask_col, stride_dy_row, stride_dy_col, stride_ds_row,
    HAS_MASK: tl.constexpr, LOGK_PER_ROW: tl.constexpr, SPLIT: tl.constexpr, BLOCK: tl.constexpr,
):
    """Program (r, c) writes ds for tile c of row r, walking the iterations backwards.

    A whole row in one tile computes its sums itself; a split row reads them from
    ``sums`` (rows, n_iters), the partials added up over tiles. Tile 0 writes dlogk.
    """
    logk_value = tl.cast(logk_value, tl.float32)  # inductor passes a Python float as float64
    row = tl.program_id(0)
    tile = tl.program_id(1)
    cols = tile * BLOCK + tl.arange(0, BLOCK)
    s, dy, logk, row_max, a_row = backward_tile(
        s_ptr, mask_ptr, dy_ptr, logk_ptr, a_ptr, row_max_ptr, row, cols, n_cols, n_iters, logk_value,
        stride_s_row, stride_s_col, stride_mask_row, stride_mask_col, stride_dy_row, stride_dy_col,
        HAS_MASK, LOGK_PER_ROW,
    )
    row64 = tl.cast(row, tl.int64)

    ds = output_grad(s, dy, tl.load(a_row + n_iters - 1), tl.load(eps_ptr + n_iters))
    if SPLIT:
        grad_a = tl.load(sums_ptr + row64 * n_iters)
    else:
        grad_a = tl.sum(ds.to(tl.float64), axis=0)  # float64: see the partials kernel
    dlogk = tl.full((), 0.0, tl.float64)
    for i in range(1, n_iters, 2):
        # Iterations t and u = t - 1 together, so that one reduction counts both. At
        # t = 1 there is no u: its half is computed and dropped.
        t = n_iters - i
        u = tl.maximum(t - 1, 1)
        p_t, takes_t, p_c_t = step_probabilities(s, row_max, a_row, exp2_scale_ptr, t, logk)
        p_u, takes_u, p_c_u = step_probabilities(s, row_max, a_row, exp2_scale_ptr, u, logk)
        if SPLIT:  # this tile's masses are parts of the row's
            mass_t = tl.load(sums_ptr + row64 * n_iters + t)
            mass_u = tl.load(sums_ptr + row64 * n_iters + u)
        else:
            count_t, count_u = count_two(takes_t, takes_u)
            mass_t, mass_u = p_c_t * count_t, p_c_u * count_u
        ds, grad_a, dlogk = step_back(ds, grad_a, dlogk, p_t, takes_t, mass_t, tl.load(eps_ptr + t))
        if t > 1:
            ds, grad_a, dlogk = step_back(ds, grad_a, dlogk, p_u, takes_u, mass_u, tl.load(eps_ptr + u))
    dlogk += grad_a * tl.load(eps_ptr)
    # A row with a NaN score has a NaN output (the forward's max_or_nan), and so a NaN
    # gradient, as autograd through the reference gives; a GPU's max and min would skip it.
    row_is_nan = row_max != row_max
    ds = tl.where(row_is_nan, float("nan"), ds)
    dlogk = tl.where(row_is_nan, float("nan"), dlogk)
    ds = tl.where(s != no_score(), ds, 0.0)  # exactly 0 where masked, whatever dy holds
    tl.store(ds_ptr + row64 * stride_ds_row + cols, ds.to(ds_ptr.dtype.element_ty), mask=cols < n_cols)
    tl.store(dlogk_ptr + row, dlogk.to(tl.float32), mask=tile == 0)


# -------------------------------------------------------------------------- launchers

# The plans below were chosen by this sweep:
TUNED_ON = TunedOn("NVIDIA H200", "3.6.0", "benchmarks/tune_coor_descent.py")
# Rows up to this many columns are one program each, held in registers (128 float32
# values a thread at 8 warps); longer rows are split into tiles, which must exchange
# every iteration's sums through memory.
ROW_BLOCK_MAX = 32768
# When few rows leave multiprocessors idle, split rows down to tiles of this many
# columns so that every multiprocessor gets one.
SPLIT_TILE_MIN = 4096
# The backward holds s and ds: whole rows up to this many columns, longer ones in
# tiles of BACKWARD_SPLIT_TILE.
BACKWARD_ROW_BLOCK_MAX = 16384
BACKWARD_SPLIT_TILE = 4096
MAX_COUNTED_TILE = 2**16 - 1  # count_two's 16-bit counts: the widest backward tile
# Columns a warp (the best of benchmarks/tune_coor_descent.py's sweep). A row's
# twenty iterations are a chain of reductions, each waiting on the last: the fewer
# warps a reduction crosses, the shorter the chain. Whole rows all run at once at these
# sizes, so fewer warps cost no parallelism. A split tile is one of few programs and
# needs more warps; so does the backward.
ROW_COLUMNS_PER_WARP = 4096
TILE_COLUMNS_PER_WARP = 1024
MIN_TILE_WARPS = 4
# The backward holds s, dy and ds: 32 values of each a thread at these warps. Left to
# itself the compiler takes 161 registers a thread for rows of 4096 (3 programs of 4
# warps a multiprocessor); capped at 128 it spills nothing and fits 4.
BACKWARD_MAX_REGISTERS = 128


class ForwardPlan(NamedTuple):
    block: int  # columns a program holds: the whole row, or one tile of it
    tiles: int  # programs a row is split across
    row_programs: int  # programs along the rows; each takes rows in turn
    num_warps: int
    single_launch: bool  # all steps in one launch (split rows then wait on each other)


class BackwardPlan(NamedTuple):
    block: int
    tiles: int
    num_warps: int


def _warps(block, columns_per_warp, min_warps=1):
    """One warp for every ``columns_per_warp`` columns of the block, from ``min_warps`` to
    16, and never more than the block fills (32 columns a warp)."""
    return warps_for(block, columns_per_warp, min_warps=min_warps, fill=32)


def forward_plan(n_rows, n_cols):
    """Whole rows in registers when they fit; otherwise tiles, more of them when there
    are too few rows to give each multiprocessor a program.

    Split rows wait on each other, so a single launch needs every program resident at
    once: at most one a multiprocessor. More tiles than that, or the interpreter (which
    runs programs one after another), take one launch a step.
    """
    if n_cols <= ROW_BLOCK_MAX:
        block = next_power_of_2(n_cols)
        return ForwardPlan(block, 1, n_rows, _warps(block, ROW_COLUMNS_PER_WARP), True)
    sms = multiprocessor_count()
    tiles = max(cdiv(n_cols, ROW_BLOCK_MAX), min(sms // n_rows, cdiv(n_cols, SPLIT_TILE_MIN)))
    block = next_power_of_2(cdiv(n_cols, tiles))
    tiles = cdiv(n_cols, block)
    single_launch = ON_GPU and tiles <= sms
    row_programs = min(n_rows, max(1, sms // tiles)) if single_launch else n_rows
    return ForwardPlan(block, tiles, row_programs, _warps(block, TILE_COLUMNS_PER_WARP, MIN_TILE_WARPS), single_launch)


def backward_plan(n_rows, n_cols):
    """Whole rows when they fit in registers, else tiles of BACKWARD_SPLIT_TILE."""
    block = next_power_of_2(n_cols) if n_cols <= BACKWARD_ROW_BLOCK_MAX else BACKWARD_SPLIT_TILE
    return BackwardPlan(block, cdiv(n_cols, block), _warps(block, TILE_COLUMNS_PER_WARP))


class Schedule(NamedTuple):
    """The ε of every iteration, as the kernels read it (eps_schedule)."""

    n_iters: int
    eps: torch.Tensor  # (n_iters + 1,) float64: iterations 0 .. n_iters-1, then the final one y divides by
    exp2_scale: torch.Tensor  # (n_iters + 1,) float64: LOG2E / eps, what the backward multiplies by


def make_eps_schedule(n_iters, eps, eps_init, eps_decay, device):
    """The Schedule on the device (eps_schedule keeps one for each setting). The backward multiplies
    by LOG2E / eps instead of dividing: float64 divisions are slow, and it would do two an
    iteration. In the forward the division overlaps the row's sum, and reading a second
    table measured slower, so it divides."""
    current = max(eps if eps_init is None else eps_init, eps)
    values = []
    for _ in range(n_iters + 1):
        values.append(current)
        current = max(current * eps_decay, eps)
    table = torch.tensor([values, [LOG2E.value / v for v in values]], dtype=torch.float64, device=device)
    return Schedule(n_iters, table[0], table[1])


eps_schedule = functools.lru_cache(maxsize=64)(make_eps_schedule)


def _logk_args(logk):
    """(tensor or None, scalar, per row?) for the kernels' logk arguments."""
    if isinstance(logk, torch.Tensor):
        return logk, 0.0, True
    return None, float(logk), False


def coor_descent_forward(s2d, mask2d, logk, schedule, plan=None, shape=None):
    """Launch the forward; return y in s's dtype, a (rows, n_iters) float64 with
    a[:, t] = a_{t+1}, and the row maxima (rows,) float32.

    ``logk`` is a float or a float32 tensor (rows,); ``mask2d`` a uint8 view or None.
    y has ``shape`` (s's, of which s2d is the rows), by default (rows, n): allocated so,
    not a view of its rows, so that a caller may change it in place.
    """
    n_rows, n_cols = s2d.shape
    n_iters = schedule.n_iters
    # The kernel gets y itself (row-major: row r at r * n_cols), not a view of its rows:
    # traced by torch.compile, a view written by a kernel would make the output a view.
    y = torch.empty(shape or (n_rows, n_cols), device=s2d.device, dtype=s2d.dtype)
    a = torch.empty((n_rows, n_iters), device=s2d.device, dtype=torch.float64)
    row_max = torch.empty(n_rows, device=s2d.device, dtype=torch.float32)
    if n_rows == 0:
        return y, a, row_max
    plan = plan or forward_plan(n_rows, n_cols)
    split = plan.tiles > 1
    if split and plan.single_launch and ON_GPU and not spin_waits_allowed(s2d):
        # torch.compile's launches (or a Triton without them) are not cooperative: one launch a step.
        plan = plan._replace(single_launch=False, row_programs=n_rows)
    if split and plan.single_launch and not (ON_GPU and plan.tiles * plan.row_programs <= multiprocessor_count()):
        raise ValueError(
            f"coor_descent: {plan} would hang: split rows in one launch wait on each other, so all "
            f"{plan.tiles * plan.row_programs} programs must run at once, at most one a multiprocessor "
            f"({multiprocessor_count()}), and not in the interpreter, which runs them one after another"
        )
    # Tags start at 1, so zeros mean "nothing published yet". Whole rows need no slots.
    slots = torch.zeros((n_rows, 2, plan.tiles), device=s2d.device, dtype=torch.int64) if split else None
    logk_tensor, logk_value, per_row = _logk_args(logk)
    mask_strides = mask2d.stride() if mask2d is not None else (0, 0)

    def launch_steps(row_programs, first_step, last_step, cooperative=False):
        launch(coor_descent_forward_kernel, (row_programs, plan.tiles),
            s2d, mask2d, logk_tensor, schedule.eps, a, row_max, y, slots,
            n_rows, n_cols, n_iters, logk_value, first_step, last_step,
            *s2d.stride(), *mask_strides, n_cols,
            HAS_MASK=mask2d is not None, LOGK_PER_ROW=per_row, SPLIT=split,
            BLOCK=plan.block, TILES_BLOCK=slots_block(plan.tiles, plan.num_warps), num_warps=plan.num_warps,
            cooperative=cooperative,
        )

    n_steps = n_iters + 2
    with on_device_of(s2d):
        if not split:
            launch_steps(plan.row_programs, 0, n_steps)
            return y, a, row_max
        if plan.single_launch:
            try:  # cooperative: CUDA starts it only with every program resident, as the waits need
                launch_steps(plan.row_programs, 0, n_steps, cooperative=True)
                return y, a, row_max
            except RuntimeError as error:
                if not is_cooperative_refusal(error):
                    raise
                slots.zero_()  # refused before any program ran; cleared all the same
        for step in range(n_steps):  # one launch a step: no program waits on another
            launch_steps(n_rows, step, step + 1)
    return y, a, row_max


def coor_descent_backward(s2d, mask2d, logk, schedule, a, row_max, dy2d, plan=None, anchor=None):
    """Launch the backward; return ds (rows, n) in s's dtype and dlogk (rows,) float32.
    ``anchor``, a tensor the kernels take and never read, is for torch.compile
    (core.operator's ``anchored``): s itself, where the kernels' s2d is a view of it."""
    n_rows, n_cols = s2d.shape
    n_iters = schedule.n_iters
    ds = torch.empty((n_rows, n_cols), device=s2d.device, dtype=s2d.dtype)
    dlogk = torch.empty(n_rows, device=s2d.device, dtype=torch.float32)
    if n_rows == 0:
        return ds, dlogk
    plan = plan or backward_plan(n_rows, n_cols)
    if plan.block > MAX_COUNTED_TILE:
        raise ValueError(f"coor_descent: {plan} has tiles of more than {MAX_COUNTED_TILE} columns, "
                         f"which the backward's 16-bit counts (count_two) cannot hold")
    split = plan.tiles > 1
    logk_tensor, logk_value, per_row = _logk_args(logk)
    mask_strides = mask2d.stride() if mask2d is not None else (0, 0)
    common = dict(HAS_MASK=mask2d is not None, LOGK_PER_ROW=per_row, BLOCK=plan.block, num_warps=plan.num_warps,
                  maxnreg=BACKWARD_MAX_REGISTERS)
    grid = (n_rows, plan.tiles)
    anchor = s2d if anchor is None else anchor
    with on_device_of(s2d):
        if split:
            partials = torch.empty((n_rows, n_iters, plan.tiles), device=s2d.device, dtype=torch.float64)
            launch(coor_descent_backward_partials_kernel, grid,
                s2d, mask2d, dy2d, logk_tensor, schedule.eps, schedule.exp2_scale, a, row_max, partials, anchor,
                n_cols, n_iters, logk_value, *s2d.stride(), *mask_strides, *dy2d.stride(), **common,
            )
            sums = partials.sum(dim=-1)  # in a fixed order: the same sums on every run
        else:
            sums = None  # whole rows compute their own sums
        launch(coor_descent_backward_kernel, grid,
            s2d, mask2d, dy2d, logk_tensor, schedule.eps, schedule.exp2_scale, a, row_max, sums, ds, dlogk, anchor,
            n_cols, n_iters, logk_value, *s2d.stride(), *mask_strides, *dy2d.stride(), ds.stride(0),
            SPLIT=split, **common,
        )
    return ds, dlogk


# --------------------------------------------------------------------------- autograd


def _as_rows(s, mask):
    """(s, mask) viewed as (rows, n), copying only when the strides do not allow a view;
    the mask as uint8, which the kernels load as bytes."""
    s2d = s.reshape(-1, s.shape[-1])
    if mask is None:
        return s2d, None
    mask2d = mask.reshape(s2d.shape)
    # Traced, a copy: inductor cannot lower a view of bool as uint8.
    return s2d, mask2d.to(torch.uint8) if is_traced(mask2d) else mask2d.view(torch.uint8)


def _forward(s, logk, mask, schedule):
    """(y of s's shape, a, row max): the forward for any leading dimensions.
    ``logk``: a float, or a float32 tensor (rows,) when k is per row."""
    s2d, mask2d = _as_rows(s, mask)
    return coor_descent_forward(s2d, mask2d, logk, schedule, shape=s.shape)


# -------------------------------------------------------------------- custom operator
# One unit for torch.compile and for eager autograd (core.operator; weighted_sum_op.py
# says how the paths differ). The operators take the eps settings rather than the
# Schedule, and a per-row logk as a tensor or, when k is one number, as logk_value.
# Traced by torch.compile, the body runs on fake tensors, so it builds its Schedule there
# (a constant of the graph) rather than from eps_schedule's cache, which must only ever
# hold real tensors; eager calls take the cached one.
#
# A tensor k is checked by an operator of its own, opaque to torch.compile, which
# reads k's values at run time, except while a CUDA graph is being captured (no reads
# back then): the one check a traced body cannot make.


def _schedule_for(s, n_iters, eps, eps_init, eps_decay):
    build = make_eps_schedule if is_traced(s) else eps_schedule
    return build(n_iters, eps, eps_init, eps_decay, s.device)


def _forward_op(
    s: torch.Tensor, mask: Optional[torch.Tensor], logk: Optional[torch.Tensor], logk_value: float,
    n_iters: int, eps: float, eps_init: Optional[float], eps_decay: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    schedule = _schedule_for(s, n_iters, eps, eps_init, eps_decay)
    return _forward(s, logk_value if logk is None else logk, mask, schedule)


def _backward_op(
    s: torch.Tensor, mask: Optional[torch.Tensor], logk: Optional[torch.Tensor], logk_value: float, n_iters: int,
    eps: float, eps_init: Optional[float], eps_decay: float, a: torch.Tensor, row_max: torch.Tensor, dy: torch.Tensor,
    anchor: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    s2d, mask2d = _as_rows(s, mask)
    schedule = _schedule_for(s, n_iters, eps, eps_init, eps_decay)
    ds, dlogk = coor_descent_backward(s2d, mask2d, logk_value if logk is None else logk, schedule, a, row_max,
                                      dy.reshape(s2d.shape), anchor=anchor)
    return ds.reshape(s.shape), dlogk


def _values_readable(tensor):
    """Whether a check may read ``tensor``'s values back: it has values (not traced) and no
    CUDA graph is being captured (no reads back then)."""
    return not is_traced(tensor) and not (ON_GPU and torch.cuda.is_current_stream_capturing())


@torch.library.custom_op("course_lib::coor_descent_check_k", mutates_args=())
def check_k_op(k: torch.Tensor, n_cols: int) -> torch.Tensor:
    op = "coor_descent_check_k"
    if k.dtype not in K_DTYPES:
        raise TypeError(f"{op}: k has dtype {k.dtype}; accepted: {_names(K_DTYPES)}")
    if n_cols < 1:
        raise ValueError(f"{op}: n_cols, the row length, must be at least 1, got {n_cols}")
    if _values_readable(k):
        _check_k_values("coor_descent", k, n_cols)
    return k.clone()  # an operator's output may not alias its input


@check_k_op.register_fake
def _(k, n_cols):
    return torch.empty_like(k)


check_k_op.register_autograd(lambda ctx, grad: (grad, None))


def _save_for_backward(ctx, inputs, output):
    s, mask, logk, logk_value, *ctx.settings = inputs
    _, a, row_max = output
    ctx.save_for_backward(s, mask, logk, a, row_max)
    ctx.logk_value = logk_value


def _gradients(ctx, backward, dy):
    s, mask, logk, a, row_max = ctx.saved_tensors
    ds, dlogk = backward(s, mask, logk, ctx.logk_value, *ctx.settings, a, row_max, dy)
    return ds, None, (dlogk if logk is not None else None), None, None, None, None, None


def _check_operator_inputs(s, mask, logk, logk_value, n_iters, eps, eps_init, eps_decay, op="coor_descent"):
    """The operator's inputs, checked as coor_descent checks its own: k as log k, a float32
    tensor of one value a row or one number. A tensor's values are read back (a sync)
    where they can be: called directly, not traced (compiled, check_k_op reads k's)."""
    _check_inputs(op, s, n_iters, 1, eps, eps_init, eps_decay, mask, 1)
    rows = s.numel() // s.shape[-1]
    if logk is not None:  # log k of each row of s
        check_like(op, "logk", logk, (rows,), s, dtype=torch.float32, contiguous=True)
        if _values_readable(logk) and not bool(((logk > -math.inf) & (logk <= math.log(s.shape[-1]))).all()):
            raise ValueError(f"{op}: every logk must be log k with {_k_range(s.shape[-1])}; logk holds values outside it")
    elif not (isinstance(logk_value, numbers.Real) and -math.inf < logk_value <= math.log(s.shape[-1])):
        raise ValueError(f"{op}: logk_value must be log k with {_k_range(s.shape[-1])}, got {logk_value!r}")


def _check_backward(s, mask, logk, logk_value, n_iters, eps, eps_init, eps_decay, a, row_max, dy, anchor=None):
    op = "coor_descent_backward"
    if anchor is not None:
        check_anchor(op, anchor, s)
    _check_operator_inputs(s, mask, logk, logk_value, n_iters, eps, eps_init, eps_decay, op=op)
    rows = s.numel() // s.shape[-1]
    check_like(op, "a", a, (rows, n_iters), s, dtype=torch.float64, contiguous=True)
    check_like(op, "row_max", row_max, (rows,), s, dtype=torch.float32, contiguous=True)
    check_like(op, "dy", dy, s.shape, s)


COOR_DESCENT = kernel_op(
    "coor_descent", forward=_forward_op, backward=_backward_op, save=_save_for_backward, gradients=_gradients,
    check=_check_operator_inputs, check_backward=_check_backward, differentiable={"s": 0, "k": 2}, anchored=True,
)


# ------------------------------------------------------------------------------ public

K_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16,
            torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


# type() in (...) first: isinstance against the numbers ABCs costs a microsecond a call.
def _check_count(op, name, value):
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
        raise TypeError(f"{op}: {name} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{op}: {name} must be at least 1, got {value}")


def _check_positive(op, name, value):
    if type(value) not in (float, int) and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
        raise TypeError(f"{op}: {name} must be a number, got {type(value).__name__} {value!r}")
    if not (0 < value < math.inf):
        raise ValueError(f"{op}: {name} must be positive and finite, got {value}")


FLOAT32 = torch.finfo(torch.float32)
MAX_N_ITERS = 10_000  # a (rows, n_iters) float64 table is saved; colt5 uses tens


def check_eps_schedule(op, eps, eps_init, eps_decay):
    """eps, eps_init (None: eps) and eps_decay as coor_descent takes them; ``op`` names the
    caller in errors (the router checks its own when built)."""
    _check_smoothing(op, "eps", eps)
    if eps_init is not None:
        _check_smoothing(op, "eps_init", eps_init)
    _check_positive(op, "eps_decay", eps_decay)


def _check_smoothing(op, name, value):
    """eps and eps_init: divisors of float32 sums, so normal float32 numbers."""
    _check_positive(op, name, value)
    if not FLOAT32.tiny <= value <= FLOAT32.max:
        raise ValueError(f"{op}: {name} must be between {FLOAT32.tiny:.3g} and {FLOAT32.max:.3g} (the kernels "
                         f"divide float32 scores by it), got {value}")


def _k_range(n_cols):
    return f"0 < k <= n, the row length ({n_cols})"


def _check_k_values(op, k, n_cols):
    """One read of k back to the host: a per-row k is checked at the cost of a sync."""
    if k.numel() and not bool(((k > 0) & (k <= n_cols)).all()):
        raise ValueError(f"{op}: every k must satisfy {_k_range(n_cols)}; k holds values outside it")


def _check_k(op, k, s):
    n_cols, leading = s.shape[-1], s.shape[:-1]
    if isinstance(k, torch.Tensor):
        check_tensor(op, "k", k, dtypes=K_DTYPES, min_ndim=0)
        check_same_device(op, s=s, k=k)
        try:
            fits = torch.broadcast_shapes(k.shape, leading) == leading
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(
                f"{op}: k must be a number or a tensor of shape s.shape[:-1] = {tuple(leading)} "
                f"(or one that broadcasts to it); got k of shape {tuple(k.shape)}"
            )
        if not torch.compiler.is_compiling():  # compiled, the operator checks the values it is given
            _check_k_values(op, k, n_cols)
    elif type(k) in (float, int) or (isinstance(k, numbers.Real) and not isinstance(k, bool)):
        if not (0 < k <= n_cols):
            raise ValueError(f"{op}: k must satisfy {_k_range(n_cols)}; got k = {k}")
    else:
        raise TypeError(f"{op}: k must be a number or a torch.Tensor, got {type(k).__name__}")


def _check_inputs(op, s, n_iters, k, eps, eps_init, eps_decay, mask, checkpoint_segments, dtypes=FLOAT_DTYPES):
    """``dtypes``: the kernels' (the operator's check), or the public function's, float64 too."""
    check_tensor(op, "s", s, dtypes=dtypes)
    if s.shape[-1] == 0:
        raise ValueError(f"{op}: the last dimension of s must be at least 1, got s of shape {tuple(s.shape)}")
    check_index_range(op, columns=s.shape[-1], rows=s.numel() // s.shape[-1])
    _check_count(op, "n_iters", n_iters)
    if n_iters > MAX_N_ITERS:
        raise ValueError(f"{op}: n_iters must be at most {MAX_N_ITERS}, got {n_iters}")
    _check_count(op, "checkpoint_segments", checkpoint_segments)
    check_eps_schedule(op, eps, eps_init, eps_decay)
    if mask is not None:
        check_tensor(op, "mask", mask, dtypes=(torch.bool,))
        check_same_device(op, s=s, mask=mask)
        if mask.shape != s.shape:
            raise ValueError(
                f"{op}: mask must have the shape of s, {tuple(s.shape)}; got {tuple(mask.shape)}"
            )
    _check_k(op, k, s)


def coor_descent(s, *, n_iters, k, eps=0.1, eps_init=None, eps_decay=1.0, mask=None, checkpoint_segments=1):
    """CoLT5's coordinate descent with Triton kernels: a drop-in for ``triton_coor_descent``,
    a smoothed top-k of each row.

    Computes in float32, differentiable in s and in k; float64 scores (on any device) are
    computed by the PyTorch reference instead, differentiable to any order. A row with
    fewer than k unmasked scores has no y summing to k: its y rises towards 1 on every
    unmasked position, and a fully masked row gives zeros.

    Args:
        s (Tensor): the scores, float32, float16, bfloat16 or float64, any strides.
        n_iters (int): 1 to MAX_N_ITERS (10000) iterations; keyword only, as all below.
        k (float or Tensor): the budget, 0 < k <= n: a number, or a tensor broadcasting to
            s.shape[:-1] (one per row; any real dtype, differentiable when it requires
            grad). Checking tensor k reads it back to the host once.
        eps, eps_init, eps_decay (float): ε-scaling, eps falling from max(eps_init, eps)
            by eps_decay each iteration, never below eps; eps and eps_init are normal
            float32 numbers (from about 1.2e-38 to 3.4e38: the kernels divide by them).
        mask (Tensor, optional): bool, True where a score counts; y and the gradient are
            exactly 0 elsewhere.
        checkpoint_segments (int): accepted for compatibility, no effect: the forward
            saves one scalar per row per iteration and the backward needs nothing more.

    Shape:
        - s: (..., n)
        - k: a number, or broadcasting to (...)
        - mask: (..., n)
        - Output: (..., n)

    Returns:
        Tensor: y, near 1 for about the k largest scores of each row and summing to
        about k, of s's shape and dtype.

    Example::

        >>> s = torch.randn(2, 16)
        >>> y = coor_descent(s, n_iters=50, k=4, eps=0.05)
        >>> y.sum(-1)  # about 4 a row
    """
    op = "coor_descent"
    _check_inputs(op, s, n_iters, k, eps, eps_init, eps_decay, mask, checkpoint_segments, PUBLIC_DTYPES)
    if runs_reference(s, k, mask):
        return by_reference(references.coor_descent, s, n_iters=n_iters, k=k, eps=eps, eps_init=eps_init,
                            eps_decay=eps_decay, mask=mask)
    settings = (int(n_iters), float(eps), None if eps_init is None else float(eps_init), float(eps_decay))
    compiling = torch.compiler.is_compiling()
    if isinstance(k, torch.Tensor):
        if compiling:
            k = check_k_op(k, s.shape[-1])
        rows = s.numel() // s.shape[-1]
        logk = torch.log(k.float().clamp(min=1e-20)).expand(s.shape[:-1]).reshape(rows).contiguous()
    else:
        logk = math.log(max(float(k), 1e-20))
    if isinstance(logk, torch.Tensor):
        return COOR_DESCENT(s, mask, logk, 0.0, *settings)
    return COOR_DESCENT(s, mask, None, logk, *settings)
