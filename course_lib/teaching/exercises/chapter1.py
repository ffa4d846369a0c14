"""Checkers of chapter 1, weighted sum: one function an exercise."""


import torch
import triton

from ...core import references
from ...core.runtime import DEVICE, ON_GPU
from ..checking import ExerciseError, compare, run_student_code, without_autograd
from ..student_kernels import kernel_runs, report_speed, require_kernel, run_interpreted
from .common import Exercise, beyond_cases_runs, hidden_case, matches, random_fill, random_size, say

__all__ = ["launch_scale_columns", "check_scale_columns", "check_weighted_sum_grads", "launch_column_sum",
           "check_column_sum"]
# The chapter's exercises, in order, for the instructors' notes.
EXERCISES = (
    Exercise('1.1', 'scale the columns', 'check_scale_columns', kernel=True, skills='2-D tiles, masks on both axes, strides', difficulty=2, minutes=20),
    Exercise('1.2', 'the gradients in PyTorch', 'check_weighted_sum_grads', kernel=False, skills='a backward derived by hand', difficulty=1, minutes=10),
    Exercise('1.3', 'the second stage of grad_w', 'check_column_sum', kernel=True, skills='a loop down the rows carrying an accumulator, masks and other= on the last tile, strides', difficulty=2, minutes=25),
)



def launch_scale_columns(scale_columns_kernel, x, w, out=None, block_rows=16, block_cols=32):
    """How exercise 1.1's checker launches the kernel: one program a tile of
    ``block_rows × block_cols``; ``out`` contiguous, filled with NaN when not given."""
    if out is None:
        out = torch.full(x.shape, float("nan"), device=x.device, dtype=x.dtype)
    grid = (triton.cdiv(x.shape[0], block_rows), triton.cdiv(x.shape[1], block_cols))
    scale_columns_kernel[grid](x, w, out, x.shape[0], x.shape[1], x.stride(0), x.stride(1), out.stride(0),
                               BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols)
    return out


def check_scale_columns(scale_columns_kernel):
    """Exercise 1.1: ``scale_columns_kernel``, launched by :func:`launch_scale_columns`,
    writes x * w[None, :] for a 2-D x of any shape and strides."""
    name = "Exercise 1.1 (scale_columns_kernel)"
    kernel = require_kernel(name, scale_columns_kernel, "scale_columns_kernel")
    cases = [(1, 1), (5, 3), (37, 130), (64, 64)] + hidden_case(lambda: (random_size(2, 80), random_size(2, 200)))
    inputs = [(f"x of shape {shape}", torch.randn(shape, device=DEVICE)) for shape in cases]
    transposed = torch.randn(40, 23, device=DEVICE).t()
    inputs.append((f"transposed x (strides {transposed.stride()})", transposed))
    for what, x in inputs:
        w = torch.randn(x.shape[1], device=DEVICE)
        for how, got in kernel_runs(name, launch_scale_columns, kernel, x, w):
            compare(f"{name}, {what}" + (f", {how}" if how else ""), got, x.double() * w.double(),
                    rtol=1e-6, atol=1e-6, show_picture=True)
    # past the listed cases (not counted in the line below): more rows and columns than any of them,
    # non-multiples of every block, and outputs filled beforehand with values a kernel cannot tell apart
    for what, x in [("x of shape (4099, 3), more rows than any case above", torch.randn(4099, 3, device=DEVICE)),
                    ("x of shape (3, 8195), more columns than any case above", torch.randn(3, 8195, device=DEVICE)),
                    ("transposed x of shape (5, 1031)", torch.randn(1031, 5, device=DEVICE).t())]:
        w = torch.randn(x.shape[1], device=DEVICE)
        expected = x.double() * w.double()
        beyond_cases_runs(name, what, launch_scale_columns, kernel, (x, w),
                          lambda label, got: compare(label, got, expected, rtol=1e-6, atol=1e-6),
                          lambda: random_fill(x.shape, DEVICE))
    say(f"{name.split(' (')[0]} passed: {len(inputs)} shapes, including a transposed x.")
    x = torch.randn(8192, 4096, device=DEVICE) if ON_GPU else None
    w, out = (torch.randn(4096, device=DEVICE), torch.empty_like(x)) if x is not None else (None, None)
    report_speed(name, lambda: launch_scale_columns(kernel, x, w, out, 32, 128), 2 * 8192 * 4096 * 4,
                 against=("torch's x * w", lambda: torch.mul(x, w, out=out)),
                 advice="check that each program's columns are contiguous in memory (the column index times "
                        "stride_x_col, which is 1 for a row-major x), so that loads combine into wide vectors")


AUTOGRAD_ERRORS = ("does not require grad", "does not have a grad_fn", "One of the differentiated Tensors",
                   "can't retain_grad", "grad can be implicitly created only")
