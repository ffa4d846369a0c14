"""Checkers of chapter 5, from kernel to layer: one function an exercise."""

import contextlib
import functools
import inspect

import torch
import triton

from ...core.runtime import DEVICE, ON_GPU
from ..checking import HOST_SYNC, ExerciseError, compare, refusing_host_syncs, run_student_code
from ..student_kernels import kernel_runs, report_speed, require_kernel
from .common import KEPT_FILL_HINT, Exercise, Prefilled, hidden_case, matches, random_fill, random_size, say

__all__ = ["check_without_graph_breaks", "launch_scale_columns_backward", "check_scale_columns_backward",
           "launch_scale_columns_forward", "check_scale_columns_op"]
# The chapter's exercises, in order, for the instructors' notes.
EXERCISES = (
    Exercise('5.1', 'remove a graph break', 'check_without_graph_breaks', kernel=False, skills='torch.compile graph breaks, data-dependent Python turned into tensor operations', difficulty=2, minutes=15),
    Exercise('5.2', 'a fused backward kernel', 'check_scale_columns_backward', kernel=True, skills='two gradients from one launch, partial column sums kept in registers down a group of rows, masks on the last group, strides', difficulty=3, minutes=35),
    Exercise('5.3', 'the layer as an operator', 'check_scale_columns_op', kernel=True, skills='torch.library.triton_op and wrap_triton, register_autograd through a backward operator, opcheck, torch.compile(fullgraph=True)', difficulty=4, minutes=45),
)


