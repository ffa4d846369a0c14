"""Checkers of chapter 2, causal softmax: one function an exercise."""

import warnings

import torch
import triton

from ...core import references
from ...core.runtime import DEVICE, ON_GPU
from ..checking import ExerciseError, compare
from ..student_kernels import element_loads, kernel_runs, recorded_run, report_speed, require_kernel
from .common import Exercise, beyond_cases_runs, hidden_case, matches, random_size, say

__all__ = ["launch_softmax_rows", "check_softmax_rows", "launch_causal_softmax", "check_causal_softmax",
           "launch_online_softmax", "check_online_softmax"]
# The chapter's exercises, in order, for the instructors' notes.
EXERCISES = (
    Exercise('2.1', 'several rows a program', 'check_softmax_rows', kernel=True, skills='row tiles, the max-subtracted softmax, -inf padding, masks on both axes', difficulty=2, minutes=25),
    Exercise('2.2', 'the causal mask in the kernel', 'check_causal_softmax', kernel=True, skills='a 2-D grid of (matrix, query tile), a mask that differs from row to row, exact zeros at hidden keys, three strides', difficulty=3, minutes=30),
    Exercise('2.3', 'rows longer than a tile: the online softmax', 'check_online_softmax', kernel=True, skills='state carried across a loop: the running maximum and the rescaled running sum; two passes over a row', difficulty=4, minutes=40),
)


def _checked_runs(name, what, launch, kernel, args, expected, hint, show_picture=False):
    """Run the case as kernel_runs does and compare each result with ``expected``; when one
    is wrong, ``hint(got)`` names the usual mistake behind it, if it recognises one."""
    with warnings.catch_warnings():
        # a row past the end computes -inf - (-inf) in NumPy, which warns on a CPU and not on a
        # GPU, though that row is never stored
        warnings.simplefilter("ignore", RuntimeWarning)
        for how, got in kernel_runs(name, launch, kernel, *args):
            try:
                compare(what + (f", {how}" if how else ""), got, expected, rtol=1e-5, atol=1e-6,
                        show_picture=show_picture)
            except ExerciseError as error:
                named = hint(got)
                raise ExerciseError(str(error) + (f"\n  hint: {named}" if named else "")) from None


def _beyond_cases(name, what, launch, kernel, x, expected, fresh_out, hint=None):
    """A case past the listed ones (see common.beyond_cases_runs), compared as they are."""
    def verify(label, got):
        compare(label, got, expected, rtol=1e-5, atol=1e-6)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        beyond_cases_runs(name, what, launch, kernel, (x,), verify, fresh_out, hint)


def _far_below_hint(got, centre):
    """What goes wrong on scores far below 0 (``centre`` -200), or None elsewhere: a running
    maximum started at 0, or a masked lane loaded as a finite stand-in for -inf."""
    if centre > -50 or not isinstance(got, torch.Tensor):
        return None
    if got.isnan().any():
        return ("the rows come out NaN where every score lies far below 0: a maximum started at 0 (or at any "
                "finite value above the scores) makes every exp(x - max) underflow to 0 and the sum 0; start it "
                "at float('-inf'), which every score exceeds")
    return ("every score of these rows lies far below 0, so a masked lane loaded as a finite stand-in for -inf "
            "(0.0, -100, ...) wins the maximum and takes the weight from the real scores: load the masked lanes "
            "as float('-inf'), whose exp is 0 whatever the scores")


def _filled_like(shape, n_cols):
    """A float32 output of ``shape`` filled with random weights a softmax could give (0 to 2/n_cols)."""
    return torch.rand(shape, device=DEVICE) * (2.0 / max(n_cols, 1))


def _far_from_zero(shape, centre):
    """Scores of ``shape`` spread ±3 around ``centre``: rows far below 0 (-200) find a maximum
    started at 0 instead of -inf, whose exp(x - 0) underflows to 0 (0 / 0)."""
    return torch.randn(shape, device=DEVICE) * 3 + centre


def _speed_input(*shape):
    """A float32 input of ``shape`` on the GPU for the speed feedback, or None without one."""
    return torch.randn(shape, device=DEVICE) if ON_GPU else None


# -------------------------------------------------------------------- 2.1 several rows a program


