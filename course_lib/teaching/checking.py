"""Comparing an answer with the expected one, and saying where it is wrong.

Exercise checkers (``course_lib.teaching.exercises``) call :func:`compare`; it raises
:class:`ExerciseError` with a message a student can act on: which elements are wrong,
by how much, and where, with an optional picture of the wrong elements for 2-D
answers.
"""

import contextlib
import sys
import threading
from pathlib import Path

import torch


class ExerciseError(AssertionError):
    """An exercise's answer is wrong; the message says where and by how much."""


def _index(flat_index, shape):
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat_index), shape)) if shape else ()


def compare(name, got, expected, *, rtol, atol, show_picture=False, max_listed=5,
            strides=("stride_x_row", "stride_x_col"), outputs_start_as_nan=True):
    """Raise ExerciseError unless ``got`` matches ``expected`` within rtol/atol.

    ``expected`` may be of higher precision; both are compared in float64 on the CPU.
    Returns the largest absolute error when the answer is right. ``strides`` names the row
    and column strides a hint about a stride mistake names (those of the input whose layout
    the case varies). The message mentions a picture only when one was shown in this call.
    ``outputs_start_as_nan``: whether the launcher filled the outputs with NaN (a NaN may then be
    an element never written); False where they started with other values.
    """
    if got is None:
        raise ExerciseError(f"{name}: got None; did the function return its result?")
    if not isinstance(got, torch.Tensor):
        raise ExerciseError(f"{name}: expected a torch.Tensor, got {type(got).__name__}")
    if tuple(got.shape) != tuple(expected.shape):
        raise ExerciseError(f"{name}: shape {tuple(got.shape)}, expected {tuple(expected.shape)}")
    got64 = got.detach().to("cpu", torch.float64)
    expected64 = expected.detach().to("cpu", torch.float64)
    error = (got64 - expected64).abs()
    allowed = atol + rtol * expected64.abs()
    wrong = ~(error <= allowed)  # NaN in got counts as wrong
    wrong |= got64.isnan() & ~expected64.isnan()
    wrong &= ~(got64.isnan() & expected64.isnan())
    n_wrong = int(wrong.sum())
    if n_wrong == 0:
        return float(error.max()) if error.numel() else 0.0

    flat_wrong = wrong.flatten().nonzero().flatten()
    lines = [
        f"{name}: {n_wrong} of {got.numel()} elements are wrong "
        f"(allowed |got - expected| <= {atol:g} + {rtol:g}·|expected|)."
    ]
    n_nan = int((got64.isnan() & ~expected64.isnan()).sum())
    if n_nan:
        lines.append(f"  {n_nan} elements are NaN: never written (outputs start as NaN), or computed from inf - inf, "
                     "inf / inf or 0 / 0" if outputs_start_as_nan else
                     f"  {n_nan} elements are NaN: computed from inf - inf, inf / inf or 0 / 0 (the outputs did not "
                     "start as NaN here)")
    for flat in flat_wrong[:max_listed].tolist():
        idx = _index(flat, tuple(got.shape))
        lines.append(f"  at {idx}: got {got64.flatten()[flat]:.6g}, expected {expected64.flatten()[flat]:.6g}")
    if n_wrong > max_listed:
        lines.append(f"  ... and {n_wrong - max_listed} more")
    measurable = wrong & ~error.isnan()  # a NaN answer has no size of error
    if measurable.any():
        worst = int(torch.where(measurable, error, -1.0).flatten().argmax())
        lines.append(f"  largest error {float(error.flatten()[worst]):.3g} at {_index(worst, tuple(got.shape))}")
    lines += _pattern_hints(wrong, strides)
    if show_picture and got.ndim == 2 and show_error_map(name, wrong):
        lines.append("  (the picture above marks the wrong elements)")
    raise ExerciseError("\n".join(lines))


def _pattern_hints(wrong, strides=("stride_x_row", "stride_x_col")):
    """Name simple patterns: whole rows or columns wrong, or only the edges; never "only the
    last columns" beside "only the last rows" (where both edges hold wrong elements, the
    edge they fill, or the corner)."""
    if wrong.ndim != 2 or not wrong.any():
        return []
    row_stride, col_stride = strides
    hints = []
    rows = wrong.any(dim=1).nonzero().flatten().tolist()
    cols = wrong.any(dim=0).nonzero().flatten().tolist()
    hints.append(f"  wrong rows: {_ranges(rows)}; wrong columns: {_ranges(cols)}")
    n_rows, n_cols = wrong.shape
    # Column 0 (row 0) is the one place whose address a wrong column (row) stride does not
    # change; a wrong mask spoils a run of columns (rows) at the end of the last tile instead.
    if n_cols > 2 and cols == list(range(1, n_cols)):
        hints.append("  every column but column 0 is wrong: column 0 is the only one whose address does not "
                     f"depend on the column stride; is each column index multiplied by it ({col_stride})?")
    if n_rows > 2 and rows == list(range(1, n_rows)):
        hints.append("  every row but row 0 is wrong: row 0 is the only one whose address does not depend on "
                     f"the row stride; is each row index multiplied by it ({row_stride}, not n_cols, which is "
                     "the row stride of a contiguous tensor only)?")
    if len(hints) > 1:
        return hints
    last_cols = bool(cols) and min(cols) > 0 and cols == list(range(min(cols), n_cols))
    last_rows = bool(rows) and min(rows) > 0 and rows == list(range(min(rows), n_rows))
    if last_cols and last_rows:  # both edges: say the one the pattern shows, never both
        if len(rows) == n_rows:
            last_rows = False
        elif len(cols) == n_cols:
            last_cols = False
        else:
            if int(wrong.sum()) > 1:
                hints.append("  only the bottom-right corner is wrong (the last rows of the last columns): "
                             "check the masks of the last tile, both the rows' and the columns'")
            return hints
    if last_cols:
        hints.append("  only the last columns are wrong: check the mask at the end of each row")
    elif last_rows:
        hints.append("  only the last rows are wrong: check the mask on the last tile of rows")
    return hints


