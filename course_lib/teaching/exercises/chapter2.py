"""Checkers of chapter 2, causal softmax: one function an exercise."""

import torch

from ...core import references
from ...core.runtime import DEVICE
from ..checking import ExerciseError, compare, refusing_calls, run_student_code
from .common import Exercise, hidden_case, random_size, random_matrix, run_quietly, matches

__all__ = ["check_softmax_rows", "check_causal_mask", "check_softmax_grad", "check_online_softmax_stats"]
# The chapter's exercises, in order, for the instructors' notes.
EXERCISES = (
    Exercise('2.1', 'several rows a program', 'check_softmax_rows', kernel=True, skills='row tiles, the max-subtracted softmax, -inf padding', difficulty=2, minutes=25),
    Exercise('2.2', 'the mask in PyTorch', 'check_causal_mask', kernel=False, skills='the causal mask', difficulty=1, minutes=10),
    Exercise('2.3', 'the gradient in PyTorch', 'check_softmax_grad', kernel=False, skills='the softmax backward', difficulty=1, minutes=10),
    Exercise('2.4', 'the online maximum and sum', 'check_online_softmax_stats', kernel=False, skills='the online softmax recurrence', difficulty=2, minutes=20),
)



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


def check_softmax_rows(softmax_rows):
    """Exercise 2.1: ``softmax_rows(x)`` returns the softmax of each row of a 2-D float32 x."""
    name = "Exercise 2.1 (softmax_rows)"
    cases = [(1, 1, 1.0), (5, 3, 1.0), (9, 17, 1.0), (30, 100, 1.0), (7, 100, 1e4)]
    cases += hidden_case(lambda: (random_size(2, 40), random_size(2, 130), 1.0))
    for n_rows, n_cols, scale in cases:
        x = (torch.rand(n_rows, n_cols, device=DEVICE) * 2 - 1) * scale  # uniform in ±scale
        what = f"{name}, x of shape {(n_rows, n_cols)}"
        if scale > 1:
            what += f" with values up to ±{scale:g} (exp overflows to inf unless the row max is subtracted first)"
        got = run_quietly(name, softmax_rows, x)
        try:
            compare(what, got, references.softmax(x.double()), rtol=1e-5, atol=1e-6, show_picture=True)
        except ExerciseError as error:
            hint = _softmax_rows_hint(got, x)
            raise ExerciseError(str(error) + (f"\n  hint: {hint}" if hint else "")) from None
    wide = torch.randn(12, 40, device=DEVICE)
    sliced = wide[:, :33]  # rows 40 elements apart in memory
    got = run_quietly(name, softmax_rows, sliced)
    compare(f"{name}, x = wide[:, :33] whose rows are {sliced.stride(0)} elements apart (use stride_x_row)",
            got, references.softmax(sliced.double()), rtol=1e-5, atol=1e-6, show_picture=True)
    print(f"Exercise 2.1 passed: {len(cases) + 1} shapes, widths 1 to 100, values up to ±1e4 and a sliced x.")


def _mask_hint(got, expected):
    """Name the usual mistakes in a causal mask."""
    n = expected.shape[-1]
    visible = ~expected
    if torch.equal(got, expected | torch.eye(n, dtype=torch.bool, device=expected.device)):
        return "the diagonal is hidden too: query i must see key i (hide j > i, not j >= i)"
    if torch.equal(got, visible):
        return "True and False are swapped: True must mark the hidden keys j > i"
    if torch.equal(got, expected.t()):
        return "the triangle is the wrong one: key j (the column) is hidden from query i (the row) when j > i"
    return None


