"""One checker per exercise. Each runs the student's code on fresh random inputs of
several shapes, compares with the references, prints one line starting
``Exercise N.M passed`` or raises :class:`~course_lib.checking.ExerciseError`
saying what is wrong and where.
"""

import math

import torch

from . import references
from .checking import ExerciseError, compare, refusing_calls, run_student_code
from .runtime import DEVICE

# Set by the grader on its own fresh copy of this module (fresh_checker.run_checker): each
# checker then adds a case of random size, drawn from the hidden seed, to the sizes a
# student saw, so that an answer that works only at those sizes fails too.
HIDDEN_SIZES = False


def _hidden(draw):
    """[draw()] when grading with hidden sizes, else nothing."""
    return [draw()] if HIDDEN_SIZES else []


def _size(low, high):
    """A random integer from low to high, from torch's generator (the hidden seed when grading)."""
    return int(torch.randint(low, high + 1, ()))


def _random_rows(max_rows, max_cols, dtype=torch.float64):
    return torch.randn(_size(1, max_rows), _size(2, max_cols), dtype=dtype)

# ------------------------------------------------------------- chapter 1: weighted sum


def check_scale_columns(scale_columns):
    """Exercise 1.1: ``scale_columns(x, w)`` returns x * w[None, :] for a 2-D x."""
    name = "Exercise 1.1 (scale_columns)"
    cases = [(1, 1), (5, 3), (37, 130), (64, 64)] + _hidden(lambda: (_size(2, 80), _size(2, 200)))
    for n_rows, n_cols in cases:
        x = torch.randn(n_rows, n_cols, device=DEVICE)
        w = torch.randn(n_cols, device=DEVICE)
        got = run_student_code(name, scale_columns, x, w)
        compare(f"{name}, x of shape {(n_rows, n_cols)}", got, x.double() * w.double(),
                rtol=1e-6, atol=1e-6, show_picture=True)
    transposed = torch.randn(40, 23, device=DEVICE).t()
    w = torch.randn(40, device=DEVICE)
    got = run_student_code(name, scale_columns, transposed, w)
    compare(f"{name}, transposed x (strides {transposed.stride()})", got,
            transposed.double() * w.double(), rtol=1e-6, atol=1e-6, show_picture=True)
    print(f"{name.split(' (')[0]} passed: {len(cases) + 1} shapes, including a transposed x.")


def check_weighted_sum_grads(weighted_sum_grads):
    """Exercise 1.2: ``weighted_sum_grads(x, w, grad_y)`` returns (grad_x, grad_w) without autograd."""
    name = "Exercise 1.2 (weighted_sum_grads)"
    for shape in [(3,), (4, 5), (2, 3, 7)] + _hidden(lambda: (_size(1, 5), _size(1, 9), _size(1, 40))):
        x = torch.randn(shape, dtype=torch.float64)
        w = torch.randn(shape[-1], dtype=torch.float64)
        grad_y = torch.randn(shape[:-1], dtype=torch.float64)
        # the answer must come from the formulas, not from autograd or the reference
        with torch.no_grad(), refusing_calls(references.weighted_sum_backward):
            result = run_student_code(name, weighted_sum_grads, x, w, grad_y)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise ExerciseError(f"{name}: return a tuple (grad_x, grad_w), got {type(result).__name__}")
        expected_x, expected_w = references.weighted_sum_backward(x, w, grad_y)
        compare(f"{name}: grad_x for x of shape {shape}", result[0], expected_x, rtol=1e-9, atol=1e-9)
        compare(f"{name}: grad_w for x of shape {shape}", result[1], expected_w, rtol=1e-9, atol=1e-9)
    print("Exercise 1.2 passed: grad_x and grad_w match autograd's for 1-, 2- and 3-D x.")


def check_column_sum(column_sum):
    """Exercise 1.3: ``column_sum(partial)`` returns partial.sum(0) for a 2-D float32 tensor."""
    name = "Exercise 1.3 (column_sum)"
    cases = [(1, 1), (7, 5), (300, 129), (1000, 3)] + _hidden(lambda: (_size(2, 600), _size(1, 200)))
    for shape in cases:
        partial = torch.randn(shape, device=DEVICE)
        got = run_student_code(name, column_sum, partial)
        compare(f"{name}, partial of shape {shape}", got, partial.double().sum(0),
                rtol=1e-5, atol=1e-5 * shape[0] ** 0.5)
    print(f"Exercise 1.3 passed: {len(cases)} shapes, from a single element to 1000 rows.")


# ----------------------------------------------------------- chapter 2: causal softmax


def _run_quietly(name, fn, *args):
    """run_student_code without the interpreter's RuntimeWarnings: a fully masked row
    past the end computes -inf - (-inf) in NumPy, which warns on a CPU and not on a
    GPU, though that row is never stored."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return run_student_code(name, fn, *args)


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
        if _same(got, references.softmax(padded)[:, :n_cols], rtol=1e-5, atol=1e-6):
            return ("the lanes past the end of each row count in the sum as exp(0 - max): load them with "
                    "other=float('-inf'), so that exp gives 0 there")
    block = 1
    while block <= n_rows:  # the max and sum taken down each tile of `block` rows instead of along each row
        down = torch.cat([torch.softmax(x64[start:start + block], dim=0) for start in range(0, n_rows, block)])
        if block > 1 and _same(got, down, rtol=1e-5, atol=1e-6):
            return (f"each column of every tile of {block} rows sums to 1, not each row: reduce along axis=1 "
                    "(across a row), not axis=0 (down the tile)")
        block *= 2
    return None


def check_softmax_rows(softmax_rows):
    """Exercise 2.1: ``softmax_rows(x)`` returns the softmax of each row of a 2-D float32 x."""
    name = "Exercise 2.1 (softmax_rows)"
    cases = [(1, 1, 1.0), (5, 3, 1.0), (9, 17, 1.0), (30, 100, 1.0), (7, 100, 1e4)]
    cases += _hidden(lambda: (_size(2, 40), _size(2, 130), 1.0))
    for n_rows, n_cols, scale in cases:
        x = (torch.rand(n_rows, n_cols, device=DEVICE) * 2 - 1) * scale  # uniform in ±scale
        what = f"{name}, x of shape {(n_rows, n_cols)}"
        if scale > 1:
            what += f" with values up to ±{scale:g} (exp overflows to inf unless the row max is subtracted first)"
        got = _run_quietly(name, softmax_rows, x)
        try:
            compare(what, got, references.softmax(x.double()), rtol=1e-5, atol=1e-6, show_picture=True)
        except ExerciseError as error:
            hint = _softmax_rows_hint(got, x)
            raise ExerciseError(str(error) + (f"\n  hint: {hint}" if hint else "")) from None
    wide = torch.randn(12, 40, device=DEVICE)
    sliced = wide[:, :33]  # rows 40 elements apart in memory
    got = _run_quietly(name, softmax_rows, sliced)
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
    shapes += _hidden(lambda: (lambda n: (_size(1, 3), n, n))(_size(2, 24)))
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
    cases += _hidden(lambda: (lambda n: ((_size(1, 3), n, n), True))(_size(2, 12)))
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
    cases += _hidden(lambda: (_random_rows(6, 90) * 3, _size(1, 64), "random rows"))
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


# --------------------------------------------------------------- chapter 3: LayerNorm


def _layernorm_stats64(x, eps):
    """mean and rstd of each row of a float64 x, shapes x.shape[:-1]: the forward's saved statistics."""
    mean = x.mean(dim=-1)
    var = ((x - mean[..., None]) ** 2).mean(dim=-1)
    return mean, torch.rsqrt(var + eps)


