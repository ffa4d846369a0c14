"""Exercise 3.2's checker: the gradient of x in PyTorch, from the saved statistics. Its
formula in float64 (:func:`_layernorm_dx64`) is exercise 3.4's reference too."""

import torch

from ....core import references
from ...checking import ExerciseError, compare, run_student_code, without_autograd
from ..chapter1 import python_error_in_words
from ..common import hidden_case, matches, random_size, say, without_mask_hints
from .shared import EPS, _layernorm_stats64


def _layernorm_dx64(x, gamma, grad_y, mean, rstd, *, with_gamma=True, reduce="mean", xhat_term=True,
                    mean_term=True, with_rstd=True, xhat=None, divisor=None):
    """The dx formula, and the usual mistakes in it (for hints). ``divisor`` replaces N in the means."""
    if xhat is None:
        xhat = (x - mean[..., None]) * rstd[..., None]
    g = grad_y * gamma if with_gamma else grad_y
    if divisor is not None:
        average = lambda t: t.sum(dim=-1, keepdim=True) / divisor  # noqa: E731
    elif reduce == "mean":
        average = lambda t: t.mean(dim=-1, keepdim=True)  # noqa: E731
    else:
        average = lambda t: t.sum(dim=-1, keepdim=True)  # noqa: E731
    inner = g - (average(g) if mean_term else 0.0) - (xhat * average(g * xhat) if xhat_term else 0.0)
    return inner * rstd[..., None] if with_rstd else inner


_DX_MISTAKES = [
    (dict(with_gamma=False), "multiply dy by gamma first: the formula's g is gamma * dy"),
    (dict(reduce="sum"), "the two corrections are means over the row (divide the sums by N), not sums"),
    (dict(xhat_term=False), "the term - xhat * mean(g * xhat), which comes from rstd depending on x, is missing"),
    (dict(mean_term=False), "the term - mean(g), which comes from the mean depending on x, is missing"),
    (dict(with_rstd=False), "the whole bracket is multiplied by rstd"),
]


def check_layernorm_dx(layernorm_dx):
    """Exercise 3.2: ``layernorm_dx(x, gamma, dy, mean, rstd)`` returns dx of y = xhat * gamma + beta
    from the saved statistics (mean and rstd of shape x.shape[:-1]), without autograd."""
    name = "Exercise 3.2 (layernorm_dx)"
    shapes = [(3, 1), (4, 7), (2, 3, 16), (5, 100)] + hidden_case(lambda: (random_size(1, 6), random_size(1, 120)))
    for shape in shapes:
        x = (torch.randn(shape, dtype=torch.float64) * 2 + 0.5).requires_grad_()
        gamma = torch.randn(shape[-1], dtype=torch.float64)
        grad_y = torch.randn(shape, dtype=torch.float64)
        (expected,) = torch.autograd.grad(references.layernorm(x, gamma, None, EPS), x, grad_y)
        x = x.detach()
        mean, rstd = _layernorm_stats64(x, EPS)
        try:
            with without_autograd(name):  # the answer must come from the formula, not from autograd
                got = run_student_code(name, layernorm_dx, x.clone(), gamma.clone(), grad_y.clone(),
                                       mean.clone(), rstd.clone())
        except ExerciseError as error:
            raise python_error_in_words(
                name, error,
                "the exercise asks for dx from the formula, not from autograd: the checker calls your function "
                "under torch.no_grad, so no graph is recorded and torch.autograd.grad or .backward() has nothing "
                "to differentiate (switching grad back on is refused too). Compute dx from x, gamma, dy and the "
                "saved mean and rstd with tensor operations",
                f"this call had x and dy of shape {shape}, gamma of shape {tuple(gamma.shape)}, mean and rstd of "
                f"shape {tuple(mean.shape)} (one value a row): x may be 2-D or 3-D, so take the row means over "
                "the last axis (dim=-1, keepdim=True) and give mean and rstd a last axis of 1 before they meet "
                "a row") from None
        what = f"{name}, x of shape {shape} (mean and rstd of shape {tuple(mean.shape)})"
        try:
            compare(what, got, expected, rtol=1e-9, atol=1e-9)
        except ExerciseError as error:
            hint = next((text for mistake, text in _DX_MISTAKES
                         if matches(got, _layernorm_dx64(x, gamma, grad_y, mean, rstd, **mistake))), None)
            if hint is None and isinstance(got, torch.Tensor) and tuple(got.shape) != tuple(expected.shape):
                hint = ("dx has x's shape: mean and rstd have one value a row (shape x.shape[:-1]); give them a "
                        "last axis of 1 (mean[..., None]) before they meet a row, so that they broadcast along "
                        "it and not across the rows")
            raise ExerciseError(without_mask_hints(error) + (f"\n  hint: {hint}" if hint else "")) from None
    say("Exercise 3.2 passed: dx matches autograd's in float64 for widths 1 to 100, 2-D and 3-D x.")