def launch_softmax_rows(softmax_rows_kernel, x, out=None, block_rows=4):
    """How exercise 2.1's checker launches the kernel: one program a tile of ``block_rows``
    rows, BLOCK_COLS the row length rounded up to a power of two; ``out`` contiguous float32,
    filled with NaN when not given."""
    n_rows, n_cols = x.shape
    if out is None:
        out = torch.full((n_rows, n_cols), float("nan"), device=x.device, dtype=torch.float32)
    softmax_rows_kernel[(triton.cdiv(n_rows, block_rows),)](
        x, out, n_rows, n_cols, x.stride(0), out.stride(0),
        BLOCK_ROWS=block_rows, BLOCK_COLS=triton.next_power_of_2(n_cols))
    return out


def _softmax_rows_hint(got, x):
    """The usual mistake behind a wrong softmax_rows answer, or None."""
    if not isinstance(got, torch.Tensor) or got.shape != x.shape:
        return None
    x64 = x.detach().to("cpu", torch.float64)
    got64 = got.detach().to("cpu", torch.float64)
    n_rows, n_cols = x64.shape
    if not got64.isfinite().all() and (x64.abs().max() > 88):
        return ("exp(x) overflows float32 to inf past x = 88, and inf / inf is NaN: subtract each row's maximum "
                "before tl.exp (the softmax does not change, and the largest exponent becomes 0)")
    pad = (1 << (n_cols - 1).bit_length()) - n_cols  # BLOCK_COLS is the next power of 2
    if pad:
        padded = torch.cat([x64, x64.new_zeros(n_rows, pad)], dim=1)
        if matches(got, references.softmax(padded)[:, :n_cols], rtol=1e-5, atol=1e-6):
            return ("the lanes past the end of each row count in the sum as exp(0 - max): load them with "
                    "other=float('-inf'), so that exp gives 0 there")
    block = 1
    while block <= n_rows:  # the max and sum taken down each tile of `block` rows instead of along each row
        down = torch.cat([torch.softmax(x64[start:start + block], dim=0) for start in range(0, n_rows, block)])
        if block > 1 and matches(got, down, rtol=1e-5, atol=1e-6):
            return (f"each column of every tile of {block} rows sums to 1, not each row: reduce along axis=1 "
                    "(across a row), not axis=0 (down the tile)")
        block *= 2
    return None


def check_softmax_rows(softmax_rows_kernel):
    """Exercise 2.1: ``softmax_rows_kernel``, launched by :func:`launch_softmax_rows`, writes the
    softmax of each row of a 2-D float32 x whose rows may lie any distance apart."""
    name = "Exercise 2.1 (softmax_rows_kernel)"
    kernel = require_kernel(name, softmax_rows_kernel, "softmax_rows_kernel")
    cases = [(1, 1, 1.0), (5, 3, 1.0), (9, 17, 1.0), (30, 100, 1.0), (7, 100, 1e4)]
    cases += hidden_case(lambda: (random_size(2, 40), random_size(2, 130), 1.0))
    for n_rows, n_cols, scale in cases:
        x = (torch.rand(n_rows, n_cols, device=DEVICE) * 2 - 1) * scale  # uniform in ±scale
        what = f"{name}, x of shape {(n_rows, n_cols)}"
        if scale > 1:
            what += f" with values up to ±{scale:g} (exp overflows to inf unless the row max is subtracted first)"
        _checked_runs(name, what, launch_softmax_rows, kernel, (x,), references.softmax(x.double()),
                      lambda got: _softmax_rows_hint(got, x), show_picture=True)
    sliced = torch.randn(12, 40, device=DEVICE)[:, :33]  # rows 40 elements apart in memory
    _checked_runs(name, f"{name}, x = wide[:, :33] whose rows are {sliced.stride(0)} elements apart (use stride_x_row)",
                  launch_softmax_rows, kernel, (sliced,), references.softmax(sliced.double()), lambda got: None,
                  show_picture=True)
    for what, x, centre in [
            ("x of shape (1030, 5), more rows than any case above", torch.randn(1030, 5, device=DEVICE), 0.0),
            ("x of shape (3, 1500), longer rows than any case above", torch.randn(3, 1500, device=DEVICE), 0.0),
            ("rows of scores near -200", _far_from_zero((9, 37), -200.0), -200.0),
            ("rows of scores near +200", _far_from_zero((9, 37), 200.0), 200.0)]:
        _beyond_cases(name, what, launch_softmax_rows, kernel, x, references.softmax(x.double()),
                      lambda: _filled_like(x.shape, x.shape[1]), lambda got, c=centre: _far_below_hint(got, c))
    say(f"Exercise 2.1 passed: {len(cases) + 1} shapes, widths 1 to 100, values up to ±1e4 and a sliced x.")
    x = _speed_input(65536, 512)
    out = torch.empty_like(x) if x is not None else None
    report_speed(name, lambda: launch_softmax_rows(kernel, x, out, block_rows=4), 2 * 65536 * 512 * 4,
                 against=("course_lib's softmax", lambda: _course_softmax(x)),
                 advice="a row is read once and written once: keep the whole tile in registers between the load "
                        "and the store, with no second load of x")


