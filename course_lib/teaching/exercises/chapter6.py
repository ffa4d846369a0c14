"""Checkers of chapter 6, tiles for tensor cores: one function an exercise.

Every exercise multiplies bfloat16 matrices on the tensor cores (``tl.dot``), accumulating
in float32. The references are the float64 products of the same bfloat16 inputs, so the
only differences a right answer shows are float32's rounding of the sums and, where the
output is bfloat16, the rounding of the result: the tolerances allow those and no more.
"""

import warnings

import torch
import torch.nn.functional as F
import triton

from ...core.runtime import DEVICE, ON_GPU
from ..checking import ExerciseError, compare
from ..student_kernels import kernel_runs, recorded_run, report_throughput, require_kernel
from .common import KEPT_FILL_HINT, Exercise, Prefilled, hidden_case, matches, random_fill, random_size, say

__all__ = ["launch_tile_matmul", "check_tile_matmul", "launch_matmul", "check_matmul", "launch_grouped_matmul",
           "check_grouped_matmul", "launch_matmul_bias_gelu", "check_matmul_bias_gelu", "launch_batched_matmul",
           "check_batched_matmul"]
# The chapter's exercises, in order, for the instructors' notes.
EXERCISES = (
    Exercise('6.1', 'one tile of C', 'check_tile_matmul', kernel=True, skills='tl.dot of two 2-D tiles, masks on three axes with other=0, strides', difficulty=2, minutes=25),
    Exercise('6.2', 'the K loop', 'check_matmul', kernel=True, skills='a loop over K tiles carrying a float32 accumulator, the last partial tile, a bfloat16 result', difficulty=3, minutes=30),
    Exercise('6.3', 'grouped program order', 'check_grouped_matmul', kernel=True, skills='a 1-D grid mapped to tiles in groups of rows for L2 reuse, the last group smaller', difficulty=3, minutes=30),
    Exercise('6.4', 'a fused epilogue', 'check_matmul_bias_gelu', kernel=True, skills='bias and GELU applied to the float32 accumulator before the one store', difficulty=3, minutes=25),
    Exercise('6.5', 'a batch of products', 'check_batched_matmul', kernel=True, skills='a third grid axis, batch strides, an operand broadcast with stride 0', difficulty=2, minutes=20),
)

# float32 sums of exact bfloat16 products (6.1's float32 output), and a bfloat16 result
# (half a unit in its last place is 2^-9 of it; the sums' rounding adds a little).
FLOAT32_OUT = dict(rtol=1e-4, atol=1e-4)
BFLOAT16_OUT = dict(rtol=8e-3, atol=8e-3)
GELU_TANH = "gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))"


def _with_hint(error, hint):
    return ExerciseError(f"{error}\n  hint: {hint}") if hint else error


def _bf16(*shape, scale=1.0):
    return (torch.randn(*shape, device=DEVICE) * scale).to(torch.bfloat16)


def _product(a, b):
    return a.detach().to("cpu", torch.float64) @ b.detach().to("cpu", torch.float64)


def _nan_like(shape, device, dtype):
    return torch.full(shape, float("nan"), device=device, dtype=dtype)