def _ranges(values):
    """[0, 1, 2, 5] -> '0-2, 5'."""
    spans, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            spans.append(f"{start}" if start == v else f"{start}-{v}")
            start = None
    text = ", ".join(spans[:6])
    return text + (", ..." if len(spans) > 6 else "")


def shows_pictures():
    """Whether a figure drawn now is shown (a notebook, a window): False under a backend that
    only renders to files (Agg, as in a script or a test), where no picture appears."""
    try:
        import matplotlib
    except ImportError:
        return False
    backend = str(matplotlib.get_backend()).lower()
    return backend not in {"agg", "pdf", "ps", "svg", "pgf", "cairo", "template"}


def show_error_map(name, wrong):
    """Draw which elements of a 2-D answer are wrong; returns whether a picture was shown
    (nothing is drawn where no picture can appear)."""
    if not shows_pictures():
        return False
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3))
    ax.imshow(wrong.numpy(), cmap="Reds", aspect="auto", interpolation="nearest", vmin=0, vmax=1)
    ax.set_title(f"{name}: wrong elements in red")
    ax.set_xlabel("column")
    ax.set_ylabel("row")
    plt.show()
    return True


def run_student_code(name, fn, *args, explain=None, **kwargs):
    """Call the student's function; turn a crash into an ExerciseError that says so.

    Under Triton's interpreter its kernels run guarded (``course_lib.teaching.accesses``): a load or
    store outside the launch's tensors stops the launch before it happens, the picture of
    what each program touched is drawn (where pictures can be shown), and the ExerciseError
    names the access.

    ``explain``, the exercise's own words for a crash: a callable taking the exception and
    returning a sentence (or None), or a sequence of ``(text, sentence)`` pairs, the first
    whose text occurs in ``"ExceptionType: message"`` giving the sentence. It is added to
    the message as a hint, beside the error Python raised.
    """
    from . import accesses

    with accesses.guard_accesses(recording=True) as guard:
        try:
            result = fn(*args, **kwargs)
        except ExerciseError:
            raise
        except Exception as error:  # the student's code may raise anything
            if guard.violation is None:
                message = str(error).strip().splitlines()
                detail = message[-1] if message else ""
                hint = _explanation(explain, error)
                raise ExerciseError(f"{name}: your code raised {type(error).__name__}: {detail}"
                                    + _where_in_student_code(error)
                                    + (f"\n  hint: {hint}" if hint else "")) from error
        if guard.violation is not None:  # raised, or caught and ignored by the student's code
            drawn = False
            if shows_pictures():
                accesses.draw_accesses(guard.launches[-1])
                drawn = True
            raise ExerciseError(f"{name}: {guard.violation}" + (
                "\n  (the picture above shows what each program read and wrote up to that access, "
                "out-of-bounds elements as red crosses)" if drawn else "")) from None
        return result


def _explanation(explain, error):
    """The exercise's sentence for ``error`` (see run_student_code's ``explain``), or None."""
    if explain is None:
        return None
    if callable(explain):
        try:
            return explain(error)
        except Exception:  # a checker's explanation must never hide the student's error
            return None
    text = f"{type(error).__name__}: {error}"
    return next((sentence for pattern, sentence in explain if pattern in text), None)


_LIBRARY_PATHS = tuple(str(Path(module.__file__).resolve().parent) for module in (torch, contextlib))


def _where_in_student_code(error):
    """"\n  at line N of <function>: <code>" for the last frame of the student's own code in
    the error's traceback (its cause's too: the interpreter wraps a kernel's errors), or ""."""
    import linecache
    import traceback

    import triton

    libraries = (*_LIBRARY_PATHS, str(Path(triton.__file__).resolve().parent), str(Path(__file__).resolve().parents[1]))
    found = None
    while error is not None:
        for frame in traceback.extract_tb(error.__traceback__):
            if not str(Path(frame.filename).resolve()).startswith(libraries):
                found = frame
        error = error.__cause__ or error.__context__
    if found is None:
        return ""
    code = (found.line or linecache.getline(found.filename, found.lineno)).strip()
    return f"\n  at line {found.lineno} of {found.name}: {code}" if code else ""


