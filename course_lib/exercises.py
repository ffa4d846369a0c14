"""One checker per exercise. Each runs the student's code on fresh random inputs of
several shapes, compares with the references, prints one line starting
``Exercise N.M passed`` or raises :class:`~course_lib.checking.ExerciseError`
saying what is wrong and where.
"""

import torch

from . import references
from .checking import ExerciseError, compare, run_student_code
from .runtime import DEVICE

# ------------------------------------------------------------- chapter 1: weighted sum


def check_scale_columns(scale_columns):
    """Exercise 1.1: ``scale_columns(x, w)`` returns x * w[None, :] for a 2-D x."""
    name = "Exercise 1.1 (scale_columns)"
    cases = [(1, 1), (5, 3), (37, 130), (64, 64)]
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
    for shape in [(3,), (4, 5), (2, 3, 7)]:
        x = torch.randn(shape, dtype=torch.float64)
        w = torch.randn(shape[-1], dtype=torch.float64)
        grad_y = torch.randn(shape[:-1], dtype=torch.float64)
        with torch.no_grad():  # the answer must come from the formulas, not from autograd
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
    cases = [(1, 1), (7, 5), (300, 129), (1000, 3)]
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


def check_softmax_rows(softmax_rows):
    """Exercise 2.1: ``softmax_rows(x)`` returns the softmax of each row of a 2-D float32 x."""
    name = "Exercise 2.1 (softmax_rows)"
    cases = [(1, 1, 1.0), (5, 3, 1.0), (9, 17, 1.0), (30, 100, 1.0), (7, 100, 1e4)]
    for n_rows, n_cols, scale in cases:
        x = (torch.rand(n_rows, n_cols, device=DEVICE) * 2 - 1) * scale  # uniform in ±scale
        what = f"{name}, x of shape {(n_rows, n_cols)}"
        if scale > 1:
            what += f" with values up to ±{scale:g} (exp overflows to inf unless the row max is subtracted first)"
        got = _run_quietly(name, softmax_rows, x)
        compare(what, got, references.softmax(x.double()), rtol=1e-5, atol=1e-6, show_picture=True)
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
    for shape, causal in cases:
        x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
        y = references.causal_softmax(x) if causal else references.softmax(x)
        grad_y = torch.randn(shape, dtype=torch.float64)
        (expected,) = torch.autograd.grad(y, x, grad_y)
        with torch.no_grad():  # the answer must come from the formula, not from autograd
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
    shapes = [(3, 1), (4, 7), (2, 3, 16), (5, 100)]
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