def _launch_2d(kernel, a, b, out, block_m, block_n, block_k, *extra, grid=None, num_warps=4, num_stages=2,
               **constexprs):
    """kernel[grid](a, b, *extra, out, M, N, K, the six strides, BLOCK_M, BLOCK_N, BLOCK_K, ...)."""
    (m, k), n = a.shape, b.shape[1]
    grid = grid or (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    kernel[grid](a, b, *extra, out, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
                 out.stride(1), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps,
                 num_stages=num_stages, **constexprs)
    return out


def _a_wrong_layout_hint(got, a, b, expected):
    """Which operand was read with the other's layout (a transposed one read as row-major)."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return None
    got64 = got.detach().to("cpu", torch.float64)
    for operand, tensor, strides in (("a", a, "stride_am and stride_ak"), ("b", b, "stride_bk and stride_bn")):
        if tensor.is_contiguous():
            continue
        raw = torch.as_strided(tensor, tensor.shape, (tensor.shape[1], 1))  # its memory read as row-major
        swapped = _product(raw, b) if operand == "a" else _product(a, raw)
        if torch.allclose(got64, swapped, rtol=1e-2, atol=1e-2):
            return (f"{operand} here is a transposed view (strides {tuple(tensor.stride())}) and was read as if "
                    f"row-major: address its elements with {strides}, never with a size")
    return None


def _missing_other_hint(name, launch, kernel, args, expected, tolerance):
    """NaN in the result, and the same launch right when masked lanes read 0: a load without
    other=0, whose lanes past K tl.dot sums (NaN under the checker's interpreter)."""
    from ..student_kernels import run_interpreted

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            zeros = run_interpreted(name, launch, kernel, *args, undefined_as_nan=False)
    except ExerciseError:
        return None
    if matches(zeros, expected, **tolerance):
        return ("the lanes of the last K tile past K were loaded without a value (the mask alone leaves them "
                "undefined: NaN under the checker's interpreter, garbage on a GPU), and tl.dot sums over all "
                "BLOCK_K of them: give both loads other=0.0, so the lanes past K add nothing")
    return None


# --------------------------------------------------------------------- 6.1: one tile of C


def launch_tile_matmul(tile_matmul_kernel, a, b, out=None, block_m=16, block_n=16):
    """How exercise 6.1's checker launches the kernel: a (M, K) and b (K, N) bfloat16, K at most
    64, so one tile spans it (BLOCK_K the next power of two, at least 16, as tl.dot needs);
    program (i, j) writes tile (i, j) of out, float32, filled with NaN when not given."""
    if out is None:
        out = _nan_like((a.shape[0], b.shape[1]), a.device, torch.float32)
    block_k = max(16, triton.next_power_of_2(a.shape[1]))
    return _launch_2d(tile_matmul_kernel, a, b, out, block_m, block_n, block_k)


def _operand_cases(max_k, visible):
    """(what, a, b): shapes past every tile's multiple, and transposed views of a and of b."""
    shapes = [(1, 1, 1), (16, 16, 16), (37, 21, 13), (20, 45, max_k)] + visible
    cases = [(f"a {m}×{k} times b {k}×{n}", _bf16(m, k), _bf16(k, n)) for m, n, k in shapes]
    a_t = _bf16(27, 33).t()
    cases.append((f"a a transposed view {tuple(a_t.shape)} (strides {a_t.stride()})", a_t, _bf16(27, 19)))
    b_t = _bf16(29, 23).t()
    cases.append((f"b a transposed view {tuple(b_t.shape)} (strides {b_t.stride()})", _bf16(18, 23), b_t))
    return cases


def _check_product(name, launch, kernel, what, a, b, expected, tolerance, extra_hint=None, extra=()):
    """One case: every run (interpreted, then compiled on a GPU) compared with expected."""
    for how, got in kernel_runs(name, launch, kernel, a, b, *extra):
        try:
            compare(f"{name}, {what}" + (f", {how}" if how else ""), got, expected, **tolerance,
                    strides=("stride_am", "stride_ak"))
        except ExerciseError as error:
            hint = (_a_wrong_layout_hint(got, a, b, _product(a, b)) or (extra_hint(got) if extra_hint else None)
                    or _missing_other_hint(name, launch, kernel, (a, b, *extra), expected, tolerance))
            raise _with_hint(error, hint) from None


def _prefilled_product(name, launch, kernel, what, a, b, expected, tolerance, dtype, extra=()):
    """A case run into an output filled with random values beforehand, a new fill each run."""
    prefilled = Prefilled(launch, lambda a, b, *rest: random_fill((a.shape[0], b.shape[-1]), a.device, dtype))
    for how, got in kernel_runs(name, prefilled, kernel, a, b, *extra):
        try:
            compare(f"{name}, {what}, output filled with random values beforehand" + (f", {how}" if how else ""),
                    got, expected, **tolerance, outputs_start_as_nan=False)
        except ExerciseError as error:
            keeps = prefilled.kept_fill(got, expected, **tolerance)
            raise _with_hint(error, KEPT_FILL_HINT if keeps else None) from None


def check_tile_matmul(tile_matmul_kernel):
    """Exercise 6.1: ``tile_matmul_kernel``, launched by :func:`launch_tile_matmul`, writes
    a @ b in float32 for bfloat16 a (M, K) and b (K, N), K at most 64: one tl.dot a tile."""
    name = "Exercise 6.1 (tile_matmul_kernel)"
    kernel = require_kernel(name, tile_matmul_kernel, "tile_matmul_kernel")
    cases = _operand_cases(64, hidden_case(lambda: (random_size(1, 90), random_size(1, 90), random_size(1, 64))))
    for what, a, b in cases:
        _check_product(name, launch_tile_matmul, kernel, what, a, b, _product(a, b), FLOAT32_OUT)
    # Not counted in the line below: more rows and columns than any case, values far from 1, and
    # an output filled with random values beforehand.
    a, b = _bf16(300, 40, scale=30.0), _bf16(40, 170, scale=0.01)
    _prefilled_product(name, launch_tile_matmul, kernel, "a 300×40 times b 40×170", a, b, _product(a, b),
                       FLOAT32_OUT, torch.float32)
    say(f"{name.split(' (')[0]} passed: {len(cases)} products, K from 1 to 64, transposed a and b.")


# --------------------------------------------------------------------- 6.2: the K loop


def launch_matmul(matmul_kernel, a, b, out=None, block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=2):
    """How exercise 6.2's checker launches the kernel: a (M, K) and b (K, N) bfloat16, any K;
    program (i, j) writes tile (i, j) of out, bfloat16, filled with NaN when not given."""
    if out is None:
        out = _nan_like((a.shape[0], b.shape[1]), a.device, a.dtype)
    return _launch_2d(matmul_kernel, a, b, out, block_m, block_n, block_k, num_warps=num_warps,
                      num_stages=num_stages)


def _k_loop_hint(got, a, b, block_k):
    """A loop over K that stops before the last partial tile, or does not move along K."""
    if not isinstance(got, torch.Tensor):
        return None
    got64, k = got.detach().to("cpu", torch.float64), a.shape[1]
    whole = k // block_k * block_k
    if whole < k and torch.allclose(got64, _product(a[:, :whole], b[:whole]), **BFLOAT16_OUT):
        return (f"the K loop stops before the last tile: K = {k} is not a multiple of BLOCK_K = {block_k}, and "
                f"the {k - whole} last columns of a (rows of b) were never added. Loop while the tile's start is "
                "below K (range(0, K, BLOCK_K)), and let the mask cut the last tile short")
    first = min(block_k, k)
    if k > block_k and torch.allclose(got64, triton.cdiv(k, block_k) * _product(a[:, :first], b[:first]),
                                      **BFLOAT16_OUT):
        return ("every pass of the loop multiplied the first K tile again: the offsets along K must start at the "
                "loop's start (start + tl.arange(0, BLOCK_K)) in both loads")
    return None


def _k_loop_cases():
    """Past the printed cases: K far past any tile (float32's sums, not bfloat16's, keep the
    result right), rows and columns past every multiple, values far from 1."""
    return [("a 130×700 times b 700×90, K = 700", _bf16(130, 700), _bf16(700, 90)),
            ("a 40×77 times b 77×300, values near 30 and 0.01", _bf16(40, 77, scale=30.0), _bf16(77, 300, scale=0.01))]


def _check_matmul_like(name, launch, kernel, visible, extra_hint=lambda got, a, b: None):
    """6.2's and 6.3's cases: the printed ones, then those past them and a pre-filled output."""
    cases = _operand_cases(150, visible)
    for what, a, b in cases + _k_loop_cases():
        _check_product(name, launch, kernel, what, a, b, _product(a, b), BFLOAT16_OUT,
                       extra_hint=lambda got: _k_loop_hint(got, a, b, 16) or extra_hint(got, a, b))
    a, b = _bf16(70, 50), _bf16(50, 45)
    _prefilled_product(name, launch, kernel, "a 70×50 times b 50×45", a, b, _product(a, b), BFLOAT16_OUT,
                       torch.bfloat16)
    return cases


def _speed_of_a_product(name, run_kernel, size, advice, share):
    """Speed feedback at size³ against torch.matmul (cuBLAS) on the same bfloat16 inputs."""
    if not ON_GPU:
        a = b = out = None
    else:
        a, b = _bf16(size, size), _bf16(size, size)
        out = torch.empty(size, size, device=DEVICE, dtype=torch.bfloat16)
    report_throughput(name, lambda: run_kernel(a, b, out), 2 * size ** 3,
                      against=("torch.matmul (cuBLAS)", lambda: torch.matmul(a, b, out=out)), share=share,
                      advice=advice)


# The tiles of the speed runs: what the chapter measured as a good single choice on an H200.
SPEED_TILES = dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3)


def check_matmul(matmul_kernel):
    """Exercise 6.2: ``matmul_kernel``, launched by :func:`launch_matmul`, writes a @ b in
    bfloat16 for bfloat16 a (M, K) and b (K, N) of any sizes, accumulating in float32."""
    name = "Exercise 6.2 (matmul_kernel)"
    kernel = require_kernel(name, matmul_kernel, "matmul_kernel")
    cases = _check_matmul_like(name, launch_matmul, kernel, hidden_case(
        lambda: (random_size(1, 90), random_size(1, 90), random_size(1, 200))))
    say(f"{name.split(' (')[0]} passed: {len(cases)} products, K from 1 to 150 (not a multiple of BLOCK_K), "
        "transposed a and b.")
    _speed_of_a_product(name, lambda a, b, out: launch_matmul(kernel, a, b, out, **SPEED_TILES), 4096, share=0.5,
                        advice="accumulate in a float32 tile that stays in registers for the whole K loop, and load "
                               "each tile of a and b once per iteration")


# --------------------------------------------------------------------- 6.3: grouped program order


def launch_grouped_matmul(grouped_matmul_kernel, a, b, out=None, block_m=16, block_n=16, block_k=16, group_m=4,
                          num_warps=4, num_stages=2):
    """How exercise 6.3's checker launches the kernel: as 6.2's, on a 1-D grid of one program
    a tile of out, with GROUP_M rows of tiles a group."""
    if out is None:
        out = _nan_like((a.shape[0], b.shape[1]), a.device, a.dtype)
    grid = (triton.cdiv(a.shape[0], block_m) * triton.cdiv(b.shape[1], block_n),)
    return _launch_2d(grouped_matmul_kernel, a, b, out, block_m, block_n, block_k, grid=grid, num_warps=num_warps,
                      num_stages=num_stages, GROUP_M=group_m)


def _tiles_written(launches, out_shape, block_m, block_n):
    """{program id: set of (tile row, tile column)} from the stores a recorded launch made to out."""
    written = {}
    for launch in launches:
        out_name = list(launch.arguments.values())[2].name
        for access in launch.accesses:
            if access.kind == "store" and access.argument == out_name and len(access.indices):
                rows, cols = access.indices // out_shape[1], access.indices % out_shape[1]
                tiles = {(int(r) // block_m, int(c) // block_n) for r, c in zip(rows, cols)}
                written.setdefault(access.program[0], set()).update(tiles)
    return written


def grouped_tile(pid, tiles_m, tiles_n, group_m):
    """The tile (row, column) program ``pid`` computes in grouped order: groups of group_m
    rows of tiles, each group's programs going down its rows first, then along its columns."""
    in_group = group_m * tiles_n
    first = pid // in_group * group_m
    rows_in_group = min(tiles_m - first, group_m)
    return first + pid % in_group % rows_in_group, pid % in_group // rows_in_group


def _order_error(name, written, tiles_m, tiles_n, group_m):
    """The first way the programs' order is not the grouped order, or None."""
    for pid in sorted(written):
        if len(written[pid]) > 1:
            return f"{name}: program {pid} wrote into {len(written[pid])} tiles of out; each program writes one tile"
    order = {pid: next(iter(tiles)) for pid, tiles in written.items()}
    if len(set(order.values())) < len(order) or len(order) < tiles_m * tiles_n:
        return None  # some tile written twice or never: the values say where
    if all(order[p] == (p // tiles_n, p % tiles_n) for p in order):
        return (f"{name}: the values are right, but the programs go row by row (program p on tile (p // tiles_n, "
                f"p % tiles_n)): that is the 2-D grid's order, not the grouped one. Consecutive programs of a group "
                f"go down its GROUP_M = {group_m} rows of tiles first, then to the next column")
    for pid in sorted(order):
        expected = grouped_tile(pid, tiles_m, tiles_n, group_m)
        if order[pid] != expected:
            return (f"{name}: the values are right, but program {pid} computed tile {order[pid]} where the grouped "
                    f"order gives it tile {expected} ({tiles_m} × {tiles_n} tiles, GROUP_M = {group_m}): inside a "
                    "group, the rank goes down the group's rows first (row = rank % rows in the group), then "
                    "along its columns (column = rank // rows in the group)")
    return None


def _last_group_hint(got, a, b, block_m, group_m):
    """Rows of the last group never written: its size taken as GROUP_M when fewer rows of tiles remain."""
    tiles_m = triton.cdiv(a.shape[0], block_m)
    if not isinstance(got, torch.Tensor) or tiles_m % group_m == 0:
        return None
    nan_rows = got.detach().isnan().any(dim=1).nonzero().flatten()
    if len(nan_rows) and int(nan_rows.min()) >= (tiles_m - tiles_m % group_m) * block_m:
        return (f"the last group has {tiles_m % group_m} rows of tiles, not GROUP_M = {group_m} (there are "
                f"{tiles_m} rows of tiles): its size is min(tiles_m - first_tile_m, GROUP_M), and the programs "
                "of the last group must be spread over that many rows")
    return None


def check_grouped_matmul(grouped_matmul_kernel):
    """Exercise 6.3: ``grouped_matmul_kernel``, launched by :func:`launch_grouped_matmul`, writes
    6.2's product with program p on the tile the grouped order gives it: groups of GROUP_M rows of
    tiles, each group's programs consecutive. Which program wrote which tile is recorded."""
    name = "Exercise 6.3 (grouped_matmul_kernel)"
    kernel = require_kernel(name, grouped_matmul_kernel, "grouped_matmul_kernel")
    cases = _check_matmul_like(name, launch_grouped_matmul, kernel, hidden_case(
        lambda: (random_size(1, 200), random_size(1, 90), random_size(1, 100))),
        extra_hint=lambda got, a, b: _last_group_hint(got, a, b, 16, 4))
    # The order: 10 rows of tiles (two groups of 4, then one of 2) and 3 columns, recorded.
    for m, n, group_m in ((160, 48, 4), (100, 70, 3)):
        a, b = _bf16(m, 24), _bf16(24, n)
        try:
            got, launches = recorded_run(name, launch_grouped_matmul, kernel, a, b, None, 16, 16, 16, group_m)
            compare(f"{name}, a {m}×24 times b 24×{n}, GROUP_M = {group_m}", got, _product(a, b), **BFLOAT16_OUT)
        except ExerciseError as error:
            raise _with_hint(error, _last_group_hint(got, a, b, 16, group_m)) from None
        error = _order_error(name, _tiles_written(launches, got.shape, 16, 16), triton.cdiv(m, 16),
                             triton.cdiv(n, 16), group_m)
        if error:
            raise ExerciseError(error)
    say(f"{name.split(' (')[0]} passed: {len(cases)} products, and the order of the tiles recorded for groups "
        "of 4 and 3 rows, the last group smaller.")
    _speed_of_a_product(name, lambda a, b, out: launch_grouped_matmul(kernel, a, b, out, group_m=8, **SPEED_TILES),
                        8192, share=0.5,
                        advice="compare with 6.2's kernel at this size: the grouped order should be at least as "
                               "fast. Check GROUP_M's groups run down the rows of tiles first")


# --------------------------------------------------------------------- 6.4: a fused epilogue


def _gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def launch_matmul_bias_gelu(matmul_bias_gelu_kernel, a, b, bias, out=None, block_m=16, block_n=16, block_k=16,
                            num_warps=4, num_stages=2):
    """How exercise 6.4's checker launches the kernel: as 6.2's, with ``bias`` (N,), bfloat16
    and contiguous, after b; out is gelu(a @ b + bias), bfloat16."""
    if out is None:
        out = _nan_like((a.shape[0], b.shape[1]), a.device, a.dtype)
    return _launch_2d(matmul_bias_gelu_kernel, a, b, out, block_m, block_n, block_k, bias, num_warps=num_warps,
                      num_stages=num_stages)


def _epilogue_hint(got, a, b, bias):
    """Which epilogue the answer applied instead: no bias, bias after GELU, no GELU, ReLU."""
    if not isinstance(got, torch.Tensor):
        return None
    got64 = got.detach().to("cpu", torch.float64)
    product, bias64 = _product(a, b), bias.detach().to("cpu", torch.float64)
    bias_at_rows = torch.zeros(a.shape[0], dtype=torch.float64)  # loaded at the rows, masked past N
    bias_at_rows[:min(a.shape[0], b.shape[1])] = bias64[:a.shape[0]]
    candidates = [
        (_gelu_tanh(product + bias_at_rows[:, None]), "the bias was added along the rows (loaded at the rows' "
                                                      "offsets): it has one value a column of out, loaded at the "
                                                      "columns' offsets and broadcast as bias[None, :]"),
        (_gelu_tanh(product), "the bias is missing: add bias[None, :] (one value a column) to the accumulator "
                              "before GELU"),
        (_gelu_tanh(product) + bias64, "the bias was added after GELU: the layer is gelu(a @ b + bias), so add it "
                                       "to the accumulator first"),
        (product + bias64, f"GELU is missing: apply {GELU_TANH} to the accumulator plus the bias"),
        (torch.relu(product + bias64), f"that is ReLU; the exercise asks for GELU, {GELU_TANH}"),
    ]
    explaining = [hint for candidate, hint in candidates if torch.allclose(got64, candidate, **BFLOAT16_OUT)]
    return explaining[0] if len(explaining) == 1 else None  # several: the case cannot tell them apart


def check_matmul_bias_gelu(matmul_bias_gelu_kernel):
    """Exercise 6.4: ``matmul_bias_gelu_kernel``, launched by :func:`launch_matmul_bias_gelu`,
    writes gelu(a @ b + bias) (GELU's tanh form) in bfloat16, the bias and GELU applied to
    the float32 accumulator before its one store."""
    name = "Exercise 6.4 (matmul_bias_gelu_kernel)"
    kernel = require_kernel(name, matmul_bias_gelu_kernel, "matmul_bias_gelu_kernel")
    shapes = [(37, 21, 13), (48, 48, 40), (20, 45, 100), (1, 1, 1)] + hidden_case(
        lambda: (random_size(1, 90), random_size(1, 90), random_size(1, 100)))
    # Past them (not counted below): a wide row, and values whose GELU reaches both of its tails.
    beyond = [(130, 300, 70, 1.0), (40, 60, 50, 3.0)]
    for index, (m, n, k, *scale) in enumerate(shapes + beyond):
        a, b, bias = _bf16(m, k, scale=scale[0] if scale else 1.0), _bf16(k, n), _bf16(n, scale=2.0)
        expected = _gelu_tanh(_product(a, b) + bias.double().cpu())
        what = f"a {m}×{k} times b {k}×{n}, plus bias, GELU"
        launch = launch_matmul_bias_gelu if index < len(shapes) else Prefilled(
            launch_matmul_bias_gelu, lambda a, b, bias: random_fill((a.shape[0], b.shape[1]), a.device, a.dtype))
        if index >= len(shapes):
            what += ", output filled with random values beforehand"
        with warnings.catch_warnings():  # exp overflows to inf in a sigmoid of a far negative value: right
            warnings.simplefilter("ignore", RuntimeWarning)
            runs = list(kernel_runs(name, launch, kernel, a, b, bias))
        for how, got in runs:
            try:
                compare(f"{name}, {what}" + (f", {how}" if how else ""), got, expected, **BFLOAT16_OUT,
                        outputs_start_as_nan=index < len(shapes))
            except ExerciseError as error:
                hint = (_epilogue_hint(got, a, b, bias) or _k_loop_hint(got, a, b, 16)
                        or _missing_other_hint(name, launch, kernel, (a, b, bias), expected, BFLOAT16_OUT))
                if hint is None and isinstance(launch, Prefilled) and launch.kept_fill(got, expected, **BFLOAT16_OUT):
                    hint = KEPT_FILL_HINT
                raise _with_hint(error, hint) from None
    say(f"{name.split(' (')[0]} passed: {len(shapes)} products with their bias and GELU, one of them square.")
    size = 4096
    if not ON_GPU:
        a = b = bias = out = None
    else:
        a, b, bias = _bf16(size, size), _bf16(size, size), _bf16(size)
        out = torch.empty(size, size, device=DEVICE, dtype=torch.bfloat16)
    report_throughput(name, lambda: launch_matmul_bias_gelu(kernel, a, b, bias, out, **SPEED_TILES), 2 * size ** 3,
                      against=("torch's a @ b + bias, then F.gelu, eager", lambda: _gelu_tanh(a @ b + bias)),
                      share=0.5, advice="apply the bias and GELU to the accumulator in registers, after the K loop "
                                        "and before the one store: the unfused ops write and read the product twice")


# --------------------------------------------------------------------- 6.5: a batch of products


def launch_batched_matmul(batched_matmul_kernel, a, b, out=None, block_m=16, block_n=16, block_k=16, num_warps=4,
                          num_stages=2):
    """How exercise 6.5's checker launches the kernel: a (B, M, K) and b (B, K, N) bfloat16 (b
    may be one matrix broadcast, batch stride 0); program (i, j, batch) writes tile (i, j) of
    out[batch], bfloat16, filled with NaN when not given."""
    batch, m, k = a.shape
    n = b.shape[2]
    if out is None:
        out = _nan_like((batch, m, n), a.device, a.dtype)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), batch)
    batched_matmul_kernel[grid](a, b, out, m, n, k, *a.stride(), *b.stride(), *out.stride(), BLOCK_M=block_m,
                                BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages)
    return out


def _batch_hint(got, a, b):
    """Every batch's product written into the first batch, or b's batch stride taken as its size."""
    if not isinstance(got, torch.Tensor) or got.shape[0] < 2:
        return None
    got = got.detach().to("cpu", torch.float64)
    if got[0].isfinite().all() and got[1:].isnan().all():
        return ("only the first matrix of the batch was written: program_id(2) is the batch, and each operand "
                "moves batch * its batch stride (stride_ab, stride_bb, stride_cb) from its start")
    return None


def check_batched_matmul(batched_matmul_kernel):
    """Exercise 6.5: ``batched_matmul_kernel``, launched by :func:`launch_batched_matmul`, writes
    a[i] @ b[i] for every i of the batch, b possibly one matrix broadcast (batch stride 0)."""
    name = "Exercise 6.5 (batched_matmul_kernel)"
    kernel = require_kernel(name, batched_matmul_kernel, "batched_matmul_kernel")
    shapes = [(1, 1, 1, 1), (3, 37, 21, 13), (4, 20, 45, 40)] + hidden_case(
        lambda: (random_size(1, 4), random_size(1, 60), random_size(1, 60), random_size(1, 60)))
    cases = [(f"{n_batch} products of a {m}×{k} times b {k}×{n}", _bf16(n_batch, m, k), _bf16(n_batch, k, n))
             for n_batch, m, n, k in shapes]
    shared = _bf16(1, 30, 18).expand(5, 30, 18)
    cases.append((f"5 products with one b broadcast (strides {shared.stride()})", _bf16(5, 25, 30), shared))
    sliced = _bf16(3, 40, 50)[:, 3:29, 7:40]
    cases.append((f"a a slice of a larger batch (strides {sliced.stride()})", sliced, _bf16(3, 33, 17)))
    for what, a, b in cases:
        expected = _product(a, b)
        for how, got in kernel_runs(name, launch_batched_matmul, kernel, a, b):
            try:
                compare(f"{name}, {what}" + (f", {how}" if how else ""), got, expected, **BFLOAT16_OUT,
                        strides=("stride_am", "stride_ak"))
            except ExerciseError as error:
                hint = _batch_hint(got, a, b) or _missing_other_hint(name, launch_batched_matmul, kernel, (a, b),
                                                                     expected, BFLOAT16_OUT)
                raise _with_hint(error, hint) from None
    # Past them (not counted below): a long batch, and an output filled with random values beforehand.
    a, b = _bf16(70, 9, 20), _bf16(70, 20, 11)
    prefilled = Prefilled(launch_batched_matmul, lambda a, b: random_fill((a.shape[0], a.shape[1], b.shape[2]),
                                                                          a.device, a.dtype))
    for how, got in kernel_runs(name, prefilled, kernel, a, b):
        try:
            compare(f"{name}, 70 products of a 9×20 times b 20×11, output filled with random values beforehand"
                    + (f", {how}" if how else ""), got, _product(a, b), **BFLOAT16_OUT, outputs_start_as_nan=False)
        except ExerciseError as error:
            keeps = prefilled.kept_fill(got, _product(a, b), **BFLOAT16_OUT)
            raise _with_hint(error, KEPT_FILL_HINT if keeps else None) from None
    say(f"{name.split(' (')[0]} passed: {len(cases)} batches, one b broadcast with batch stride 0, a sliced a.")
    batch, size = 16, 2048
    if not ON_GPU:
        a = b = out = None
    else:
        a, b = _bf16(batch, size, size), _bf16(batch, size, size)
        out = torch.empty(batch, size, size, device=DEVICE, dtype=torch.bfloat16)
    report_throughput(name, lambda: launch_batched_matmul(kernel, a, b, out, **SPEED_TILES), 2 * batch * size ** 3,
                      against=("torch.bmm (cuBLAS)", lambda: torch.bmm(a, b, out=out)), share=0.5,
                      advice="use 6.2's tiles and K loop unchanged: the batch only moves each operand's start")