# ------------------------------------------------------------------ 5.1: a graph break
def check_without_graph_breaks(peak_scaled_softmax):
    """Exercise 5.1: softmax(x / max(max|x|, 1)) over the last dimension, traced in one graph."""
    import logging

    name = "Exercise 5.1 (peak_scaled_softmax)"
    torch._dynamo.reset()
    for shape in [(1, 1), (4, 7), (3, 5, 33)] + hidden_case(lambda: (random_size(1, 5), random_size(1, 40))):
        x = torch.randn(shape, device=DEVICE) * 3
        x64 = x.double()
        expected = torch.softmax(x64 / x64.abs().max().clamp(min=1.0), dim=-1)
        compare(f"{name}, x of shape {shape}", run_student_code(name, peak_scaled_softmax, x), expected,
                rtol=1e-5, atol=1e-6)
    small = torch.rand(4, 7, device=DEVICE) * 0.5  # max |x| below 1: divided by 1
    compare(f"{name}, x with every |x| < 1", run_student_code(name, peak_scaled_softmax, small.clone()),
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
    # Not counted in the line below: the answer run eagerly with every read of a tensor's value into
    # Python refused (.item(), and bool(): Python's max or an `if` on a tensor, which torch.compile
    # may trace by specializing on the value, but which waits for the GPU in eager code).
    for x in (torch.randn(6, 9, device=DEVICE) * 5, torch.rand(3, 4, device=DEVICE) * 0.5):
        with refusing_host_syncs():
            got = run_student_code(f"{name}, run with reads of tensor values into Python refused",
                                   peak_scaled_softmax, x.clone(), explain=HOST_SYNC)
        x64 = x.double()
        compare(f"{name}, x of shape {tuple(x.shape)}", got, torch.softmax(x64 / x64.abs().max().clamp(min=1.0), dim=-1),
                rtol=1e-5, atol=1e-6)
    say("Exercise 5.1 passed: the values of 4 inputs, and torch._dynamo.explain finds one graph, no break.")


# ------------------------------------------------------- 5.2: the fused backward kernel
def launch_scale_columns_backward(scale_columns_backward_kernel, x, w, grad_y, out=None, block_rows=16, block_cols=16,
                                  rows_per_program=32):
    """How exercise 5.2's checker launches the kernel: program (g, c) owns the rows
    ``g * rows_per_program`` to ``(g + 1) * rows_per_program - 1`` (a multiple of
    ``block_rows``, walked ``block_rows`` at a time) and the columns of block c. It writes
    grad_x = grad_y * w[None, :] there (grad_x contiguous) and its sums of grad_y * x down
    its rows into row g of ``partial``, of shape (number of row groups, D). ``out`` is
    (grad_x, partial), both filled with NaN when not given. Returns (grad_x, partial);
    grad_w is ``partial.sum(0)``."""
    if rows_per_program % block_rows:
        raise ValueError(f"rows_per_program ({rows_per_program}) must be a multiple of block_rows ({block_rows})")
    n_rows, n_cols = x.shape
    n_groups = triton.cdiv(n_rows, rows_per_program)
    if out is None:
        out = (torch.full(x.shape, float("nan"), device=x.device, dtype=x.dtype),
               torch.full((n_groups, n_cols), float("nan"), device=x.device, dtype=torch.float32))
    grad_x, partial = out
    grid = (n_groups, triton.cdiv(n_cols, block_cols))
    scale_columns_backward_kernel[grid](
        x, w, grad_y, grad_x, partial, n_rows, n_cols, x.stride(0), x.stride(1), w.stride(0),
        grad_y.stride(0), grad_y.stride(1), grad_x.stride(0), partial.stride(0), rows_per_program,
        BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols)
    return grad_x, partial


def _sums_down_groups(product, rows_per_program):
    """The partial rows: sums of ``product`` down each group of ``rows_per_program`` rows."""
    n_rows, n_cols = product.shape
    n_groups = -(-n_rows // rows_per_program)
    padded = product.new_zeros(n_groups * rows_per_program, n_cols)
    padded[:n_rows] = product
    return padded.reshape(n_groups, rows_per_program, n_cols).sum(1)


def _sums_along_rows(product, rows_per_program, block):
    """What ``tl.sum(..., axis=1)`` in place of axis=0 leaves in the partial rows (square
    ``block`` × ``block`` tiles): lane k of column block c of group g adds, over the group's
    tiles, row k of the tile across the block's columns."""
    n_rows, n_cols = product.shape
    n_groups, n_col_blocks = -(-n_rows // rows_per_program), -(-n_cols // block)
    padded = product.new_zeros(n_groups * rows_per_program, n_col_blocks * block)
    padded[:n_rows, :n_cols] = product
    tiles = padded.reshape(n_groups, rows_per_program // block, block, n_col_blocks, block)
    return tiles.sum(dim=(1, 4)).transpose(1, 2).reshape(n_groups, -1)[:, :n_cols]


def _read_as_contiguous(t):
    """``t`` as a kernel that ignores its strides reads it: row i at i * n_cols, or None
    when that would run past its storage (the guard names that access instead)."""
    if t.is_contiguous() or t.untyped_storage().nbytes() < t.numel() * t.element_size():
        return None
    return t.as_strided(t.shape, (t.shape[1], 1))


def _read_with_unit_column_stride(t):
    """``t`` as a kernel that ignores its column stride reads it (column j at j), or None when
    that is the right read or would run past its storage."""
    if t.stride(1) == 1 or t.shape[1] < 2:
        return None
    needed = (t.shape[0] - 1) * t.stride(0) + t.shape[1]
    if t.untyped_storage().nbytes() < (t.storage_offset() + needed) * t.element_size():
        return None
    return t.as_strided(t.shape, (t.stride(0), 1))


def _backward_hint(got, x, w, grad_y, *, block_rows, block_cols, rows_per_program):
    """The usual mistake behind a wrong (grad_x, partial) of exercise 5.2, or None."""
    grad_x, partial = got
    x64, w64, grad_y64 = (t.detach().to("cpu", torch.float64) for t in (x, w, grad_y))
    if matches(grad_x, grad_y64 * x64, rtol=1e-5, atol=1e-6):
        return "grad_x is grad_y * x: the derivative of x[i, j] * w[j] by x[i, j] is w[j], so grad_x = grad_y * w"
    if block_rows == block_cols and matches(partial, _sums_along_rows(grad_y64 * x64, rows_per_program, block_rows),
                                            rtol=1e-5, atol=1e-5):
        return ("the partial sums run along each row (axis=1), across the columns: grad_w[j] sums grad_y * x "
                "over the rows i, down each column, so reduce the tile with axis=0")
    for what, t, other in (("grad_y", grad_y, x64), ("x", x, grad_y64)):
        misread = _read_with_unit_column_stride(t)
        if misread is None:
            continue
        misread64 = misread.to("cpu", torch.float64)
        explains_grad_x = what == "grad_y" and matches(grad_x, misread64 * w64[None, :], rtol=1e-5, atol=1e-6)
        if explains_grad_x or matches(partial, _sums_down_groups(misread64 * other, rows_per_program),
                                      rtol=1e-5, atol=1e-5):
            return (f"{what}'s columns were read one element apart (column j at j): this {what}'s columns are "
                    f"{t.stride(1)} elements apart; multiply the column index by stride_{what}_col")
    misread = {what: _read_as_contiguous(t) for what, t in (("x", x), ("grad_y", grad_y))}
    for what, other in (("x", grad_y64), ("grad_y", x64)):
        if misread[what] is not None:
            product = misread[what].to("cpu", torch.float64) * other
            if matches(partial, _sums_down_groups(product, rows_per_program), rtol=1e-5, atol=1e-5):
                return (f"{what} was read as if contiguous (row i at i * n_cols, column j at j): this {what} is "
                        f"not; address it with stride_{what}_row and stride_{what}_col")
    return None


def check_scale_columns_backward(scale_columns_backward_kernel):
    """Exercise 5.2: ``scale_columns_backward_kernel``, launched by
    :func:`launch_scale_columns_backward`, writes grad_x = grad_y * w[None, :] and each
    row group's partial column sums of grad_y * x, for inputs of any shape and strides."""
    name = "Exercise 5.2 (scale_columns_backward_kernel)"
    kernel = require_kernel(name, scale_columns_backward_kernel, "scale_columns_backward_kernel")

    def case(what, x, grad_y=None, w=None, **blocks):
        grad_y = torch.randn(x.shape, device=DEVICE) if grad_y is None else grad_y
        w = torch.randn(x.shape[1], device=DEVICE) if w is None else w
        return what, x, w, grad_y, blocks

    shapes = [(1, 1), (5, 3), (37, 130), (64, 48)] + hidden_case(lambda: (random_size(2, 90), random_size(2, 150)))
    cases = [case(f"x of shape {shape}", torch.randn(shape, device=DEVICE)) for shape in shapes]
    transposed = torch.randn(23, 40, device=DEVICE).t()
    cases += [
        case(f"x transposed (strides {transposed.stride()})", transposed),
        case("grad_y transposed (strides (1, 40))", torch.randn(40, 23, device=DEVICE),
             grad_y=torch.randn(23, 40, device=DEVICE).t()),
        case("w every other element of a longer tensor (stride 2)", torch.randn(9, 20, device=DEVICE),
             w=torch.randn(40, device=DEVICE)[::2]),
        case("grad_y one value expanded (strides (0, 0)), as out.sum().backward() passes it",
             torch.randn(19, 21, device=DEVICE), grad_y=torch.randn((), device=DEVICE).expand(19, 21)),
        case("x of shape (45, 70), BLOCK_ROWS=8, BLOCK_COLS=32, rows_per_program=24",
             torch.randn(45, 70, device=DEVICE), block_rows=8, block_cols=32, rows_per_program=24),
    ]
    for what, x, w, grad_y, blocks in cases:
        blocks = {"block_rows": 16, "block_cols": 16, "rows_per_program": 32} | blocks
        x64, w64, grad_y64 = x.double(), w.double(), grad_y.double()
        expected_partial = _sums_down_groups(grad_y64 * x64, blocks["rows_per_program"])
        try:
            launch = functools.partial(launch_scale_columns_backward, **blocks)
            for how, got in kernel_runs(name, launch, kernel, x, w, grad_y):
                where = f"{name}, {what}" + (f", {how}" if how else "")
                varied = "x" if not x.is_contiguous() else "grad_y"  # the input whose strides a mistake shows in
                strides = (f"stride_{varied}_row", f"stride_{varied}_col")
                try:
                    compare(f"{where}: grad_x", got[0], grad_y64 * w64[None, :], rtol=1e-6, atol=1e-6,
                            show_picture=True, strides=("stride_grad_y_row", "stride_grad_y_col"))
                    compare(f"{where}: partial (row g: the sums down row group g)", got[1], expected_partial,
                            rtol=1e-5, atol=1e-5 * blocks["rows_per_program"] ** 0.5, show_picture=True,
                            strides=strides)
                except ExerciseError as error:
                    hint = _backward_hint(got, x, w, grad_y, **blocks)
                    raise ExerciseError(str(error) + (f"\n  hint: {hint}" if hint else "")) from None
        except ExerciseError as error:
            if "out of bounds" not in str(error) or not all(t.is_contiguous() for t in (x, w, grad_y)):
                raise
            raise ExerciseError(
                f"{error}\n  hint: the last row group ends past n_rows unless rows_per_program divides it, and the "
                "last column block past n_cols: mask every load and store of the loop with rows < n_rows and "
                "cols < n_cols, and the store of the partial row with cols < n_cols") from None
    # Not counted in the line below: sizes past the printed cases' (many row groups, a long row), and
    # outputs filled beforehand with random values rather than NaN, a new fill each run.
    for what, x in (("x of shape (300, 5)", torch.randn(300, 5, device=DEVICE)),
                    ("x of shape (3, 700)", torch.randn(3, 700, device=DEVICE)),
                    ("x of shape (130, 45) transposed", torch.randn(45, 130, device=DEVICE).t())):
        w, grad_y = torch.randn(x.shape[1], device=DEVICE), torch.randn(x.shape, device=DEVICE)
        blocks = {"block_rows": 16, "block_cols": 16, "rows_per_program": 32}
        launch = Prefilled(functools.partial(launch_scale_columns_backward, **blocks), lambda x, *rest: (
            random_fill(x.shape, x.device, x.dtype), random_fill((triton.cdiv(x.shape[0], 32), x.shape[1]), x.device)))
        x64, w64, grad_y64 = x.double(), w.double(), grad_y.double()
        for how, got in kernel_runs(name, launch, kernel, x, w, grad_y):
            where = f"{name}, {what}, outputs filled with random values beforehand" + (f", {how}" if how else "")
            expected = (grad_y64 * w64[None, :], _sums_down_groups(grad_y64 * x64, 32))
            for part, label, tolerance in ((0, "grad_x", dict(rtol=1e-6, atol=1e-6)),
                                           (1, "partial", dict(rtol=1e-5, atol=1e-5 * 32 ** 0.5))):
                try:
                    compare(f"{where}: {label}", got[part], expected[part], show_picture=True,
                            outputs_start_as_nan=False, **tolerance)
                except ExerciseError as error:
                    hint = _backward_hint(got, x, w, grad_y, **blocks)
                    if hint is None and launch.kept_fill(got[part], expected[part], **tolerance):
                        hint = KEPT_FILL_HINT
                    raise ExerciseError(str(error) + (f"\n  hint: {hint}" if hint else "")) from None
    say(f"{name.split(' (')[0]} passed: {len(cases)} cases, including transposed x and grad_y, a strided w, "
          "an expanded grad_y and other block sizes.")
    big = ON_GPU
    x, grad_y = (torch.randn(8192, 4096, device=DEVICE) for _ in range(2)) if big else (None, None)
    w = torch.randn(4096, device=DEVICE) if big else None
    out = (torch.empty_like(x), torch.empty(8192 // 256, 4096, device=DEVICE)) if big else None
    report_speed(name, lambda: launch_scale_columns_backward(kernel, x, w, grad_y, out, 32, 128, 256),
                 3 * 8192 * 4096 * 4,
                 against=("torch's grad_y * w and (grad_y * x).sum(0)", lambda: (grad_y * w, (grad_y * x).sum(0))),
                 advice="each program should read x and grad_y once, write grad_x once and keep its partial sums in "
                        "registers down its rows; check that its columns are contiguous in memory (the column index "
                        "times a column stride of 1), so that loads combine into wide vectors")


# ----------------------------------------------------------- 5.3: the layer as an operator
def launch_scale_columns_forward(scale_columns_forward_kernel, x, w, out=None, block_rows=16, block_cols=32):
    """How exercise 5.3's checker launches the forward kernel on its own: one program a tile
    of ``block_rows × block_cols``; ``out`` contiguous, filled with NaN when not given."""
    if out is None:
        out = torch.full(x.shape, float("nan"), device=x.device, dtype=x.dtype)
    grid = (triton.cdiv(x.shape[0], block_rows), triton.cdiv(x.shape[1], block_cols))
    scale_columns_forward_kernel[grid](x, w, out, x.shape[0], x.shape[1], x.stride(0), x.stride(1), w.stride(0),
                                       out.stride(0), BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols)
    return out


class _Launches(list):
    """One entry per launch of a kernel (its grid), and ``.arguments``: each launch's
    arguments by the kernel's parameter names."""

    def __init__(self):
        super().__init__()
        self.arguments = []


@contextlib.contextmanager
def _counting_launches(kernel, mark=None):
    """A list that gets one entry each time ``kernel[grid](...)`` launches in the block
    (``kernel[grid]`` calls ``kernel.run``), or None for no kernel. ``mark``: {parameter name:
    function of the tensor passed there}, called after each launch, to change what the kernel
    wrote by a known amount (what the operator returns must then carry it)."""
    if kernel is None:
        yield None
        return
    launches = _Launches()
    run = kernel.run
    try:
        parameters = list(inspect.signature(kernel.fn).parameters)
    except (TypeError, ValueError, AttributeError):
        parameters = []

    def counting_run(*args, **kwargs):
        launches.append(kwargs.get("grid"))
        bound = dict(zip(parameters, args)) | {k: v for k, v in kwargs.items() if k in parameters}
        launches.arguments.append(bound)
        result = run(*args, **kwargs)
        for parameter, change in (mark or {}).items():
            if isinstance(bound.get(parameter), torch.Tensor):
                with torch.no_grad():
                    change(bound[parameter])
        return result

    kernel.run = counting_run
    try:
        yield launches
    finally:
        del kernel.run  # the class's method again


def _grad_y_strides_hint(launches, x):
    """What the backward launch's own arguments say is wrong about grad_y's or grad_x's layout, or ""."""
    for bound in getattr(launches, "arguments", []):
        grad_y, grad_x = bound.get("grad_y_ptr"), bound.get("grad_x_ptr")
        passed = (bound.get("stride_grad_y_row"), bound.get("stride_grad_y_col"))
        if isinstance(grad_y, torch.Tensor) and grad_y.dim() == 2 and passed != tuple(grad_y.stride()):
            if passed == tuple(x.stride()):
                return (f"the backward operator passes x's strides {tuple(x.stride())} as grad_y's "
                        f"(stride_grad_y_row, stride_grad_y_col), while grad_y's strides are {tuple(grad_y.stride())}: "
                        "pass grad_y.stride(0) and grad_y.stride(1); the gradient that arrives need not be laid "
                        "out as x")
            return (f"the backward operator passes {passed} as grad_y's strides (stride_grad_y_row, "
                    f"stride_grad_y_col), while grad_y's strides are {tuple(grad_y.stride())}: pass "
                    "grad_y.stride(0) and grad_y.stride(1)")
        if isinstance(grad_x, torch.Tensor) and grad_x.dim() == 2 and not grad_x.is_contiguous():
            return _GRAD_X_LAYOUT_HINT
    return ""


def _is_triton_op(op):
    """Whether ``op`` was made by torch.library.triton_op (a CustomOpDef too), which lists
    its operators with the kernels it found in their bodies."""
    from torch._library.triton import triton_ops_to_kernels

    return op._qualname in triton_ops_to_kernels


def _names_wrap_triton(fn):
    """Whether the source of ``fn`` names wrap_triton (True where Python keeps no source)."""
    try:
        return "wrap_triton" in inspect.getsource(fn)
    except (OSError, TypeError):
        return True


def _require_operator(name, op):
    if not isinstance(op, torch._library.custom_ops.CustomOpDef):
        raise ExerciseError(f"{name}: pass the operator that @torch.library.triton_op made (under the interpreter, "
                            f"@torch.library.custom_op), got {type(op).__name__}")
    if ON_GPU and not _is_triton_op(op):
        raise ExerciseError(f"{name}: on a GPU make the operator a torch.library.triton_op, so that torch.compile "
                            "sees the kernels it launches through wrap_triton (a custom_op stays opaque)")
    if not ON_GPU and _is_triton_op(op):
        raise ExerciseError(f"{name}: under the interpreter a triton_op cannot be traced (wrap_triton has no kernel "
                            "to record, so torch.compile would run the interpreted kernel on fake tensors): make it a "
                            "torch.library.custom_op there with a fake implementation, as the stub's `as_operator` does")


def _require_wrap_triton(name, op):
    """Under the interpreter a bare kernel[grid] in the operator works; it fails only on a GPU,
    where the operator is a triton_op (torch.compile and opcheck say so there): say it here."""
    if not ON_GPU and not _names_wrap_triton(op._init_fn):
        raise ExerciseError(f"{name}: launch the kernel as torch.library.wrap_triton(scale_columns_forward_kernel)"
                            "[grid](...): on a GPU, where the operator is a triton_op, torch.compile records the "
                            "launches it sees through wrap_triton, and a bare kernel[grid] fails on its fake tensors")


def _tracing_hint(error):
    """The usual cause of an operator that fails on fake tensors (a GPU's triton_op), or ""."""
    if "data pointer" not in str(error) and "data_ptr" not in str(error):
        return ""
    return ("\n  hint: launch every kernel through torch.library.wrap_triton(kernel)[grid](...), and read only "
            "shapes, strides and dtypes in the operators' bodies: torch.compile and opcheck run them on fake "
            "tensors, which have no data")


def _opcheck(name, op, args, what):
    """torch.library.opcheck, its failure told as which of its tests failed and why."""
    try:
        torch.library.opcheck(op, args)
    except torch.testing._internal.optests.OpCheckError as error:
        first_line = str(error).strip().splitlines()[0]
        raise ExerciseError(f"{name}: torch.library.opcheck failed {what}: {first_line}{_tracing_hint(error)}") \
            from error


_OUTPUT_LAYOUT_HINT = ("the output has the layout of x, which is not row-major here (torch.empty_like(x) keeps it), "
                       "while the kernel writes its columns as contiguous: allocate it with torch.empty(x.shape, ...)")
_GRAD_X_LAYOUT_HINT = ("x is not row-major here: if the backward operator allocates grad_x with torch.empty_like(x), "
                       "grad_x keeps that layout while the kernel writes its columns as contiguous; allocate it with "
                       "torch.empty(x.shape, ...)")


@contextlib.contextmanager
def _hint_on_failure(hint):
    """An ExerciseError raised in the block, with ``hint`` added (when there is one)."""
    try:
        yield
    except ExerciseError as error:
        if not hint:
            raise
        raise ExerciseError(f"{error}\n  hint: {hint}") from None


def _values_and_grads(name, op, x, w, grad_y, forward_kernel, backward_kernel, what):
    """op(x, w) and the grads of x and w from grad_y (None: out.sum().backward()), each
    checked against float64, and both kernels seen to launch (None: not counted, for a
    compiled op, which inductor launches from its own copy of the kernels)."""
    x = x.detach().requires_grad_()
    w = w.detach().requires_grad_()
    with _counting_launches(forward_kernel) as forward_launches:
        out = run_student_code(name, op, x, w, explain=_OPERATOR_ERRORS)
    laid_out_as_x = isinstance(out, torch.Tensor) and not out.is_contiguous() and out.stride() == x.stride()
    with _hint_on_failure(_OUTPUT_LAYOUT_HINT if laid_out_as_x else ""):
        compare(f"{name}: the operator's output for {what}", out, x.detach().double() * w.detach().double(),
                rtol=1e-6, atol=1e-6)
    if forward_launches == []:
        raise ExerciseError(f"{name}: the operator did not launch scale_columns_forward_kernel: launch it with "
                            "torch.library.wrap_triton(scale_columns_forward_kernel)[grid](...)")
    if not out.requires_grad:
        raise ExerciseError(f"{name}: the output does not require grad; register the backward with "
                            "scale_columns_op.register_autograd(backward, setup_context=setup_context)")
    with _counting_launches(backward_kernel) as backward_launches:
        if grad_y is None:
            run_student_code(name, lambda: out.sum().backward(), explain=_OPERATOR_ERRORS)
            grad_y = torch.ones_like(out)
        else:
            run_student_code(name, out.backward, grad_y, explain=_OPERATOR_ERRORS)
    if x.grad is None or w.grad is None:
        raise ExerciseError(f"{name}: the grad of {'x' if x.grad is None else 'w'} is None for {what}: backward must "
                            "return (grad_x, grad_w), one gradient for each input")
    x64, grad_y64 = x.detach().double(), grad_y.double()
    with _hint_on_failure(_grad_y_strides_hint(backward_launches, x)):
        compare(f"{name}: the grad of x for {what}", x.grad, grad_y64 * w.detach().double(), rtol=1e-5, atol=1e-6)
    with _hint_on_failure(_grad_y_strides_hint(backward_launches, x)):
        compare(f"{name}: the grad of w for {what}", w.grad, (grad_y64 * x64).sum(0), rtol=1e-5,
                atol=1e-5 * x.shape[0] ** 0.5)
    if backward_launches == []:
        raise ExerciseError(f"{name}: the backward did not launch scale_columns_backward_kernel: compute both "
                            "gradients with the backward operator, which launches it through wrap_triton")


def _compiled_matches(name, op, forward_kernel, backward_kernel):
    """torch.compile(op, fullgraph=True), forward and backward, against float64: inductor on
    a GPU; aot_eager under the interpreter, where the operator is opaque and its body runs
    as in eager, launches counted."""
    backend = "inductor" if ON_GPU else "aot_eager"
    x, w, grad_y = torch.randn(21, 37, device=DEVICE), torch.randn(37, device=DEVICE), torch.randn(21, 37, device=DEVICE)
    torch._dynamo.reset()
    compiled = torch.compile(op, fullgraph=True, backend=backend)
    try:
        # Traced first, outside the checks, so that a failure of the trace is told as one.
        compiled(x.clone().requires_grad_(), w.clone().requires_grad_()).backward(grad_y)
    except ExerciseError:
        raise
    except Exception as error:  # the student's operator may fail to trace in any way
        lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
        reason = next((line for line in lines if "Error" in line and len(line) > 30), lines[0] if lines else "")
        raise ExerciseError(f"{name}: torch.compile(scale_columns_op, fullgraph=True, backend={backend!r}) failed "
                            f"with {type(error).__name__}: {reason}{_tracing_hint(error)}") from error
    try:
        _values_and_grads(name, compiled, x, w, grad_y, None if ON_GPU else forward_kernel,
                          None if ON_GPU else backward_kernel, "x of shape (21, 37), compiled")
    finally:
        torch._dynamo.reset()


# The exercise's words for the errors torch raises about an operator's results.
_OPERATOR_ERRORS = (
    ("may not alias any inputs", "the operator returns one of its inputs, or a view of one (x itself when every "
     "weight is 1, say): an operator's result must be a new tensor, here the one its kernel writes, whatever the "
     "weights"),
    ("must not also be an input", "the operator returns one of its inputs: an operator's result must be a new "
     "tensor, here the one its kernel writes"),
)

_MARK = 7.25  # added to what a kernel wrote: the operator's results must carry it


def _carries_mark(got, expected):
    """Whether got - expected is a whole positive number of marks everywhere (one a launch that
    wrote the element), i.e. got was written by the kernel whose outputs were marked."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return False
    marks = (got.detach().to("cpu", torch.float64) - expected) / _MARK
    return bool(((marks - marks.round()).abs() < 1e-3).all() and (marks.round() >= 1).all())


def _results_come_from_the_kernels(name, op, forward_kernel, backward_kernel):
    """Special weights (all ones, all zeros, -1), and the operator's results traced to its kernels:
    what each launch writes is changed by a known amount right after it, so an output or a
    gradient computed beside a launch (in PyTorch, say) shows, and so does an input returned."""
    for what, w_value in (("every weight 1", 1.0), ("every weight 0", 0.0), ("every weight -1", -1.0)):
        x = torch.randn(37, 21, device=DEVICE)
        w = torch.full((21,), w_value, device=DEVICE)
        _values_and_grads(name, op, x, w, torch.randn(x.shape, device=DEVICE), forward_kernel, backward_kernel, what)
        out = run_student_code(name, op, x, w, explain=_OPERATOR_ERRORS)
        if isinstance(out, torch.Tensor) and any(out.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
                                                 for t in (x, w)):
            raise ExerciseError(f"{name}: for {what} the operator returns {'x' if out.shape == x.shape else 'w'} "
                                "itself (or a view of it): it must return a new tensor, written by "
                                "scale_columns_forward_kernel, whatever the weights")
    for what, w_value in (("every weight 1", 1.0), ("every weight 0", 0.0), ("random weights", None)):
        x = torch.randn(45, 19, device=DEVICE).requires_grad_()
        w = (torch.randn(19, device=DEVICE) if w_value is None else torch.full((19,), w_value, device=DEVICE))
        _marked_results(name, op, x, w.requires_grad_(), forward_kernel, backward_kernel, what)


def _marked_results(name, op, x, w, forward_kernel, backward_kernel, what):
    """op(x, w) and its gradients with every launch's outputs changed by _MARK right after it."""
    grad_y = torch.randn(x.shape, device=DEVICE)

    def mark_all(t):
        t.add_(_MARK)

    def mark_first_row(t):
        t[0].add_(_MARK)

    with _counting_launches(forward_kernel, mark={"out_ptr": mark_all}):
        out = run_student_code(name, op, x, w, explain=_OPERATOR_ERRORS)
    x64, w64, grad_y64 = (t.detach().to("cpu", torch.float64) for t in (x, w, grad_y))
    if isinstance(out, torch.Tensor) and not _carries_mark(out, x64 * w64):
        raise ExerciseError(f"{name}: for {what}, the operator's output is not what scale_columns_forward_kernel "
                            "wrote: the checker changed the kernel's output right after its launch, and the "
                            "operator returned other values. Return the tensor the kernel writes, not a result "
                            "computed beside it (whatever the weights)")
    with _counting_launches(backward_kernel, mark={"grad_x_ptr": mark_all, "partial_ptr": mark_first_row}):
        run_student_code(name, out.backward, grad_y, explain=_OPERATOR_ERRORS)
    for label, grad, expected in (("x", x.grad, grad_y64 * w64), ("w", w.grad, (grad_y64 * x64).sum(0))):
        if grad is not None and not _carries_mark(grad, expected):
            raise ExerciseError(
                f"{name}: for {what}, the gradient of {label} is not what scale_columns_backward_kernel wrote: the "
                "checker changed the kernel's outputs right after its launch (grad_x, and row 0 of the partial "
                "sums), and the backward returned other values. Compute both gradients from what the kernel "
                "writes (grad_x itself, grad_w the partial rows summed), not beside it in PyTorch")


def check_scale_columns_op(scale_columns_forward_kernel, scale_columns_backward_kernel, scale_columns_op):
    """Exercise 5.3: ``scale_columns_op(x, w)`` = x * w[None, :], an operator that launches
    ``scale_columns_forward_kernel`` (checked alone first, through
    :func:`launch_scale_columns_forward`) and whose registered backward launches
    ``scale_columns_backward_kernel``; it passes opcheck and compiles with fullgraph=True."""
    name = "Exercise 5.3 (scale_columns_op)"
    forward_kernel = require_kernel(name, scale_columns_forward_kernel, "scale_columns_forward_kernel")
    backward_kernel = require_kernel(name, scale_columns_backward_kernel, "scale_columns_backward_kernel")
    _require_operator(name, scale_columns_op)

    # 517 rows: more than one row group for most choices of rows_per_program
    shapes = [(1, 1), (5, 3), (37, 130), (517, 9)] + hidden_case(lambda: (random_size(2, 300), random_size(2, 150)))
    inputs = [(f"x of shape {shape}", torch.randn(shape, device=DEVICE), torch.randn(shape[1], device=DEVICE))
              for shape in shapes]
    transposed = torch.randn(40, 23, device=DEVICE).t()
    inputs.append((f"x transposed (strides {transposed.stride()})", transposed, torch.randn(40, device=DEVICE)))
    inputs.append(("w every other element of a longer tensor (stride 2)", torch.randn(9, 20, device=DEVICE),
                   torch.randn(40, device=DEVICE)[::2]))
    for what, x, w in inputs:  # the forward kernel alone, guarded
        for how, got in kernel_runs(name, launch_scale_columns_forward, forward_kernel, x, w):
            compare(f"{name}, scale_columns_forward_kernel alone, {what}" + (f", {how}" if how else ""), got,
                    x.double() * w.double(), rtol=1e-6, atol=1e-6, show_picture=True)
    _require_wrap_triton(name, scale_columns_op)
    for what, x, w in inputs:  # the operator, forward and backward
        _values_and_grads(name, scale_columns_op, x, w, torch.randn(x.shape, device=DEVICE), forward_kernel,
                          backward_kernel, what)
    _values_and_grads(name, scale_columns_op, torch.randn(11, 19, device=DEVICE), torch.randn(19, device=DEVICE),
                      None, forward_kernel, backward_kernel, "out.sum().backward() (grad_y expanded, strides (0, 0))")
    # Not counted in the line below: special weights, and the results traced to the kernels. Before
    # opcheck, whose fake tensors stop a branch on the weights' values with a message of its own (on a
    # GPU), so that such an answer is named the same way on a GPU and under the interpreter.
    _results_come_from_the_kernels(name, scale_columns_op, forward_kernel, backward_kernel)
    x, w = torch.randn(9, 5, device=DEVICE), torch.randn(5, device=DEVICE)
    _opcheck(name, scale_columns_op, (x, w), "on x of shape (9, 5)")
    _opcheck(name, scale_columns_op, (x.requires_grad_(), w.requires_grad_()), "with inputs that need grad")
    _compiled_matches(name, scale_columns_op, forward_kernel, backward_kernel)
    how = ("inductor launching your kernels itself" if ON_GPU else
           "aot_eager, the operator opaque (under the interpreter inductor cannot launch interpreted kernels)")
    say(f"{name.split(' (')[0]} passed: the forward kernel on {len(inputs)} inputs, the operator's values and "
          f"gradients through both kernels, opcheck, and torch.compile(fullgraph=True) with {how}.")