AXIS_ERRORS = ("Dimension out of range", "must match the size of tensor", "shape mismatch", "shapes cannot be",
               "mat1 and mat2 shapes", "size mismatch", "dimension specified as", "Expected size")


def python_error_in_words(name, error, autograd_words, axis_words):
    """An ExerciseError from run_student_code with the student's Python error said in the
    exercise's words: autograd called under the checker's torch.no_grad, or a reduction or
    broadcast over an axis x does not have. Returns ``error`` itself when neither fits."""
    cause = error.__cause__
    text = str(cause) if cause is not None else ""
    if any(marker in text for marker in AUTOGRAD_ERRORS):
        words = autograd_words
    elif isinstance(cause, (IndexError, RuntimeError, ValueError)) and any(marker in text for marker in AXIS_ERRORS):
        words = axis_words
    else:
        return error
    said = str(error)
    said = said[len(name) + 2:] if said.startswith(name + ": ") else said
    return ExerciseError(f"{name}: {words}.\n  (Python's error: {said})")


def check_weighted_sum_grads(weighted_sum_grads):
    """Exercise 1.2: ``weighted_sum_grads(x, w, grad_y)`` returns (grad_x, grad_w) without autograd."""
    name = "Exercise 1.2 (weighted_sum_grads)"
    for shape in [(3,), (4, 5), (2, 3, 7)] + hidden_case(lambda: (random_size(1, 5), random_size(1, 9), random_size(1, 40))):
        x = torch.randn(shape, dtype=torch.float64)
        w = torch.randn(shape[-1], dtype=torch.float64)
        grad_y = torch.randn(shape[:-1], dtype=torch.float64)
        # the answer must come from the formulas, not from autograd or the reference
        try:
            with without_autograd(name, references.weighted_sum_backward):
                # copies: an answer that zeroes its inputs would otherwise zero the expected gradients
                result = run_student_code(name, weighted_sum_grads, x.clone(), w.clone(), grad_y.clone())
        except ExerciseError as error:
            raise python_error_in_words(
                name, error,
                "the exercise asks for the gradients from the formulas you derived, not from autograd: the "
                "checker calls your function under torch.no_grad, so no graph is recorded and "
                "torch.autograd.grad or .backward() has nothing to differentiate (switching grad back on is "
                "refused too). Compute grad_x and grad_w from x, w and grad_y with tensor operations",
                f"this call had x of shape {shape}, w of shape {tuple(w.shape)} and grad_y of shape "
                f"{tuple(grad_y.shape)}: x may have any number of leading axes (none too), so name the axes "
                "from the end (dim=-1) or reshape to (rows, D) first; grad_x has x's shape and grad_w w's, "
                "a sum over every axis of x but the last") from None
        if not (isinstance(result, tuple) and len(result) == 2):
            raise ExerciseError(f"{name}: return a tuple (grad_x, grad_w), got {type(result).__name__}")
        expected_x, expected_w = references.weighted_sum_backward(x, w, grad_y)
        for what, got, expected in [("grad_x", result[0], expected_x), ("grad_w", result[1], expected_w)]:
            if isinstance(got, torch.Tensor) and tuple(got.shape) != tuple(expected.shape):
                raise ExerciseError(
                    f"{name}: {what} for x of shape {shape} has shape {tuple(got.shape)}, expected "
                    f"{tuple(expected.shape)}.\n  hint: grad_x has x's shape and grad_w w's shape (D,): the sum "
                    "for grad_w runs over every axis of x but the last, however many there are (none for a 1-D "
                    "x), not over one fixed axis")
            compare(f"{name}: {what} for x of shape {shape}", got, expected, rtol=1e-9, atol=1e-9)
    say("Exercise 1.2 passed: grad_x and grad_w match autograd's for 1-, 2- and 3-D x.")


def launch_column_sum(column_sum_kernel, partial, out=None, block_rows=8, block_cols=32):
    """How exercise 1.3's checker launches the kernel: a 1-D grid, one program a block of
    ``block_cols`` columns that walks down all rows ``block_rows`` at a time; ``out`` float32
    of shape (D,), filled with NaN when not given."""
    if out is None:
        out = torch.full((partial.shape[1],), float("nan"), device=partial.device, dtype=torch.float32)
    grid = (triton.cdiv(partial.shape[1], block_cols),)
    column_sum_kernel[grid](partial, out, partial.shape[0], partial.shape[1], partial.stride(0), partial.stride(1),
                            BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols)
    return out