def check_causal_mask(causal_mask):
    """Exercise 2.2: ``causal_mask(scores)`` returns the (n, n) bool mask of a causal softmax,
    True where key j is hidden from query i (j > i), and raises ValueError for non-square scores."""
    name = "Exercise 2.2 (causal_mask)"
    shapes = [(5, 5), (2, 2), (1, 1), (3, 7, 7), (2, 3, 16, 16)]
    shapes += hidden_case(lambda: (lambda n: (random_size(1, 3), n, n))(random_size(2, 24)))
    for shape in shapes:
        scores = torch.randn(shape, device=DEVICE)
        n = shape[-1]
        what = f"{name}, scores of shape {shape}"
        got = run_student_code(name, causal_mask, scores)
        if got is None:
            raise ExerciseError(f"{what}: got None; did the function return its result?")
        if not isinstance(got, torch.Tensor):
            raise ExerciseError(f"{what}: expected a torch.Tensor, got {type(got).__name__}")
        if got.dtype != torch.bool:
            raise ExerciseError(f"{what}: dtype {got.dtype}; return a torch.bool tensor (a comparison gives one), "
                                "True where the key is hidden")
        if got.device != scores.device:
            raise ExerciseError(f"{what}: the mask is on {got.device} but the scores are on {scores.device}; "
                                "create it with device=scores.device")
        if tuple(got.shape) not in {(n, n), tuple(shape)}:
            raise ExerciseError(f"{what}: shape {tuple(got.shape)}, expected {(n, n)} (or the scores' own shape)")
        expected = references.causal_mask(n, device=DEVICE).expand(got.shape)
        if torch.equal(got, expected):
            continue
        first, hint = got.reshape(-1, n, n)[0], None
        if torch.equal(got, first.expand(got.shape)):
            hint = _mask_hint(first, expected.reshape(-1, n, n)[0])
        try:
            compare(what, got.to(torch.float64), expected.to(torch.float64), rtol=0, atol=0,
                    show_picture=got.ndim == 2)
        except ExerciseError as error:
            message = str(error).replace("got 1,", "got True,").replace("got 0,", "got False,")
            message = message.replace("expected 1\n", "expected True\n").replace("expected 0\n", "expected False\n")
            raise ExerciseError(message + (f"\n  hint: {hint}" if hint else "")) from None
    try:
        causal_mask(torch.randn(4, 6, device=DEVICE))
    except ValueError:
        pass
    except Exception as error:
        raise ExerciseError(f"{name}: scores of shape (4, 6) raised {type(error).__name__}: {error}; "
                            "raise a ValueError instead") from error
    else:
        raise ExerciseError(f"{name}: scores of shape (4, 6) are not square, so which key is on query i's "
                            "diagonal is ambiguous: raise a ValueError saying so (the seed's `row % n_cols` "
                            "quietly made a wrong mask here)")
    print("Exercise 2.2 passed: n from 1 to 16, batched scores, and a ValueError for non-square scores.")


def check_softmax_grad(softmax_grad):
    """Exercise 2.3: ``softmax_grad(y, grad_y)`` returns grad_x of a softmax from its output y."""
    name = "Exercise 2.3 (softmax_grad)"
    cases = [((1,), False), ((4, 7), False), ((3, 6, 6), True), ((2, 2, 9, 9), True)]
    cases += hidden_case(lambda: (lambda n: ((random_size(1, 3), n, n), True))(random_size(2, 12)))
    for shape, causal in cases:
        x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
        y = references.causal_softmax(x) if causal else references.softmax(x)
        grad_y = torch.randn(shape, dtype=torch.float64)
        (expected,) = torch.autograd.grad(y, x, grad_y)
        # the answer must come from the formula, not from autograd or the reference
        with torch.no_grad(), refusing_calls(references.softmax_backward):
            got = run_student_code(name, softmax_grad, y.detach(), grad_y)
        kind = "causal " if causal else ""
        compare(f"{name}, {kind}y of shape {shape} (sum over the last dimension, keeping it)",
                got, expected, rtol=1e-9, atol=1e-9)
    print("Exercise 2.3 passed: grad_x matches autograd's for plain and causal y, 1-D to 4-D.")


def check_online_softmax_stats(online_softmax_stats):
    """Exercise 2.4: ``online_softmax_stats(x, tile)`` returns each row's max and sum(exp(x - max)),
    reading x one tile of columns at a time."""
    name = "Exercise 2.4 (online_softmax_stats)"
    random_rows = torch.randn(6, 50, dtype=torch.float64) * 3
    rising = torch.linspace(-400.0, 400.0, 50, dtype=torch.float64) + torch.rand(4, 50, dtype=torch.float64)
    masked = torch.randn(5, 50, dtype=torch.float64)
    masked[:, :20] = float("-inf")  # keys hidden by a mask
    cases = [(random_rows, tile, "random rows") for tile in (1, 7, 16, 50, 64)]
    cases += [(rising, 8, "rows whose max grows from tile to tile"),
              (masked, 8, "rows whose first tiles are all -inf")]
    cases += hidden_case(lambda: (random_matrix(6, 90) * 3, random_size(1, 64), "random rows"))
    for x, tile, kind in cases:
        what = f"{name}, tiles of {tile} columns, x of shape {tuple(x.shape)}, {kind}"
        result = run_student_code(name, online_softmax_stats, x.clone(), tile)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise ExerciseError(f"{name}: return a tuple (running_max, running_sum), got {type(result).__name__}")
        expected_max = x.amax(dim=-1)
        expected_sum = torch.exp(x - expected_max[:, None]).sum(dim=-1)
        compare(f"{what}: the max", result[0], expected_max, rtol=1e-12, atol=0)
        try:
            compare(f"{what}: the sum", result[1], expected_sum, rtol=1e-9, atol=1e-12)
        except ExerciseError as error:
            if isinstance(result[1], torch.Tensor) and result[1].isnan().any() and x.isinf().any():
                hint = ("a tile of only -inf gives exp(-inf - (-inf)) = NaN: "
                        "shift by 0 instead while the running max is still -inf")
            else:
                hint = ("is the running sum rescaled by exp(m_old - m_new) at every tile, "
                        "before the new tile's exp(x - m_new) are added?")
            raise ExerciseError(f"{error}\n  hint: {hint}") from None
    print(f"Exercise 2.4 passed: {len(cases)} cases, tiles of 1 to 64 columns on rows of 50, "
          "a growing max and masked keys.")