def _course_softmax(x, causal=False):
    from ...kernels.softmax_op import causal_softmax, softmax

    return causal_softmax(x) if causal else softmax(x)


# -------------------------------------------------------------------- 2.2 the causal mask in the kernel


def launch_causal_softmax(causal_softmax_kernel, x, out=None, block_rows=4):
    """How exercise 2.2's checker launches the kernel on scores x of shape (B, n, n): a grid of
    (B, cdiv(n, block_rows)) programs, program (b, t) taking queries t·block_rows ... of matrix
    b, BLOCK_COLS the row length rounded up to a power of two; ``out`` contiguous float32,
    filled with NaN when not given."""
    batch, n, _ = x.shape
    if out is None:
        out = torch.full((batch, n, n), float("nan"), device=x.device, dtype=torch.float32)
    # out goes in as its (B·n, n) view, the same elements: the picture of a wrong access draws
    # 1-D and 2-D tensors only
    causal_softmax_kernel[(batch, triton.cdiv(n, block_rows))](
        x, out.view(batch * n, n), n, x.stride(0), x.stride(1), x.stride(2), out.stride(0), out.stride(1),
        BLOCK_ROWS=block_rows, BLOCK_COLS=triton.next_power_of_2(n))
    return out


def _causal_softmax_hint(got, x):
    """The usual mistake behind a wrong causal softmax, or None."""
    if not isinstance(got, torch.Tensor) or got.shape != x.shape:
        return None
    x64 = x.detach().to("cpu", torch.float64)
    got64 = got.detach().to("cpu", torch.float64)
    expected = references.causal_softmax(x64)
    n = x.shape[-1]
    hidden = references.causal_mask(n)
    if n > 1 and matches(got64[:, 1:], references.causal_softmax(x64, diagonal=-1)[:, 1:], rtol=1e-5, atol=1e-6):
        return ("the diagonal is hidden: query i sees key i itself, keys j <= i (not j < i); query 0 then "
                "sees nothing at all, and its row comes out NaN")
    below = torch.ones(n, n, dtype=torch.bool).tril(diagonal=-1)
    if matches(got64, references.softmax(x64.masked_fill(below, float("-inf"))).masked_fill(below, 0.0),
               rtol=1e-5, atol=1e-6):
        return ("the wrong triangle is visible: query i (a row) sees the keys j <= i (the columns up to the "
                "diagonal), not j >= i")
    if got64.masked_fill(hidden, 0.0).isnan().any() and not x64.isnan().any():  # NaN where keys are visible
        return ("the hidden keys count in the sum: loaded without other=, the lanes the mask switches off hold "
                "no defined value (NaN here, whatever memory held on a GPU); load them with "
                "other=float('-inf'), so that exp gives 0 there")
    padding = triton.next_power_of_2(n) - n
    for padded_lanes in {0, padding}:  # hidden keys loaded as 0, with or without the lanes past the row
        zeros = torch.cat([x64.masked_fill(hidden, 0.0), x64.new_zeros(*x.shape[:-1], padded_lanes)], dim=-1)
        counted = references.softmax(zeros)[..., :n]
        if matches(got64.masked_fill(hidden, 0.0), counted.masked_fill(hidden, 0.0), rtol=1e-5, atol=1e-6):
            return ("the hidden keys count in the sum: loaded as 0 (other=0.0, or no other= at all) each adds "
                    "exp(0 - max); load them as float('-inf'), whose exp is 0")
    if got64[..., hidden].isnan().all() and matches(got64.masked_fill(hidden, 0.0), expected, rtol=1e-5, atol=1e-6):
        return ("y is never written above the diagonal: the hidden keys' weights are 0 and must be stored "
                "too; store every key of the row (keys < n), not only the visible ones")
    if x.stride(2) != 1:  # the keys read as if they were neighbours in memory
        neighbours = torch.as_strided(x, x.shape, (x.stride(0), x.stride(1), 1))
        if matches(got64, references.causal_softmax(neighbours.double()), rtol=1e-5, atol=1e-6):
            return (f"the keys of these scores are {x.stride(2)} elements apart: multiply each key index by "
                    "stride_x_col, not by 1")
    wrong = ~torch.isclose(got64, expected, rtol=1e-5, atol=1e-6)
    wrong_queries = wrong.any(dim=-1).any(dim=0).nonzero().flatten().tolist()
    if wrong_queries == [n - 1]:
        return (f"only the last query of each matrix is wrong, query {n - 1}, the one that sees every key: is "
                f"key {n - 1} visible to it (a mask like keys < n - 1 stops the row one key short), and do the "
                "lanes past the end of the row stay hidden?")
    return None