def _column_sum_hint(kernel, partial, got, block_rows):
    """The usual mistake behind a wrong column sum, or None."""
    expected = partial.double().sum(0)
    n_rows = partial.shape[0]
    if isinstance(got, torch.Tensor) and got.isnan().any() and not partial.isnan().any():
        # NaN from the masked lanes alone: the same kernel is right where they load as 0
        if matches(run_interpreted("column_sum_kernel", launch_column_sum, kernel, partial, undefined_as_nan=False), expected,
                   rtol=1e-5, atol=1e-5 * n_rows ** 0.5):
            return ("the lanes the mask switches off are added to the sum: a masked load without other= leaves "
                    "them undefined (garbage on a GPU, NaN here); load with other=0.0, which adds nothing")
    for end in range(0, n_rows, block_rows):  # the loop stopped after `end` rows
        if matches(got, partial[:end].double().sum(0), rtol=1e-5, atol=1e-5 * n_rows ** 0.5):
            if end == 0:
                return ("no row is added: the loop over the rows never runs; it must run from 0 to n_rows, "
                        "range(0, n_rows, BLOCK_ROWS), the last tile partly masked")
            if end == block_rows:
                return ("only the first tile of rows is added: the rows past the first BLOCK_ROWS never reach the "
                        "sum; loop down all rows, for row_start in range(0, n_rows, BLOCK_ROWS)")
            return (f"only the first {end} of {n_rows} rows are added: the loop ends early; it must run to "
                    "n_rows itself, the last tile partly masked (rows < n_rows)")
    if partial.stride(1) != 1:  # the columns read as if they were neighbours in memory
        contiguous_reading = torch.as_strided(partial, partial.shape, (partial.stride(0), 1))
        if matches(got, contiguous_reading.double().sum(0), rtol=1e-5, atol=1e-5 * n_rows ** 0.5):
            return (f"the columns of this partial are {partial.stride(1)} elements apart: multiply each column "
                    "index by stride_col, not by 1")
    return None


def check_column_sum(column_sum_kernel):
    """Exercise 1.3: ``column_sum_kernel``, launched by :func:`launch_column_sum`, writes
    ``partial.sum(0)`` for a 2-D float32 ``partial`` of any shape and strides."""
    name = "Exercise 1.3 (column_sum_kernel)"
    kernel = require_kernel(name, column_sum_kernel, "column_sum_kernel")
    cases = [(37, 5), (1, 1), (7, 5), (16, 33), (300, 129), (1000, 3)]
    cases += hidden_case(lambda: (random_size(2, 600), random_size(1, 200)))
    inputs = [(f"partial of shape {shape}", torch.randn(shape, device=DEVICE)) for shape in cases]
    transposed = torch.randn(40, 30, device=DEVICE).t()
    inputs.append((f"transposed partial of shape {tuple(transposed.shape)} (strides {transposed.stride()})",
                   transposed))
    for what, partial in inputs:
        got = None
        try:
            for how, got in kernel_runs(name, launch_column_sum, kernel, partial):
                compare(f"{name}, {what}" + (f", {how}" if how else ""), got, partial.double().sum(0),
                        rtol=1e-5, atol=1e-5 * partial.shape[0] ** 0.5)
        except ExerciseError as error:
            hint = None if got is None else _column_sum_hint(kernel, partial, got, block_rows=8)
            if hint is None:
                raise
            raise ExerciseError(f"{error}\n  hint: {hint}") from None
    for what, partial in [("partial of shape (4103, 5), more rows than any case above",
                           torch.randn(4103, 5, device=DEVICE)),
                          ("partial of shape (3, 3001), more columns than any case above",
                           torch.randn(3, 3001, device=DEVICE))]:
        expected = partial.double().sum(0)
        tolerance = dict(rtol=1e-5, atol=1e-5 * partial.shape[0] ** 0.5)
        beyond_cases_runs(name, what, launch_column_sum, kernel, (partial,),
                          lambda label, got: compare(label, got, expected, **tolerance),
                          lambda: torch.randn(partial.shape[1], device=DEVICE) * partial.shape[0] ** 0.5)
    say(f"Exercise 1.3 passed: {len(inputs)} shapes, from a single element to 1000 rows, and a transposed partial.")
    partial = torch.randn(2048, 32768, device=DEVICE) if ON_GPU else None
    out = torch.empty(32768, device=DEVICE) if partial is not None else None
    report_speed(name, lambda: launch_column_sum(kernel, partial, out, 32, 64), (2048 + 1) * 32768 * 4,
                 against=("torch's partial.sum(0)", lambda: torch.sum(partial, 0, out=out)),
                 # what the chapter's own answer reaches (0.74 of torch's on an H200): the advice is for slower ones
                 share=0.65,
                 advice="check that a tile's columns are contiguous in memory (cols times stride_col, which is 1 "
                        "here), so that each row of the tile is one wide load, and that the loop body does "
                        "nothing but load and add")
