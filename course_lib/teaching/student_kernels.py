"""Running a student's ``@triton.jit`` kernel as a checker must: the same verdict on a GPU as
on a laptop, and nothing the kernel does can take the checker down.

A kernel exercise's checker receives the kernel itself, not a function that returns a
tensor, and launches it with its own launcher (:func:`require_kernel` refuses anything
else, so an answer written in PyTorch does not pass a kernel exercise).
:func:`kernel_runs` then runs each case

1. **under Triton's interpreter, guarded** (:mod:`course_lib.teaching.accesses`): a load or
   store outside the launch's tensors is named, with the picture of what each program
   touched, before it happens. The interpreter runs the kernel's Python source, so this
   works in the same process on a GPU machine too (the interpreter copies CUDA tensors to
   the host and back). A time limit turns an endless loop into a message, and masked lanes
   loaded without ``other=`` are NaN (on a GPU they hold whatever memory held);
2. **compiled, on a GPU** when there is one, where the kernel runs as it will in a model.

A wrong mask therefore gets the same out-of-bounds verdict on an H100 as on a laptop,
instead of a silent pass (reading one element past a row is harmless garbage on a GPU
more often than not) or an "illegal memory access" that ends the session.

:func:`report_speed` adds feedback on a GPU: the kernel's bandwidth as a fraction of a
copy measured in the same run, beside the course's own kernel. It never fails an answer.
"""

import contextlib
import signal
import threading
import warnings

import torch

from ..core.runtime import (ON_GPU, interpret_jit_functions, interpreter_computes_bfloat16, interpreter_patches_undone,
                            triton_language_namespaces)
from .checking import ExerciseError, run_student_code
from .notebook import fit_text

INTERPRETER_SECONDS = 120  # one interpreted launcher call on a checker's small inputs


class _TimeUp(BaseException):
    """Raised by the alarm; a BaseException, so that the interpreter's and the student's
    ``except Exception`` do not swallow it."""


def is_triton_kernel(obj):
    """Whether ``obj`` is a ``@triton.jit`` function (compiled or interpreted)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    return isinstance(obj, (JITFunction, InterpretedFunction))


def require_kernel(name, kernel, kernel_name):
    """``kernel`` if it is a ``@triton.jit`` function, else an ExerciseError that says what
    arrived and what the exercise wants."""
    if is_triton_kernel(kernel):
        return kernel
    if hasattr(kernel, "fn") and is_triton_kernel(getattr(kernel, "fn")):
        raise ExerciseError(f"{name}: pass a kernel decorated with @triton.jit alone: the checker chooses the "
                            f"block sizes itself, so @triton.autotune or @triton.heuristics around it cannot work")
    what = "None" if kernel is None else f"a {type(kernel).__name__}"
    if callable(kernel):
        what += f" ({getattr(kernel, '__name__', 'callable')})"
    raise ExerciseError(
        f"{name}: pass the kernel itself, the function decorated with @triton.jit ({kernel_name}); got {what}. "
        "The checker launches it on its own inputs; an answer computed in PyTorch does not count, since this "
        "exercise is about writing the kernel.")


@contextlib.contextmanager
def interpreted(kernel):
    """``kernel`` as Triton's interpreter runs it: an ``InterpretedFunction`` of its Python
    function. While the block runs, the ``@jit`` functions it may call are interpreted too
    (the helpers in its module's globals and in theirs, and Triton's own: ``tl.sum`` and
    ``tl.max`` are ``@jit`` functions of triton.language), and Triton is told it interprets
    (``knobs.runtime.interpret``, which some of its functions read as they run); at the end
    all of it, and whatever the interpreter patched, is put back."""
    import triton
    from triton.runtime.interpreter import InterpretedFunction

    if isinstance(kernel, InterpretedFunction):  # TRITON_INTERPRET=1: already interpreted
        yield kernel
        return
    interpreter_computes_bfloat16()  # a GPU machine's interpreted pass computes bfloat16 tiles too
    runtime_knobs = triton.knobs.runtime
    was_interpreting = runtime_knobs.interpret
    with interpreter_patches_undone(), warnings.catch_warnings():
        # NumPy's warnings from inside the interpreter (-inf - -inf in a masked lane that is never
        # stored) say nothing about the answer: a compiled kernel computes the same lanes silently.
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter")
        runtime_knobs.interpret = True
        replaced = interpret_jit_functions([kernel.fn.__globals__, *triton_language_namespaces()])
        try:
            yield InterpretedFunction(kernel.fn)
        finally:
            runtime_knobs.interpret = was_interpreting
            for namespace, originals in replaced:
                namespace.update(originals)


@contextlib.contextmanager
def time_limit(name, seconds):
    """Turn a block that runs past ``seconds`` into an ExerciseError (main thread only: the
    alarm is a signal; elsewhere the block runs unbounded)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def stop(signum, frame):
        raise _TimeUp()

    previous_handler = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _TimeUp:
        raise ExerciseError(
            f"{name}: your kernel ran for more than {seconds:g} s under Triton's interpreter on the checker's small "
            "inputs: does a loop never end (a `while` whose condition never changes, a `range` that never reaches "
            "its end)?") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)