def _hidden_keys_never_read(name, kernel):
    """The statement's requirements that y is exactly 0 at the hidden keys, and that the hidden
    scores are never read, from the accesses the interpreter recorded: no load of x may touch
    a key j > i of query i."""
    x = torch.randn(2, 9, 9, device=DEVICE)
    y, launches = recorded_run(name, launch_causal_softmax, kernel, x)
    hidden = references.causal_mask(x.shape[-1])
    above = y.detach().cpu()[:, hidden]
    if (above != 0).any():
        raise ExerciseError(
            f"{name}: y must be exactly 0 at the hidden keys (keys j > i), but {int((above != 0).sum())} of them "
            f"hold other values, up to {float(above.abs().nan_to_num(float('inf')).max()):.3g} (scores of shape "
            f"{tuple(x.shape)}).\n  hint: a hidden key's weight comes out exactly 0 when its score counts as "
            "float('-inf'), whose exp is 0; a finite stand-in such as -100 leaves a tiny weight, and an element "
            "left unwritten keeps whatever y held")
    loads = element_loads(launches).reshape(x.shape)
    read_hidden = loads.masked_fill(~hidden, 0) > 0
    if read_hidden.any():
        b, i, j = (int(v) for v in read_hidden.nonzero()[0])
        raise ExerciseError(
            f"{name}: the values are right, but the kernel reads scores it must not: {int(read_hidden.sum())} of "
            f"the {int(references.causal_mask(x.shape[-1]).sum()) * x.shape[0]} hidden scores (keys j > i) of scores "
            f"of shape {tuple(x.shape)} are loaded, the first at matrix {b}, query {i}, key {j}.\n  hint: the "
            "exercise asks for the causal mask in the load itself (mask=keys <= query, other=float('-inf')), so "
            "that a hidden score is never read; loading the whole row and masking it afterwards (tl.where) "
            "reads every hidden score")


def check_causal_softmax(causal_softmax_kernel):
    """Exercise 2.2: ``causal_softmax_kernel``, launched by :func:`launch_causal_softmax`, writes
    the causal softmax of scores (B, n, n) of any strides: query i sees keys j <= i, and y is
    exactly 0 at the keys it does not see."""
    name = "Exercise 2.2 (causal_softmax_kernel)"
    kernel = require_kernel(name, causal_softmax_kernel, "causal_softmax_kernel")
    cases = [(2, 8), (2, 5), (1, 1), (3, 16), (2, 33)]
    cases += hidden_case(lambda: (random_size(1, 3), random_size(2, 40)))
    inputs = [(f"scores of shape {(batch, n, n)}", torch.randn(batch, n, n, device=DEVICE) * 3) for batch, n in cases]
    transposed = torch.randn(2, 12, 12, device=DEVICE).transpose(1, 2)
    inputs.append((f"transposed scores (strides {transposed.stride()})", transposed))
    sliced = torch.randn(2, 20, 24, device=DEVICE)[:, 2:19, 3:20]
    inputs.append((f"scores sliced from a larger tensor (strides {sliced.stride()})", sliced))
    for what, x in inputs:
        _checked_runs(name, f"{name}, {what}", launch_causal_softmax, kernel, (x,),
                      references.causal_softmax(x.double()), lambda got: _causal_softmax_hint(got, x))
    for what, x, centre in [("scores of shape (1, 130, 130), more queries and keys than any case above",
                             torch.randn(1, 130, 130, device=DEVICE) * 3, 0.0),
                            ("scores near -200", _far_from_zero((2, 19, 19), -200.0), -200.0),
                            ("scores near +200", _far_from_zero((2, 19, 19), 200.0), 200.0)]:
        _beyond_cases(name, what, launch_causal_softmax, kernel, x, references.causal_softmax(x.double()),
                      lambda: _filled_like(x.shape, x.shape[-1]), lambda got, c=centre: _far_below_hint(got, c))
    _hidden_keys_never_read(name, kernel)
    say(f"Exercise 2.2 passed: {len(inputs)} cases, n from 1 to 33, transposed and sliced scores.")
    x = _speed_input(32, 1024, 1024)
    out = torch.empty_like(x) if x is not None else None
    report_speed(name, lambda: launch_causal_softmax(kernel, x, out, block_rows=4), int(1.5 * 32 * 1024 * 1024 * 4),
                 against=("course_lib's causal_softmax", lambda: _course_softmax(x, causal=True)),
                 advice="the scores above the diagonal are never needed: load with the causal mask itself, so "
                        "that half of them are never read, and store the whole row")