def _without_mask_hints(error):
    """compare's hints about masks, dropped for answers written in PyTorch, which have none."""
    return "\n".join(line for line in str(error).split("\n") if "check the mask" not in line)


def _three_outputs(name, result, what):
    if not (isinstance(result, tuple) and len(result) == 3):
        raise ExerciseError(f"{name}, {what}: return a tuple (y, mean, rstd), got {type(result).__name__}")
    return result


def check_layernorm_rows(layernorm_rows):
    """Exercise 3.1: ``layernorm_rows(x, gamma, beta, eps)`` returns (y, mean, rstd) of a
    2-D float32 x, BLOCK_ROWS rows a program, mean and rstd of shape (rows,)."""
    name = "Exercise 3.1 (layernorm_rows)"
    eps = 1e-5
    cases = [(1, 1, 0.0), (5, 3, 0.0), (9, 17, 0.0), (30, 100, 0.0), (7, 100, 1e3)]
    cases += _hidden(lambda: (_size(2, 40), _size(2, 130), 0.0))
    sliced = torch.randn(12, 40, device=DEVICE)[:, :33]  # rows 40 elements apart in memory
    inputs = [(torch.randn(n_rows, n_cols, device=DEVICE), offset) for n_rows, n_cols, offset in cases]
    inputs.append((sliced, 0.0))
    for x, offset in inputs:
        n_rows, n_cols = x.shape
        what = f"x of shape {(n_rows, n_cols)}"
        rtol = atol = 1e-4
        if offset:
            signs = torch.where(torch.arange(n_rows, device=DEVICE) % 2 == 0, 1.0, -1.0)
            x = x + offset * signs[:, None]  # rows centred on +1e3 and -1e3, spread about 1
            what += (f" with rows offset by ±{offset:g} (E[x²] - E[x]² cancels catastrophically in float32 "
                     "there: subtract the mean first, then average the squares)")
            rtol = atol = 2e-3  # float32 rounding of values near 1e3, not cancellation
        if not x.is_contiguous():
            what += f", x = wide[:, :33] whose rows are {x.stride(0)} elements apart (use stride_x_row)"
        gamma = torch.randn(n_cols, device=DEVICE)
        beta = torch.randn(n_cols, device=DEVICE)
        result = _run_quietly(name, layernorm_rows, x, gamma, beta, eps)
        y, mean, rstd = _three_outputs(name, result, what)
        x64 = x.double()
        expected_mean, expected_rstd = _layernorm_stats64(x64, eps)
        expected_y = references.layernorm(x64, gamma.double(), beta.double(), eps)
        compare(f"{name}, {what}: mean (one per row; wrong indices are rows)", mean, expected_mean,
                rtol=1e-5, atol=1e-5)
        compare(f"{name}, {what}: rstd = 1/sqrt(var + eps), var biased (divide by N) "
                "(one per row; wrong indices are rows)", rstd, expected_rstd, rtol=rtol, atol=atol)
        compare(f"{name}, {what}: y", y, expected_y, rtol=rtol, atol=atol, show_picture=True)
    print(f"Exercise 3.1 passed: y, mean and rstd for {len(inputs)} shapes, widths 1 to 100, "
          "rows offset by ±1e3 and a sliced x.")


def _layernorm_dx64(x, gamma, grad_y, mean, rstd, *, with_gamma=True, reduce="mean", xhat_term=True,
                    with_rstd=True):
    """The dx formula, and the usual mistakes in it (for hints)."""
    xhat = (x - mean[..., None]) * rstd[..., None]
    g = grad_y * gamma if with_gamma else grad_y
    average = (lambda t: t.mean(dim=-1, keepdim=True)) if reduce == "mean" else (lambda t: t.sum(dim=-1, keepdim=True))
    inner = g - average(g) - (xhat * average(g * xhat) if xhat_term else 0.0)
    return inner * rstd[..., None] if with_rstd else inner


_DX_MISTAKES = [
    (dict(with_gamma=False), "multiply dy by gamma first: the formula's g is gamma * dy"),
    (dict(reduce="sum"), "the two corrections are means over the row (divide the sums by N), not sums"),
    (dict(xhat_term=False), "the term - xhat * mean(g * xhat), which comes from rstd depending on x, is missing"),
    (dict(with_rstd=False), "the whole bracket is multiplied by rstd"),
]


def check_layernorm_dx(layernorm_dx):
    """Exercise 3.2: ``layernorm_dx(x, gamma, dy, mean, rstd)`` returns dx of y = xhat * gamma + beta
    from the saved statistics (mean and rstd of shape x.shape[:-1]), without autograd."""
    name = "Exercise 3.2 (layernorm_dx)"
    eps = 1e-5
    shapes = [(3, 1), (4, 7), (2, 3, 16), (5, 100)] + _hidden(lambda: (_size(1, 6), _size(1, 120)))
    for shape in shapes:
        x = (torch.randn(shape, dtype=torch.float64) * 2 + 0.5).requires_grad_()
        gamma = torch.randn(shape[-1], dtype=torch.float64)
        grad_y = torch.randn(shape, dtype=torch.float64)
        (expected,) = torch.autograd.grad(references.layernorm(x, gamma, None, eps), x, grad_y)
        x = x.detach()
        mean, rstd = _layernorm_stats64(x, eps)
        with torch.no_grad():  # the answer must come from the formula, not from autograd
            got = run_student_code(name, layernorm_dx, x.clone(), gamma.clone(), grad_y.clone(),
                                   mean.clone(), rstd.clone())
        what = f"{name}, x of shape {shape} (mean and rstd of shape {tuple(mean.shape)})"
        try:
            compare(what, got, expected, rtol=1e-9, atol=1e-9)
        except ExerciseError as error:
            hint = None
            if isinstance(got, torch.Tensor) and got.shape == expected.shape:
                for mistake, text in _DX_MISTAKES:
                    if torch.allclose(got.detach().double(), _layernorm_dx64(x, gamma, grad_y, mean, rstd, **mistake),
                                      rtol=1e-9, atol=1e-9):
                        hint = text
                        break
            raise ExerciseError(_without_mask_hints(error) + (f"\n  hint: {hint}" if hint else "")) from None
    print("Exercise 3.2 passed: dx matches autograd's in float64 for widths 1 to 100, 2-D and 3-D x.")


