"""The Triton kernels of coordinate descent: the forward, which takes a row through every
iteration, and the backward's two, with the ``@triton.jit`` helpers they share. The
package's doc derives what they compute."""

import triton
import triton.language as tl

from ...core.runtime import ON_GPU
from ...core.split_rows import gather, publish

LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x * LOG2E)


@triton.constexpr_function
def no_score():
    """The score of masked columns and columns past the row's end: -inf. A function, not
    a global constant: inductor copies a kernel's global constants into its own source
    by their repr, and -inf's repr is not Python."""
    return float("-inf")


CAP_UNREAD_EXPONENTS = tl.constexpr(not ON_GPU)  # see step_probabilities


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
    lse = eps * tl.log(tl.where(nothing, 1.0, total)).to(tl.float64)  # float32 log: the package doc
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
    all of them, or one (see the package doc), reading the row's state, its max and a,
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