# -------------------------------------------------------------------- 2.3 the online softmax


def launch_online_softmax(online_softmax_kernel, x, out=None, block_cols=16):
    """How exercise 2.3's checker launches the kernel: one program a row, which it walks
    ``block_cols`` columns at a time; ``out`` contiguous float32, filled with NaN when not given."""
    n_rows, n_cols = x.shape
    if out is None:
        out = torch.full((n_rows, n_cols), float("nan"), device=x.device, dtype=torch.float32)
    online_softmax_kernel[(n_rows,)](x, out, n_cols, x.stride(0), out.stride(0), BLOCK_COLS=block_cols)
    return out


def _tiled_softmax(x, block, rescale=True, running_max=True, running_sum=True, padding=float("-inf"),
                   initial_max=float("-inf")):
    """The online softmax of the rows of x in float32, as a kernel computes it tile by tile,
    with one of its usual mistakes switched on: the sum not rescaled when the max grows, the
    max of each tile alone, the sum of the last tile alone, padding lanes loaded as ``padding``,
    the running maximum started at ``initial_max``."""
    x = x.detach().to("cpu", torch.float32)
    n_rows, n_cols = x.shape
    padded = torch.full((n_rows, triton.cdiv(n_cols, block) * block), padding)
    padded[:, :n_cols] = x
    row_max = torch.full((n_rows,), initial_max)
    row_sum = torch.zeros(n_rows)
    for start in range(0, n_cols, block):
        tile = padded[:, start:start + block]
        grown = torch.maximum(row_max, tile.amax(dim=1)) if running_max else tile.amax(dim=1)
        tile_sum = torch.exp(tile - grown[:, None]).sum(dim=1)
        carried = row_sum * torch.exp(row_max - grown) if rescale else row_sum
        row_sum = carried + tile_sum if running_sum else tile_sum
        row_max = grown
    return torch.exp(x - row_max[:, None]) / row_sum[:, None]


def _resembles(got, model):
    """got is the answer ``model`` predicts, infinities and NaN where it has them included."""
    return (isinstance(got, torch.Tensor) and got.shape == model.shape
            and bool(torch.allclose(got.detach().to("cpu", torch.float32), model, rtol=1e-4, atol=1e-6,
                                    equal_nan=True)))


def _online_softmax_hint(got, x, block):
    """The usual mistake behind a wrong online softmax, or None."""
    mistakes = [
        (dict(rescale=False),
         "the running sum is not rescaled when the maximum grows: each tile's exponentials are taken relative "
         "to the maximum of that moment, so multiply the sum so far by exp(old_max - new_max) before adding "
         "the new tile's sum"),
        (dict(running_sum=False),
         "the sum is the last tile's only: add each tile's exponentials to the running sum (rescaled), do not "
         "replace it"),
        (dict(padding=0.0),
         "the lanes past the end of the row count in the sum as exp(0 - max): load them with "
         "other=float('-inf'), so that they never win the maximum and their exp is 0"),
        (dict(initial_max=0.0),
         "the running maximum starts at 0, not float('-inf'): on a row whose scores all lie far below 0 it "
         "never moves, exp(x - 0) underflows to 0 and the sum is 0 (0 / 0 is NaN); start it at float('-inf'), "
         "which every score exceeds"),
        (dict(running_max=False),
         "the maximum is the last tile's only: the running maximum must keep the largest value of every tile "
         "so far, max(running_max, tile max); with a smaller maximum exp(x - max) overflows to inf where an "
         "earlier tile held a larger score"),
    ]
    right = _tiled_softmax(x, block)
    for switches, hint in mistakes:
        model = _tiled_softmax(x, block, **switches)
        if not _resembles(model, right) and _resembles(got, model):  # this case tells the mistake apart
            return hint
    return None