@contextlib.contextmanager
def masked_lanes_as_nan():
    """Interpreted float loads without ``other=`` give NaN in their masked lanes. The
    interpreter gives 0 there, but on a GPU those lanes hold no defined value, so a kernel
    that adds them up must fail here too, whatever the GPU happens to leave in them."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    own = builder.__dict__.get("create_masked_load")
    plain_load = builder.create_masked_load

    def load(ptrs, mask, other, *rest, **options):
        element_type = ptrs.get_element_ty()
        numpy_type = interpreter._get_np_dtype(element_type)
        if other is None and np.issubdtype(numpy_type, np.floating):
            other = interpreter.TensorHandle(np.full(ptrs.data.shape, np.nan, dtype=numpy_type), element_type)
        elif other is None and element_type == tl.bfloat16:  # kept as its raw bits: 0x7FC0 is a NaN
            other = interpreter.TensorHandle(np.full(ptrs.data.shape, 0x7FC0, dtype=numpy_type), element_type)
        return plain_load(ptrs, mask, other, *rest, **options)

    builder.create_masked_load = load
    try:
        yield
    finally:
        if own is None:
            del builder.create_masked_load
        else:
            builder.create_masked_load = own


def run_interpreted(name, launch, kernel, *args, seconds=INTERPRETER_SECONDS, undefined_as_nan=True):
    """``launch(kernel, *args)`` with ``kernel`` interpreted and guarded, within ``seconds``;
    masked float lanes loaded without ``other=`` are NaN unless ``undefined_as_nan`` is False
    (the interpreter's 0: what a hint asks when it tries whether they are the only mistake)."""
    from . import accesses

    undefined = masked_lanes_as_nan() if undefined_as_nan else contextlib.nullcontext()
    with interpreted(kernel) as interpreted_kernel, time_limit(name, seconds), undefined:
        with accesses.guard_accesses(recording=True, force=True):
            return run_student_code(name, launch, interpreted_kernel, *args)


def kernel_runs(name, launch, kernel, *args):
    """Yield ``(how, result)`` for each way the case runs: under the guarded interpreter
    (``how`` is "" without a GPU, where that is the only way), then compiled on the GPU
    (``how`` is "compiled on the GPU"). ``launch(kernel, *args)`` is the checker's launcher;
    it allocates the outputs, so each run writes fresh ones."""
    interpreted_result = run_interpreted(name, launch, kernel, *args)
    if not ON_GPU:
        yield "", interpreted_result
        return
    yield "under the interpreter", interpreted_result
    yield "compiled on the GPU", run_student_code(name, launch, kernel, *args)


def copy_seconds(n_bytes, device="cuda"):
    """The time of copying ``n_bytes`` (read half, write half) with torch: the bandwidth
    ceiling a memory-bound kernel is compared with, measured in the same run."""
    import triton.testing

    half = max(n_bytes // 2 // 4, 1)
    source = torch.empty(half, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    return triton.testing.do_bench(lambda: target.copy_(source), return_mode="median") * 1e-3


def report_speed(name, run, n_bytes, *, against=None, share=0.8, advice=""):
    """Print the kernel's speed on a GPU as a fraction of copy bandwidth. ``run()`` launches
    the student's kernel once on inputs of a size where memory dominates (into outputs
    allocated beforehand); ``n_bytes`` is what one run must read and write; ``against`` is
    ``(label, callable)``, the same work done by the course's kernel or by torch, measured
    beside it. The target is ``share`` of what ``against`` reaches in the same run (so it
    holds on any GPU); below it the line adds ``advice``. Feedback only: it never raises.
    Without a GPU it says why there is no number. Returns the fraction, or None."""
    short = name.split(" (")[0]
    if not ON_GPU:
        print(fit_text(f"{short}, speed: measured on a GPU only (the interpreter runs each program in "
                       "Python, so its time says nothing about the kernel's)."))
        return None
    import triton.testing

    def fraction_of_copy(fn):
        return copy_seconds(n_bytes) / (triton.testing.do_bench(fn, return_mode="median") * 1e-3)

    fraction = fraction_of_copy(run)
    line = f"{short}, speed: {fraction:.2f} of a copy of the same bytes, measured now on this GPU"
    if against is not None:
        label, fn = against
        reference = fraction_of_copy(fn)
        target = share * reference
        line += f"; {label} reaches {reference:.2f} (target {target:.2f}, {share:.0%} of it)"
        if fraction < target and advice:
            line += f". {advice}"
    print(fit_text(line + "."))
    return fraction


def report_throughput(name, run, n_flops, *, against, share=0.8, advice=""):
    """report_speed's sibling for a compute-bound kernel (a matrix multiply, attention on the
    tensor cores), whose time the copy bandwidth does not bound: its speed in TFLOP/s, beside
    ``against`` = ``(label, callable)`` (cuBLAS through torch, or the course's kernel) doing
    the same ``n_flops`` in the same run; the target is ``share`` of it. Feedback only: it
    never raises. Returns the ratio to ``against``, or None without a GPU."""
    short = name.split(" (")[0]
    if not ON_GPU:
        print(fit_text(f"{short}, speed: measured on a GPU only (the interpreter runs each program in "
                       "Python, so its time says nothing about the kernel's)."))
        return None
    import triton.testing

    def tflops(fn):
        return n_flops / (triton.testing.do_bench(fn, return_mode="median") * 1e-3) / 1e12

    label, fn = against
    yours, reference = tflops(run), tflops(fn)
    ratio = yours / reference
    line = (f"{short}, speed: {yours:.0f} TFLOP/s, measured now on this GPU; {label} reaches {reference:.0f} "
            f"(yours {ratio:.2f}× of it; target {share:.2f}×)")
    if ratio < share and advice:
        line += f". {advice}"
    print(fit_text(line + "."))
    return ratio


# --------------------------------------------------------------- what a kernel read


def recorded_run(name, launch, kernel, *args):
    """``(result, launches)``: ``launch(kernel, *args)`` run as :func:`run_interpreted` runs
    it, with what each program read and wrote (``accesses.Launch``, one a launch). The
    interpreter runs it on a GPU machine too, so a verdict drawn from it is the same there."""
    from . import accesses

    with accesses.guard_accesses(recording=True, force=True) as guard:
        result = run_interpreted(name, launch, kernel, *args)
    return result, guard.launches


def element_loads(launches, position=0):
    """How many times each element of a launch's tensor argument was loaded, summed over
    ``launches``: a flat int64 tensor in the argument's element order. ``position`` counts
    the tensor arguments in the kernel's signature (0: the first, its input)."""
    import numpy as np

    counts = None
    for launch in launches:
        argument = list(launch.arguments.values())[position]
        size = int(np.prod(argument.shape, dtype=np.int64))
        counts = np.zeros(size, np.int64) if counts is None else counts
        for access in launch.accesses:
            if access.kind == "load" and access.argument == argument.name and len(access.indices):
                counts += np.bincount(access.indices, minlength=size)[:size]
    return torch.from_numpy(counts if counts is not None else np.zeros(0, np.int64))
