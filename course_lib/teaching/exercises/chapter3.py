"""Checkers of chapter 3, LayerNorm: one function an exercise."""

import torch

from ...core import references
from ...core.runtime import DEVICE
from ..checking import ExerciseError, compare, run_student_code
from .common import Exercise, hidden_case, random_size, random_matrix, run_quietly, without_mask_hints

__all__ = ["check_layernorm_rows", "check_layernorm_dx", "check_column_partial_sums", "check_grad_through_row_max"]
# The chapter's exercises, in order, for the instructors' notes.
EXERCISES = (
    Exercise('3.1', 'several rows a program, with the statistics', 'check_layernorm_rows', kernel=True, skills='two row reductions, saved statistics', difficulty=3, minutes=30),
    Exercise('3.2', 'the gradient of x in PyTorch', 'check_layernorm_dx', kernel=False, skills='the LayerNorm backward', difficulty=2, minutes=20),
    Exercise('3.3', 'partial column sums, the first stage', 'check_column_partial_sums', kernel=True, skills='per-program partial sums', difficulty=2, minutes=20),
    Exercise('3.4', 'the gradient through the row maximum', 'check_grad_through_row_max', kernel=False, skills='gradients through max', difficulty=2, minutes=15),
)



def _layernorm_stats64(x, eps):
    """mean and rstd of each row of a float64 x, shapes x.shape[:-1]: the forward's saved statistics."""
    mean = x.mean(dim=-1)
    var = ((x - mean[..., None]) ** 2).mean(dim=-1)
    return mean, torch.rsqrt(var + eps)


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
    cases += hidden_case(lambda: (random_size(2, 40), random_size(2, 130), 0.0))
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
        result = run_quietly(name, layernorm_rows, x, gamma, beta, eps)
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
    shapes = [(3, 1), (4, 7), (2, 3, 16), (5, 100)] + hidden_case(lambda: (random_size(1, 6), random_size(1, 120)))
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
            raise ExerciseError(without_mask_hints(error) + (f"\n  hint: {hint}" if hint else "")) from None
    print("Exercise 3.2 passed: dx matches autograd's in float64 for widths 1 to 100, 2-D and 3-D x.")


def check_column_partial_sums(column_partial_sums):
    """Exercise 3.3: ``column_partial_sums(x, n_programs)`` returns the partial column sums of a
    2-D float32 x: row p sums rows p·R to min((p+1)·R, M) - 1, R = cdiv(M, n_programs)."""
    name = "Exercise 3.3 (column_partial_sums)"
    cases = [(1, 1, 1), (8, 3, 2), (37, 17, 4), (100, 100, 7), (50, 33, 50), (20, 5, 1)]
    cases += hidden_case(lambda: (lambda m: (m, random_size(1, 60), random_size(1, m)))(random_size(1, 120)))
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
    cases += hidden_case(lambda: (random_matrix(6, 30), "random rows"))
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
            raise ExerciseError(f"{without_mask_hints(error)}\n  hint: {hint}") from None
    print(f"Exercise 3.4 passed: {len(cases)} cases, including a negative maximum and tied maxima.")