def check_column_partial_sums(column_partial_sums):
    """Exercise 3.3: ``column_partial_sums(x, n_programs)`` returns the partial column sums of a
    2-D float32 x: row p sums rows p·R to min((p+1)·R, M) - 1, R = cdiv(M, n_programs)."""
    name = "Exercise 3.3 (column_partial_sums)"
    cases = [(1, 1, 1), (8, 3, 2), (37, 17, 4), (100, 100, 7), (50, 33, 50), (20, 5, 1)]
    cases += _hidden(lambda: (lambda m: (m, _size(1, 60), _size(1, m)))(_size(1, 120)))
    sliced = torch.randn(45, 40, device=DEVICE)[:, :29]
    inputs = [(torch.randn(m, n, device=DEVICE), p) for m, n, p in cases] + [(sliced, 6)]
    for x, n_programs in inputs:
        n_rows, n_cols = x.shape
        rows_per_program = -(-n_rows // n_programs)
        starts = range(0, n_rows, rows_per_program)
        what = f"{name}, x of shape {(n_rows, n_cols)}, n_programs={n_programs} ({rows_per_program} rows a program)"
        if not x.is_contiguous():
            what += f", x = wide[:, :29] whose rows are {x.stride(0)} elements apart (use stride_x_row)"
        got = run_student_code(name, column_partial_sums, x, n_programs)
        x64 = x.double()
        expected = torch.stack([x64[start:start + rows_per_program].sum(0) for start in starts])
        comparable = isinstance(got, torch.Tensor) and got.shape == expected.shape and not got.isnan().any()
        if comparable and not torch.allclose(got.detach().double().sum(0).cpu(), x64.sum(0).cpu(),
                                             rtol=1e-4, atol=1e-4):
            hint = ("\n  hint: the partial rows do not add up to x.sum(0): some rows are counted twice or not at "
                    "all. Program p must stop at its own last row, min((p + 1) * rows_per_program, n_rows), and "
                    "mask the rows of its last tile with it, not only with n_rows.")
        else:
            hint = ""
        try:
            compare(f"{what}: partial (row p is program p's sum)", got, expected, rtol=1e-5,
                    atol=1e-5 * rows_per_program ** 0.5, show_picture=True)
            compare(f"{what}: the total partial.sum(0)", got.sum(0), x64.sum(0), rtol=1e-5,
                    atol=1e-5 * n_rows ** 0.5)
        except ExerciseError as error:
            raise ExerciseError(f"{error}{hint}") from None
    print(f"Exercise 3.3 passed: {len(inputs)} shapes, from one row to ranges that end inside a tile, "
          "and a sliced x.")


def check_grad_through_row_max(grad_through_row_max):
    """Exercise 3.4: ``grad_through_row_max(x, grad_z)`` returns dL/dx for z = x / max(x) (per row)
    given grad_z = dL/dz, without autograd."""
    name = "Exercise 3.4 (grad_through_row_max)"
    random_rows = torch.randn(4, 9, dtype=torch.float64)
    negative = -torch.rand(3, 6, dtype=torch.float64) - 0.5  # every value negative: so is the maximum
    ties = torch.randn(3, 8, dtype=torch.float64)
    ties[:, [1, 5]] = ties.amax(dim=-1, keepdim=True) + 1.0  # two maxima a row
    ties[2, 7] = ties[2, 1]  # three in the last row
    cases = [(random_rows, "random rows"), (torch.randn(2, 3, 5, dtype=torch.float64), "a 3-D x"),
             (torch.rand(3, 1, dtype=torch.float64) + 0.5, "rows of one element"),
             (negative, "rows whose maximum is negative"), (ties, "rows whose maximum is tied")]
    cases += _hidden(lambda: (_random_rows(6, 30), "random rows"))
    for x, kind in cases:
        x = x.requires_grad_()
        grad_z = torch.randn(x.shape, dtype=torch.float64)
        (expected,) = torch.autograd.grad(x / x.amax(dim=-1, keepdim=True), x, grad_z)
        with torch.no_grad():
            got = run_student_code(name, grad_through_row_max, x.detach().clone(), grad_z.clone())
        what = f"{name}, x of shape {tuple(x.shape)}, {kind}"
        try:
            compare(what, got, expected, rtol=1e-9, atol=1e-9)
        except ExerciseError as error:
            x = x.detach()
            m = x.amax(dim=-1, keepdim=True)
            is_max = x == m
            if isinstance(got, torch.Tensor) and got.shape == x.shape and torch.allclose(
                    got.double()[~is_max], expected[~is_max], rtol=1e-9, atol=1e-9):
                if torch.allclose(got.double(), grad_z / m, rtol=1e-9, atol=1e-9):
                    hint = ("only the maxima are wrong: they also get dL/dm = -sum_k(grad_z_k * x_k) / m² "
                            "through the max itself")
                elif is_max.sum(dim=-1).max() > 1:
                    hint = ("only the tied maxima are wrong: like autograd, share dL/dm equally between them "
                            "(divide it by the number of maxima in the row)")
                else:
                    hint = "only the maxima are wrong: check the sign and the power of m in dL/dm"
            else:
                hint = "every element gets grad_z / m, the chain rule through the division"
            raise ExerciseError(f"{_without_mask_hints(error)}\n  hint: {hint}") from None
    print(f"Exercise 3.4 passed: {len(cases)} cases, including a negative maximum and tied maxima.")


# ------------------------------------------------------ chapter 4: coordinate descent


def _step_reference64(s, a, logk, eps):
    """a_{t+1} from a_t the reference's way, through b = -relu(s + a_t); float64, shape s.shape[:-1]."""
    b = -torch.relu(s + a[..., None])
    return eps * (logk - torch.logsumexp((s + b) / eps, dim=-1))


def _step_variant64(s, a, logk, eps, sign=-1.0, eps_outside=True, eps_inside=True):
    """The step with one of the usual mistakes, for hints."""
    inner = torch.minimum(s, sign * a[..., None])
    lse = torch.logsumexp(inner / eps if eps_inside else inner, dim=-1)
    return eps * logk - (eps * lse if eps_outside else lse)


_STEP_MISTAKES = [
    (dict(sign=1.0), "s + b = s - relu(s + a_t) = min(s, -a_t): the minimum is taken with -a_t, not a_t"),
    (dict(eps_outside=False), "a_{t+1} = eps * (log k - LSE(...)): the logsumexp is multiplied by eps too"),
    (dict(eps_inside=False), "divide min(s, -a_t) by eps inside the logsumexp"),
]


def _same(got, expected, rtol=1e-9, atol=1e-9):
    """got matches expected (a hint candidate), quietly: False for anything not comparable."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return False
    return bool(torch.allclose(got.detach().to("cpu", torch.float64), expected.cpu(), rtol=rtol, atol=atol))


def check_coor_descent_step(coor_descent_step):
    """Exercise 4.1: ``coor_descent_step(s, a, logk, eps)`` returns a_{t+1} = eps * log k - eps *
    logsumexp_j(min(s_j, -a_t) / eps) for s (..., n) and a (...) in float64."""
    name = "Exercise 4.1 (coor_descent_step)"
    random_rows = torch.randn(6, 20, dtype=torch.float64)
    nothing_clipped = torch.randn(5, 33, dtype=torch.float64)
    all_clipped = torch.randn(5, 33, dtype=torch.float64)
    large = (torch.rand(7, 100, dtype=torch.float64) * 2 - 1) * 1e3
    batched = torch.randn(2, 3, 17, dtype=torch.float64)
    one = torch.randn(4, 1, dtype=torch.float64)
    cases = [
        (random_rows, -random_rows.quantile(0.7, dim=-1), math.log(5), 0.1, "random rows, -a inside each row"),
        (one, torch.randn(4, dtype=torch.float64), math.log(0.5), 0.3, "rows of one score"),
        (nothing_clipped, -nothing_clipped.amax(dim=-1) - 1, math.log(3), 0.2,
         "-a above every score, so min(s, -a) = s"),
        (all_clipped, -all_clipped.amin(dim=-1) + 1, math.log(3), 0.2,
         "-a below every score, so min(s, -a) = -a everywhere"),
        (batched, -batched.median(dim=-1).values, math.log(4), 0.1, "s of shape (2, 3, 17), a of shape (2, 3)"),
        (large, -large.median(dim=-1).values, math.log(10), 0.01,
         "scores up to ±1e3 with eps = 0.01 (exp overflows: use torch.logsumexp, which subtracts the max)"),
    ]
    cases += _hidden(lambda: (lambda s: (s, -s.quantile(0.7, dim=-1), math.log(_size(1, s.shape[-1])), 0.1,
                                         "random rows"))(_random_rows(8, 60)))
    for s, a, logk, eps, kind in cases:
        what = f"{name}, s of shape {tuple(s.shape)}, eps = {eps:g}, {kind}"
        with torch.no_grad():  # the answer must come from the formula, not from autograd
            got = run_student_code(name, coor_descent_step, s.clone(), a.clone(), logk, eps)
        expected = _step_reference64(s, a, logk, eps)
        try:
            compare(f"{what} (one a per row; wrong indices are rows)", got, expected, rtol=1e-9, atol=1e-9)
        except ExerciseError as error:
            hint = next((text for mistake, text in _STEP_MISTAKES
                         if _same(got, _step_variant64(s, a, logk, eps, **mistake))), None)
            if hint is None and isinstance(got, torch.Tensor) and not got.isfinite().all():
                hint = "exp((...) / eps) overflowed: compute the logsumexp with torch.logsumexp"
            raise ExerciseError(str(error) + (f"\n  hint: {hint}" if hint else "")) from None
    print(f"Exercise 4.1 passed: {len(cases)} cases, -a inside, above and below the scores, "
          "batched rows and scores up to ±1e3.")


def _routing_reference64(a, s, eps, mask):
    """y = exp((s + a + b) / eps) with b = -relu(s + a), exactly 0 where mask is False."""
    shifted = s + a[..., None]
    y = torch.exp((shifted - torch.relu(shifted)) / eps)
    return y if mask is None else y.masked_fill(~mask, 0.0)


def check_routing_weights(routing_weights):
    """Exercise 4.2: ``routing_weights(a, s, eps, mask=None)`` returns y = exp(min(s + a, 0) / eps),
    exactly 0 where mask is False, for s (..., n) and a (...) in float64."""
    name = "Exercise 4.2 (routing_weights)"
    s = torch.randn(5, 12, dtype=torch.float64)
    big = torch.randn(4, 9, dtype=torch.float64)
    masked = torch.randn(6, 25, dtype=torch.float64)
    mask = torch.rand(6, 25) < 0.7
    mask[::3, 0] = True
    mask[4] = False  # a fully masked row
    large_scores = masked.masked_fill(~mask, 1e4)  # padding that looks like the best score
    nan_scores = masked.masked_fill(~mask, float("nan"))  # padding that holds anything
    batched = torch.randn(2, 3, 10, dtype=torch.float64)
    batched_mask = torch.rand(2, 3, 10) < 0.6
    cases = [
        (-s.quantile(0.7, dim=-1), s, 0.1, None, "random rows, no mask"),
        (torch.randn(3, dtype=torch.float64), torch.randn(3, 1, dtype=torch.float64), 0.5, None,
         "rows of one score, no mask"),
        (-big.amin(dim=-1) + 1, big, 0.05, None, "s + a > 0 everywhere, so y = 1 everywhere"),
        (-masked.quantile(0.7, dim=-1), large_scores, 0.1, mask, "masked scores set to 1e4"),
        (-masked.quantile(0.7, dim=-1), nan_scores, 0.1, mask,
         "masked scores set to NaN (a mask says nothing about what the scores hold there)"),
        (-batched.median(dim=-1).values, batched, 0.2, batched_mask, "s of shape (2, 3, 10), a of shape (2, 3)"),
    ]
    cases += _hidden(lambda: (lambda s: (-s.quantile(0.7, dim=-1), s, 0.1, s > s.median(),
                                         "random rows, masked"))(_random_rows(8, 60)))
    for a, s, eps, m, kind in cases:
        what = f"{name}, s of shape {tuple(s.shape)}, eps = {eps:g}, {kind}"
        with torch.no_grad():
            got = run_student_code(name, routing_weights, a.clone(), s.clone(), eps,
                                   None if m is None else m.clone())
        expected = _routing_reference64(a, s, eps, m)
        try:
            compare(what, got, expected, rtol=1e-9, atol=1e-12, show_picture=s.ndim == 2)
        except ExerciseError as error:
            hint = None
            if isinstance(got, torch.Tensor) and got.shape == expected.shape:
                got64 = got.detach().to("cpu", torch.float64)
                wrong = ~torch.isclose(got64, expected, rtol=1e-9, atol=1e-12)
                if (got64 > 1 + 1e-9).any():
                    hint = ("y = exp(min(s + a, 0) / eps) never exceeds 1: take the minimum with 0 "
                            "(that is what b = -relu(s + a) does)")
                elif m is not None and not (wrong & m).any():
                    if got64[~m].isnan().any():
                        hint = ("only masked positions are wrong, and they are NaN: the scores there may hold "
                                "anything, and NaN * 0 is NaN, so multiplying by the mask is not enough; use "
                                "torch.where(mask, y, 0.0) or y.masked_fill(~mask, 0.0)")
                    else:
                        hint = "only masked positions are wrong: y must be exactly 0 where mask is False"
            raise ExerciseError(_without_mask_hints(error) + (f"\n  hint: {hint}" if hint else "")) from None
    print(f"Exercise 4.2 passed: {len(cases)} cases, with and without masks, NaN under the mask, "
          "y clipped at 1 and batched rows.")


def _lse_of_min64(s, a, eps, pad=0, sign=-1.0, divide=True):
    """logsumexp_j(min(s_j, -a) / eps) per row in float64; pad > 0 adds lanes that loaded 0, for hints."""
    s = s.detach().to("cpu", torch.float64)
    a = a.detach().to("cpu", torch.float64)
    if pad:
        s = torch.cat([s, s.new_zeros(s.shape[0], pad)], dim=1)
    inner = torch.minimum(s, sign * a[:, None])
    return torch.logsumexp(inner / eps if divide else inner, dim=-1)


def check_row_logsumexp_of_min(row_logsumexp_of_min):
    """Exercise 4.3: ``row_logsumexp_of_min(s, a, eps)`` returns logsumexp_j(min(s_ij, -a_i) / eps)
    for each row i of a 2-D float32 s, with a of shape (rows,)."""
    name = "Exercise 4.3 (row_logsumexp_of_min)"
    inputs = []
    for n_rows, n_cols in [(4, 1), (6, 3), (5, 16), (9, 17), (7, 100)] + _hidden(lambda: (_size(1, 20), _size(1, 150))):
        s = torch.randn(n_rows, n_cols, device=DEVICE)
        inputs.append((s, -s.median(dim=-1).values, 0.1, ""))
    large = (torch.rand(7, 100, device=DEVICE) * 2 - 1) * 1e3
    inputs.append((large, -large.median(dim=-1).values, 0.01,
                   " with scores up to ±1e3 and eps = 0.01 (exp overflows unless the row max is subtracted first)"))
    below = torch.randn(5, 20, device=DEVICE)
    inputs.append((below, -below.amin(dim=-1) + 2, 0.1, " with -a below every score (min(s, -a) = -a everywhere)"))
    sliced = torch.randn(12, 40, device=DEVICE)[:, :33]
    inputs.append((sliced, -sliced.median(dim=-1).values, 0.1,
                   f", s = wide[:, :33] whose rows are {sliced.stride(0)} elements apart (use stride_s_row)"))
    for s, a, eps, kind in inputs:
        n_cols = s.shape[1]
        what = f"{name}, s of shape {tuple(s.shape)}, eps = {eps:g}{kind}"
        got = _run_quietly(name, row_logsumexp_of_min, s, a.contiguous(), eps)
        expected = _lse_of_min64(s, a, eps)
        try:
            compare(f"{what} (one value per row; wrong indices are rows)", got, expected, rtol=1e-5, atol=1e-4)
        except ExerciseError as error:
            pad = (1 << (n_cols - 1).bit_length()) - n_cols
            candidates = [
                (_lse_of_min64(s, a, eps, sign=1.0), "the minimum is taken with -a_i, not a_i"),
                (_lse_of_min64(s, a, eps, divide=False), "divide min(s, -a) by eps before the exponential"),
            ]
            if pad:
                candidates.append((_lse_of_min64(s, a, eps, pad=pad),
                                   "the lanes past the end of the row count: load them with "
                                   "other=float('-inf'), so that min(-inf, -a) = -inf and exp gives 0"))
            hint = next((text for candidate, text in candidates if _same(got, candidate, rtol=1e-5, atol=1e-4)),
                        None)
            raise ExerciseError(str(error) + (f"\n  hint: {hint}" if hint else "")) from None
    print(f"Exercise 4.3 passed: {len(inputs)} cases, widths 1 to 100, scores up to ±1e3, "
          "-a below every score and a sliced s.")


def _da_next_da64(s, a, eps):
    """d a_{t+1} / d a_t by autograd through the reference's step (log k plays no part)."""
    a = a.detach().clone().requires_grad_()
    (grad,) = torch.autograd.grad(_step_reference64(s, a, math.log(3.0), eps).sum(), a)
    return grad


def _da_variants64(s, a, eps):
    """(answer, hint) for the usual mistakes."""
    clipped = s > -a[..., None]
    p = torch.softmax(torch.minimum(s, -a[..., None]) / eps, dim=-1)
    right = (p * clipped).sum(dim=-1)
    return [
        ((p * ~clipped).sum(dim=-1), "a_t enters where the minimum takes -a_t, that is where s_j > -a_t, "
                                     "not where it takes s_j"),
        (-right, "the sign: a_{t+1} = ... - eps * LSE(min(s, -a_t) / eps), and min(s_j, -a_t) falls as a_t "
                 "rises, so the two minus signs cancel"),
        (eps * right, "no factor eps: the eps in front of the logsumexp cancels the 1/eps inside it"),
        (right / eps, "no factor 1/eps: the eps in front of the logsumexp cancels the 1/eps inside it"),
        ((torch.softmax(s / eps, dim=-1) * clipped).sum(dim=-1),
         "p is the softmax of min(s, -a_t) / eps, the terms of the logsumexp, not of s / eps"),
        (torch.ones_like(right), "the sum of all p_j is 1: only positions where the minimum takes -a_t count"),
    ]


def check_da_next_da(da_next_da):
    """Exercise 4.4: ``da_next_da(s, a, eps)`` returns d a_{t+1} / d a_t = sum_j p_j [s_j > -a_t],
    p = softmax(min(s, -a_t) / eps), for s (..., n) and a (...) in float64, without autograd."""
    name = "Exercise 4.4 (da_next_da)"
    random_rows = torch.randn(6, 20, dtype=torch.float64)
    smooth = torch.randn(4, 30, dtype=torch.float64)
    edges = torch.randn(4, 15, dtype=torch.float64)
    batched = torch.randn(2, 3, 17, dtype=torch.float64)
    one = torch.randn(4, 1, dtype=torch.float64)
    cases = [
        (random_rows, -random_rows.quantile(0.6, dim=-1), 0.1, "random rows, -a inside each row"),
        (smooth, -smooth.quantile(0.8, dim=-1), 0.7, "a large eps"),
        (edges, torch.cat([-edges[:2].amin(dim=-1) + 1, -edges[2:].amax(dim=-1) - 1]), 0.1,
         "-a below every score (rows 0-1) and above every score (rows 2-3)"),
        (one, torch.tensor([-1.0, 1.0, -1.0, 1.0], dtype=torch.float64) - one[:, 0], 0.3, "rows of one score"),
        (batched, -batched.median(dim=-1).values, 0.2, "s of shape (2, 3, 17), a of shape (2, 3)"),
    ]
    cases += _hidden(lambda: (lambda s: (s, -s.quantile(0.6, dim=-1), 0.1, "random rows"))(_random_rows(8, 60)))
    for s, a, eps, kind in cases:
        what = f"{name}, s of shape {tuple(s.shape)}, eps = {eps:g}, {kind}"
        with torch.no_grad():  # the answer must come from the formula, not from autograd
            got = run_student_code(name, da_next_da, s.clone(), a.clone(), eps)
        expected = _da_next_da64(s, a, eps)
        try:
            compare(f"{what} (one derivative per row; wrong indices are rows)", got, expected,
                    rtol=1e-9, atol=1e-12)
        except ExerciseError as error:
            hint = next((text for candidate, text in _da_variants64(s, a, eps) if _same(got, candidate)), None)
            raise ExerciseError(str(error) + (f"\n  hint: {hint}" if hint else "")) from None
    print(f"Exercise 4.4 passed: {len(cases)} cases, -a inside, below and above the scores, "
          "a large eps and batched rows.")


# ---------------------------------------------------- chapter 5: from kernel to layer


def _require_custom_op(name, op):
    if not isinstance(op, torch._library.custom_ops.CustomOpDef):
        raise ExerciseError(f"{name}: pass the operator that @torch.library.custom_op made, got {type(op).__name__}")


def _opcheck(name, op, args, what):
    """torch.library.opcheck, its failure told as which of its tests failed and why."""
    try:
        torch.library.opcheck(op, args)
    except torch.testing._internal.optests.OpCheckError as error:
        first_line = str(error).strip().splitlines()[0]
        raise ExerciseError(f"{name}: torch.library.opcheck failed {what}: {first_line}") from error


def check_scale_columns_op(scale_columns_op):
    """Exercise 5.1: a custom operator out = x * w[None, :] with a fake implementation."""
    name = "Exercise 5.1 (scale_columns_op)"
    _require_custom_op(name, scale_columns_op)
    cases = [(1, 1), (5, 3), (37, 130)] + _hidden(lambda: (_size(2, 60), _size(2, 150)))
    for shape in cases:
        x = torch.randn(shape, device=DEVICE)
        w = torch.randn(shape[1], device=DEVICE)
        got = run_student_code(name, scale_columns_op, x, w)
        compare(f"{name}, x of shape {shape}", got, x.double() * w.double(), rtol=1e-6, atol=1e-6)
    from torch._subclasses.fake_tensor import FakeTensorMode

    real = run_student_code(name, scale_columns_op, torch.randn(6, 7, device=DEVICE), torch.randn(7, device=DEVICE))
    with FakeTensorMode() as mode:
        x, w = mode.from_tensor(torch.randn(6, 7, device=DEVICE)), mode.from_tensor(torch.randn(7, device=DEVICE))
        try:
            fake = scale_columns_op(x, w)
        except Exception as error:  # no fake registered, or one that fails
            raise ExerciseError(f"{name}: on fake tensors (what torch.compile traces with) the operator raised "
                                f"{type(error).__name__}: register a fake implementation with "
                                "@scale_columns_op.register_fake") from error
        if not isinstance(fake, torch.Tensor) or (fake.shape, fake.dtype, fake.device) != (x.shape, x.dtype, x.device):
            got = (tuple(fake.shape), fake.dtype, fake.device) if isinstance(fake, torch.Tensor) else fake
            raise ExerciseError(f"{name}: the fake implementation must return an empty tensor like the real "
                                f"output, shape {tuple(x.shape)}, {x.dtype}, on {x.device}; got {got}")
        # Checked here too: opcheck before torch 2.12 lets a fake with other strides through.
        if fake.stride() != real.stride():
            raise ExerciseError(f"{name}: the fake implementation's output has strides {fake.stride()}, the real "
                                f"one's {real.stride()} (shape {tuple(x.shape)}): compiled code would read the "
                                "real output laid out as the fake says; give both the same layout")
    x = torch.randn(9, 5, device=DEVICE)
    _opcheck(name, scale_columns_op, (x, torch.randn(5, device=DEVICE)), "on x of shape (9, 5)")
    print(f"Exercise 5.1 passed: {len(cases)} shapes, the fake implementation's shapes, and every opcheck test.")


def check_scale_columns_autograd(scale_columns_op):
    """Exercise 5.2: the operator of 5.2 with autograd registered: grads of x and w."""
    name = "Exercise 5.2 (scale_columns_trainable)"
    _require_custom_op(name, scale_columns_op)
    for shape in [(1, 1), (4, 3), (33, 17)] + _hidden(lambda: (_size(2, 40), _size(2, 40))):
        x = torch.randn(shape, device=DEVICE, requires_grad=True)
        w = torch.randn(shape[1], device=DEVICE, requires_grad=True)
        grad_out = torch.randn(shape, device=DEVICE)
        out = run_student_code(name, scale_columns_op, x, w)
        if not out.requires_grad:
            raise ExerciseError(f"{name}: the output does not require grad; register the backward with "
                                "scale_columns_op.register_autograd(backward, setup_context=setup_context)")
        run_student_code(name, out.backward, grad_out)
        x64, w64 = x.detach().double(), w.detach().double()
        for what, got, expected in (("grad of x", x.grad, grad_out.double() * w64),
                                    ("grad of w", w.grad, (grad_out.double() * x64).sum(0))):
            if got is None:
                raise ExerciseError(f"{name}: the {what} is None for x of shape {shape}: backward must return "
                                    "(grad_x, grad_w), one gradient for each input")
            compare(f"{name}: the {what} for x of shape {shape}", got, expected, rtol=1e-5, atol=1e-5 * shape[0])
    x = torch.randn(6, 4, device=DEVICE, requires_grad=True)
    _opcheck(name, scale_columns_op, (x, torch.randn(4, device=DEVICE, requires_grad=True)), "with inputs that need grad")
    print("Exercise 5.2 passed: the grads of x and w for 3 shapes, and opcheck's autograd tests.")


def check_without_graph_breaks(peak_scaled_softmax):
    """Exercise 5.3: softmax(x / max(max|x|, 1)) over the last dimension, traced in one graph."""
    import logging

    name = "Exercise 5.3 (peak_scaled_softmax)"
    torch._dynamo.reset()
    for shape in [(1, 1), (4, 7), (3, 5, 33)] + _hidden(lambda: (_size(1, 5), _size(1, 40))):
        x = torch.randn(shape, device=DEVICE) * 3
        x64 = x.double()
        expected = torch.softmax(x64 / x64.abs().max().clamp(min=1.0), dim=-1)
        compare(f"{name}, x of shape {shape}", run_student_code(name, peak_scaled_softmax, x), expected,
                rtol=1e-5, atol=1e-6)
    small = torch.rand(4, 7, device=DEVICE) * 0.5  # max |x| below 1: divided by 1
    compare(f"{name}, x with every |x| < 1", run_student_code(name, peak_scaled_softmax, small),
            torch.softmax(small.double(), dim=-1), rtol=1e-5, atol=1e-6)
    dynamo_log = logging.getLogger("torch._dynamo")
    level = dynamo_log.level
    dynamo_log.setLevel(logging.ERROR)  # the breaks are reported below, once
    try:
        explanation = run_student_code(name, torch._dynamo.explain(peak_scaled_softmax), torch.randn(8, 16, device=DEVICE))
    finally:
        dynamo_log.setLevel(level)
        torch._dynamo.reset()
    if explanation.graph_break_count:
        reasons = "; ".join(str(b.reason).strip().splitlines()[0] for b in explanation.break_reasons)
        raise ExerciseError(f"{name}: torch.compile still breaks the graph {explanation.graph_break_count} time(s): "
                            f"{reasons}")
    print("Exercise 5.3 passed: the values of 4 inputs, and torch._dynamo.explain finds one graph, no break.")


# ------------------------------------------------------------ chapter 6: routed block


def _scatter_reference(routed, indices, seq_len):
    """A loop a reader can check by eye: token r of row b goes to position indices[b, r]."""
    out = torch.zeros(routed.shape[0], seq_len, routed.shape[-1], dtype=torch.float64, device=routed.device)
    for b in range(routed.shape[0]):
        for r in range(indices.shape[1]):
            out[b, indices[b, r]] = routed[b, r].double()
    return out


def check_scatter_back(scatter_back):
    """Exercise 6.1: ``scatter_back(routed, indices, seq_len)`` puts the routed tokens
    (b, k, d) back at their positions indices (b, k) of a (b, seq_len, d) of zeros,
    differentiably."""
    name = "Exercise 6.1 (scatter_back)"
    hidden = _hidden(lambda: (lambda n: (_size(1, 3), n, _size(1, n), _size(1, 9)))(_size(2, 24)))
    for batch, seq_len, k, dim in [(1, 5, 2, 3), (3, 11, 4, 8), (2, 16, 16, 5)] + hidden:
        what = f"{name}, {batch} sequences of {seq_len} tokens, {k} routed, dim {dim}"
        indices = torch.rand(batch, seq_len, device=DEVICE).topk(k, dim=-1).indices  # distinct, in no order
        routed = torch.randn(batch, k, dim, device=DEVICE, requires_grad=True)
        got = run_student_code(name, scatter_back, routed, indices, seq_len)
        expected = _scatter_reference(routed.detach(), indices, seq_len)
        if isinstance(got, torch.Tensor) and got.shape == expected.shape and not torch.equal(got.detach().double(), expected):
            one_batch = _scatter_reference(routed.detach()[:1].expand_as(routed), indices[:1].expand_as(indices), seq_len)
            if batch > 1 and torch.equal(got.detach().double(), one_batch):
                raise ExerciseError(f"{what}: every sequence received the first sequence's tokens; the indices of "
                                    "row b place the tokens of row b (index along dim 1, batch by batch)")
            unrouted = expected.abs().sum(-1) == 0
            if got.detach()[unrouted].abs().max() > 0:
                raise ExerciseError(f"{what}: positions the router did not pick are not zero; start from zeros "
                                    "and write only the k routed positions")
        compare(what, got, expected, rtol=0, atol=0)
        if not got.requires_grad:
            raise ExerciseError(f"{what}: the result does not require grad: gradients could not reach the heavy "
                                "branch. Use an out-of-place operation (Tensor.scatter), not .data or a loop over .item()")
        grad_out = torch.randn(batch, seq_len, dim, device=DEVICE)
        (grad_routed,) = torch.autograd.grad(got, routed, grad_out)
        compare(f"{what}: the gradient of routed", grad_routed, grad_out.gather(1, indices[..., None].expand(-1, -1, dim)),
                rtol=0, atol=0)
    print("Exercise 6.1 passed: 3 shapes, values and gradients.")


def check_routed_causal_mask(routed_causal_mask):
    """Exercise 6.2: ``routed_causal_mask(positions)`` for routed positions (b, k), in
    the router's order (not sorted), returns the (b, k, k) bool mask, True where routed
    query i must not see routed key j: the key stands later in the sequence."""
    name = "Exercise 6.2 (routed_causal_mask)"
    hidden = _hidden(lambda: (lambda n: (_size(1, 3), n, _size(1, n)))(_size(2, 24)))
    for batch, seq_len, k in [(1, 6, 3), (3, 20, 7), (2, 9, 9)] + hidden:
        what = f"{name}, {batch} sequences of {seq_len} tokens, {k} routed"
        positions = torch.rand(batch, seq_len, device=DEVICE).topk(k, dim=-1).indices
        steps = positions.diff(dim=-1)
        monotonic = (steps > 0).all(-1) | (steps < 0).all(-1)
        if k > 2:  # else a transposed mask and one by place in the list could be the same: swap two
            positions[monotonic, :2] = positions[monotonic, :2].flip(-1)
        got = run_student_code(name, routed_causal_mask, positions)
        if not isinstance(got, torch.Tensor) or got.dtype != torch.bool:
            raise ExerciseError(f"{what}: expected a torch.bool tensor (a comparison gives one), got "
                                f"{got.dtype if isinstance(got, torch.Tensor) else type(got).__name__}")
        expected = positions[:, None, :] > positions[:, :, None]
        if got.shape == expected.shape and not torch.equal(got, expected):
            order_mask = references.causal_mask(k, DEVICE).expand_as(expected)
            hint = None
            if torch.equal(got, order_mask):
                hint = ("this is the causal mask of the routed tokens' places in the list, but a top-k lists them "
                        "by score, not by position: compare the positions themselves")
            elif torch.equal(got, expected.transpose(1, 2)):
                hint = "the mask is transposed: row i is the query, column j the key"
            elif torch.equal(got, expected | torch.eye(k, dtype=torch.bool, device=DEVICE)):
                hint = "a routed query must see itself: hide keys strictly later (>), not later or equal"
            elif torch.equal(got, ~expected):
                hint = "True and False are swapped: True marks the keys to hide"
            if hint:
                raise ExerciseError(f"{what}: wrong mask\n  hint: {hint}")
        compare(what, got.to(torch.float64) if isinstance(got, torch.Tensor) else got, expected.to(torch.float64),
                rtol=0, atol=0)
    print("Exercise 6.2 passed: 3 shapes, positions in the router's order.")


def check_route(route):
    """Exercise 6.3: ``route(s, mask, num_tokens)`` returns (indices, weights) of the
    routed tokens as CoordinateDescentRouter picks them from scores s (b, n) with the
    padding mask (b, n): coordinate descent with the mask, the top num_tokens, the
    straight-through weights, 0 on padding."""
    from . import routed as routed_block

    name = "Exercise 6.3 (route)"
    hidden = _hidden(lambda: (lambda n: (_size(2, 3), n, _size(1, n), _size(0, n - 1)))(_size(4, 24)))
    for batch, seq_len, k, n_padded in [(2, 12, 4, 3), (3, 20, 6, 8), (2, 8, 6, 4)] + hidden:
        what = f"{name}, {batch} sequences of {seq_len} tokens, {n_padded} padded at the end of the last, {k} routed"
        s = torch.randn(batch, seq_len, device=DEVICE, requires_grad=True)
        mask = torch.ones(batch, seq_len, dtype=torch.bool, device=DEVICE)
        mask[-1, seq_len - n_padded:] = False
        result = run_student_code(name, route, s, mask, k)
        if not isinstance(result, tuple) or len(result) != 2:
            raise ExerciseError(f"{what}: return a tuple (indices, weights)")
        indices, weights = result
        s64 = s.detach().double().requires_grad_()
        expected_indices, expected_weights, _ = routed_block.top_k_routing(s64, k, mask, ops=routed_block.REFERENCE_OPS)
        if not isinstance(indices, torch.Tensor) or indices.shape != expected_indices.shape:
            raise ExerciseError(f"{what}: indices should be a ({batch}, {k}) tensor, got "
                                f"{tuple(indices.shape) if isinstance(indices, torch.Tensor) else type(indices).__name__}")
        picked, expected_picked = indices.sort(dim=-1), expected_indices.sort(dim=-1)
        for b in range(batch):
            # Padded tokens fill a sequence shorter than k; which of them is a tie (weight 0).
            real, expected_real = (p[mask[b].gather(0, p)].tolist() for p in (picked.values[b], expected_picked.values[b]))
            if real != expected_real:
                hint = ""
                if len(real) < len(expected_real):
                    hint = ("\n  hint: padding was routed in place of real tokens; pass mask to coor_descent so "
                            "padded scores take no part")
                raise ExerciseError(f"{what}: sequence {b} routes the real positions {real}, "
                                    f"expected {expected_real}{hint}")
        got = weights.gather(1, picked.indices)
        expected = expected_weights.gather(1, expected_picked.indices)
        padded_weights = got.detach()[~mask.gather(1, picked.values)]
        if padded_weights.numel() and padded_weights.abs().max() > 0:
            raise ExerciseError(f"{what}: a padded token routed to fill a short sequence has weight "
                                f"{padded_weights.abs().max().item():.3g}; its weight must be 0 (mask it after the "
                                "straight-through step)")
        compare(f"{what}: the weights", got, expected, rtol=1e-5, atol=1e-5)
        if not weights.requires_grad:
            raise ExerciseError(f"{what}: the weights do not require grad: the router could not learn. Straight-"
                                "through keeps the gradient: weights + (1 - weights).detach()")
        grad_weights = torch.randn(batch, k, device=DEVICE)
        (grad_s,) = torch.autograd.grad(got, s, grad_weights)
        (expected_grad_s,) = torch.autograd.grad(expected, s64, grad_weights.double())
        try:
            compare(f"{what}: the gradient of s", grad_s, expected_grad_s, rtol=1e-3, atol=1e-3)
        except ExerciseError as error:
            # Routing without the mask may pick the same tokens (straight-through weights are all 1),
            # but padding then competes in coordinate descent and the gradient shows it.
            unmasked_s = s.detach().double().requires_grad_()
            unmasked_indices, unmasked, _ = routed_block.top_k_routing(unmasked_s, k, None,
                                                                       ops=routed_block.REFERENCE_OPS)
            unmasked = unmasked.masked_fill(~mask.gather(1, unmasked_indices), 0.0)
            unmasked = unmasked.gather(1, unmasked_indices.sort(dim=-1).indices)
            (unmasked_grad,) = torch.autograd.grad(unmasked, unmasked_s, grad_weights.double())
            hint = ("\n  hint: this is the gradient of routing without the mask: padding took part in coordinate "
                    "descent. Pass mask to coor_descent" if _same(grad_s, unmasked_grad, rtol=1e-3, atol=1e-3) else "")
            raise ExerciseError(f"{error}{hint}") from None
    print("Exercise 6.3 passed: 3 shapes with padding, the routed positions, their weights and the gradient of s.")
