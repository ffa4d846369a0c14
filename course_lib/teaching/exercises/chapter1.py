"""Checkers of chapter 1, weighted sum: one function an exercise."""

import torch

from ...core import references
from ...core.runtime import DEVICE
from ..checking import ExerciseError, compare, refusing_calls, run_student_code
from .common import hidden_case, random_size


def check_scale_columns(scale_columns):
    """Exercise 1.1: ``scale_columns(x, w)`` returns x * w[None, :] for a 2-D x."""
    name = "Exercise 1.1 (scale_columns)"
    cases = [(1, 1), (5, 3), (37, 130), (64, 64)] + hidden_case(lambda: (random_size(2, 80), random_size(2, 200)))
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
    for shape in [(3,), (4, 5), (2, 3, 7)] + hidden_case(lambda: (random_size(1, 5), random_size(1, 9), random_size(1, 40))):
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
    cases = [(1, 1), (7, 5), (300, 129), (1000, 3)] + hidden_case(lambda: (random_size(2, 600), random_size(1, 200)))
    for shape in cases:
        partial = torch.randn(shape, device=DEVICE)
        got = run_student_code(name, column_sum, partial)
        compare(f"{name}, partial of shape {shape}", got, partial.double().sum(0),
                rtol=1e-5, atol=1e-5 * shape[0] ** 0.5)
    print(f"Exercise 1.3 passed: {len(cases)} shapes, from a single element to 1000 rows.")