def _one_online_pass(name, kernel, block):
    """The statement's online softmax, from the accesses the interpreter recorded: each score
    is loaded at most twice, once in the pass that carries the running maximum and sum, once
    in the pass that writes (a pass for the maximum and another for the sum load it three times)."""
    x = torch.randn(2, 3 * block + 5, device=DEVICE)
    _, launches = recorded_run(name, launch_online_softmax, kernel, x)
    loads = element_loads(launches)
    if int(loads.max()) > 2:
        raise ExerciseError(
            f"{name}: the values are right, but each score is loaded up to {int(loads.max())} times (x of shape "
            f"{tuple(x.shape)}, tiles of {block}): the exercise asks for the online softmax, which reads a row "
            "twice, once to carry the running maximum and the running sum together, once to write.\n  hint: "
            "a pass for the maximum and then another for the sum reads the row once more; merge them: when a "
            "tile raises the maximum, rescale the sum so far by exp(old_max - new_max) and add the tile's sum")


def check_online_softmax(online_softmax_kernel):
    """Exercise 2.3: ``online_softmax_kernel``, launched by :func:`launch_online_softmax`, writes
    the softmax of each row of a 2-D float32 x, one program a row, reading it a tile at a time."""
    name = "Exercise 2.3 (online_softmax_kernel)"
    kernel = require_kernel(name, online_softmax_kernel, "online_softmax_kernel")
    block = 16
    inputs = [(f"random rows, x of shape {shape}", torch.randn(shape, device=DEVICE) * 3)
              for shape in [(4, 50), (1, 1), (3, 16)]]
    rising = torch.linspace(-400.0, 400.0, 64) + torch.rand(4, 64)
    inputs.append(("rows of 64 whose maximum grows from tile to tile", rising.to(DEVICE)))
    peaked = torch.randn(3, 100)
    peaked[:, 3] = 150.0
    inputs.append(("rows of 100 whose largest score, 150, lies in the first tile", peaked.to(DEVICE)))
    inputs.append(("x = wide[:, :70], rows 90 elements apart (use stride_x_row)",
                   torch.randn(5, 90, device=DEVICE)[:, :70]))
    inputs += hidden_case(lambda: ("random rows", torch.randn(random_size(1, 6), random_size(2, 200), device=DEVICE) * 3))
    for what, x in inputs:
        _checked_runs(name, f"{name}, tiles of {block} columns, {what}", launch_online_softmax, kernel, (x,),
                      references.softmax(x.double()), lambda got: _online_softmax_hint(got, x, block),
                      show_picture=True)
    for what, x, centre in [("rows of scores near -200", _far_from_zero((3, 70), -200.0), -200.0),
                            ("rows of scores near +200", _far_from_zero((3, 70), 200.0), 200.0),
                            ("x of shape (2, 2001), longer rows than any case above",
                             torch.randn(2, 2001, device=DEVICE), 0.0),
                            ("x of shape (300, 5), more rows than any case above",
                             torch.randn(300, 5, device=DEVICE), 0.0)]:
        _beyond_cases(name, f"tiles of {block} columns, {what}", launch_online_softmax, kernel, x,
                      references.softmax(x.double()), lambda: _filled_like(x.shape, x.shape[1]),
                      lambda got, x=x, c=centre: _far_below_hint(got, c) or _online_softmax_hint(got, x, block))
    _one_online_pass(name, kernel, block)
    say(f"Exercise 2.3 passed: {len(inputs)} cases, rows of 1 to 100 in tiles of {block}, a growing maximum "
          "and a large first score.")
    x = _speed_input(4096, 32768)
    out = torch.empty_like(x) if x is not None else None
    report_speed(name, lambda: launch_online_softmax(kernel, x, out, block_cols=4096), 2 * 4096 * 32768 * 4,
                 against=("course_lib's softmax", lambda: _course_softmax(x)),
                 # what the chapter's own answer reaches (0.64 of the copy against course_lib's 0.91, 0.70 of it,
                 # on an H200): its two passes read x twice; the advice is for slower answers
                 share=0.6,
                 advice="pass 2 reads each row again: with one program a row and a tile of a few thousand "
                        "columns the row is still in L2 when pass 2 comes; keep the first loop to one load, "
                        "one maximum and one sum a tile")