def _refuse_to_answer(*args, **kwargs):
    raise NotImplementedError(
        "this exercise asks for the formula itself: a function of course_lib.core.references "
        "that answers it outright may not be called")


def _with_twin(function):
    """``function`` and its copy in ``sys.modules`` under ``course_lib.<room>.<module>`` (a
    grader loads the checkers apart from the package the notebook imported)."""
    module_name = "course_lib." + function.__module__.split(".", 1)[-1]
    twin = getattr(sys.modules.get(module_name), function.__name__, None)
    return list({id(f): f for f in (function, twin) if hasattr(f, "__code__")}.values())


@contextlib.contextmanager
def refusing_calls(function):
    """Make ``function`` raise while the block runs, under whatever name the student's
    code reaches it: its code object is swapped, so aliases such as
    ``from course_lib.core.references import softmax_backward`` are caught too. The copy in
    ``sys.modules`` under ``course_lib.<room>.<module>`` is refused as well, since a grader may
    have loaded the checkers apart from the package the notebook imported."""
    saved = [(f, f.__code__) for f in _with_twin(function)]
    try:
        for f, _ in saved:
            f.__code__ = _refuse_to_answer.__code__
        yield
    finally:
        for f, code in saved:
            f.__code__ = code


# The autograd engine's entry point: torch.autograd.grad, .backward() and torch.func's
# transforms all reach it (torch.autograd.Variable._execution_engine.run_backward).
_AUTOGRAD_ENGINE_CALL = "run_backward"


def _same_code(a, b):
    """``a`` is ``b`` or a copy of it (a student's own function of the same formula is not:
    its code comes from another file)."""
    return a is b or (a.co_filename == b.co_filename and a.co_firstlineno == b.co_firstlineno
                      and a.co_code == b.co_code and a.co_consts == b.co_consts)


@contextlib.contextmanager
def without_autograd(name, *references):
    """The block (a call of the student's answer) must compute its result from the formula:
    under torch.no_grad, with ``references`` refused (``refusing_calls``), and watched by a
    profiling hook that sees autograd's engine run, or any function whose code is one of the
    references' (a copy of its code object too), even inside ``torch.enable_grad()`` or a
    thread the answer starts. Raises ExerciseError naming what the answer did."""
    watched = [f.__code__ for reference in references for f in _with_twin(reference)]
    seen = []

    def hook(frame, event, arg):
        if event == "c_call" and getattr(arg, "__name__", "") == _AUTOGRAD_ENGINE_CALL:
            seen.append("it runs autograd (torch.autograd.grad, .backward() or torch.func)")
        elif event == "call" and any(_same_code(frame.f_code, code) for code in watched):
            seen.append(f"it calls course_lib's {frame.f_code.co_name}, which answers the exercise outright")

    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        for reference in references:
            stack.enter_context(refusing_calls(reference))
        previous, previous_threads = sys.getprofile(), threading.getprofile()
        sys.setprofile(hook)
        threading.setprofile(hook)
        try:
            yield
        finally:
            replaced = sys.getprofile() is not hook
            sys.setprofile(previous)
            threading.setprofile(previous_threads)
        if replaced:
            seen.append("it replaced the profiling hook the checker watches it with (sys.setprofile)")
    if seen:
        raise ExerciseError(f"{name}: the answer must compute the result from the formula, but {seen[0]}")


class _HostSync(Exception):
    """Raised inside the answer by refusing_host_syncs; a plain Exception, so that
    run_student_code names it and the line of the student's code that caused it."""


_HOST_SYNC_WORDS = ("it brings a tensor's value to the host as a Python number (.item(), float(), int(), "
                    "or bool(): an `if`, `max`, `min` or `and` on a tensor does so), which waits for the GPU, and "
                    "where torch.compile does not break the graph there it compiles again for each new value")


@contextlib.contextmanager
def refusing_host_syncs():
    """Make every read of a tensor's value into Python inside the block raise: ``.item()``,
    ``float(t)``, ``bool(t)`` (Python's ``max(t, 1.0)``, an ``if`` on a tensor), ``.tolist()``.
    All of them run ``aten._local_scalar_dense`` (or ``aten.tolist``'s copy to the host),
    which a dispatch mode sees whatever the device; use :data:`HOST_SYNC` as the ``explain``
    of run_student_code, or catch :class:`_HostSync`."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    refused = {torch.ops.aten._local_scalar_dense.default}
    refused_methods = {"item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__"}

    class Refusing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in refused:
                raise _HostSync("the answer reads a tensor's value as a Python number")
            return func(*args, **(kwargs or {}))

    class RefusingMethods(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") in refused_methods:
                raise _HostSync(f"the answer reads a tensor's value into Python ({func.__name__})")
            return func(*args, **(kwargs or {}))

    with RefusingMethods(), Refusing():
        yield


# run_student_code's ``explain`` for answers run inside refusing_host_syncs.
HOST_SYNC = (("_HostSync", f"the answer must stay in tensor operations, but {_HOST_SYNC_WORDS}"),)
