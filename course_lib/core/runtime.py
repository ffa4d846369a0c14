"""Where course_lib's kernels run, and the one switch to Triton's CPU interpreter.

On a CUDA GPU of compute capability 8.0 or newer the kernels are compiled. Elsewhere (no
GPU, or one Triton does not support, such as Colab's T4) course_lib computes CPU tensors
with its PyTorch references (``core.references``): fast, and differentiable to any
order. The course's notebooks and tests run the kernels themselves there, in Triton's
CPU interpreter, by calling :func:`use_interpreter` first (or by setting
``TRITON_INTERPRET=1`` before importing course_lib); :func:`stop_interpreter` undoes it.

Importing this module changes nothing in ``triton`` or ``torch``: whatever the
interpreter needs is installed by that call, and put back by its undo.
"""

import contextlib
import functools
import math
import os
import sys
import threading
import warnings

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor

MIN_CAPABILITY = (8, 0)


def _choose_backend():
    """Return (use_gpu, reason) without touching Triton."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False, "TRITON_INTERPRET=1 is set"
    if not torch.cuda.is_available():
        return False, "no CUDA GPU was found"
    capability = torch.cuda.get_device_capability()
    if capability < MIN_CAPABILITY:
        name = torch.cuda.get_device_name()
        reason = (
            f"the GPU {name} has compute capability {capability[0]}.{capability[1]}, "
            f"and Triton needs {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer "
            "(an A100, L4, RTX 30xx or later)"
        )
        warnings.warn(
            f"course_lib: {reason}; CPU tensors are computed by PyTorch instead (or by the kernels in "
            "Triton's CPU interpreter, at small sizes, after course_lib.runtime.use_interpreter()). "
            "On Colab choose an A100 or L4 runtime to use the GPU.",
            stacklevel=3,
        )
        return False, reason
    return True, torch.cuda.get_device_name()


def triton_language_namespaces():
    """The namespaces of triton.language's modules, where Triton's own ``@jit`` helpers live."""
    return [vars(module) for name, module in list(sys.modules.items())
            if name.startswith("triton.language") and module is not None]


def interpret_jit_functions(namespaces):
    """Replace each ``@jit`` function held in these namespaces (dicts), and in the globals of
    the functions replaced, by the interpreted function of its Python source, one object
    for each. Returns ``[(namespace, {name: original})]``, what to put back to undo it."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    interpreted, replaced, seen = {}, [], set()
    pending = list(namespaces)
    while pending:
        namespace = pending.pop()
        if id(namespace) in seen:
            continue
        seen.add(id(namespace))
        originals = {key: value for key, value in namespace.items() if isinstance(value, JITFunction)}
        for key, function in originals.items():
            if id(function) not in interpreted:
                interpreted[id(function)] = InterpretedFunction(function.fn)
                pending.append(function.fn.__globals__)
            namespace[key] = interpreted[id(function)]
        replaced.append((namespace, originals))
    return replaced


def _index_of_one_element(tensor):
    """An interpreted scalar as a Python int (``range(0, n_rows, BLOCK)`` in a kernel)."""
    return int(tensor.handle.data.reshape(-1)[0])


@contextlib.contextmanager
def interpreter_patches_undone():
    """Undo, when the block ends, every attribute Triton's interpreter patched inside it.

    The interpreter swaps triton.language's builtins for its own while it runs. A launch
    puts them back, but a ``@jit`` helper called from an interpreted kernel patches the
    modules of its own globals and leaves them so (harmless when everything is
    interpreted). On a GPU machine the next *compiled* kernel would then meet interpreter
    functions and fail to compile, so the first value of each patched attribute is kept
    and put back at the end, whatever order the interpreter's own restores ran in."""
    from triton.runtime import interpreter

    scope_type = getattr(interpreter, "_LangPatchScope", None)
    if scope_type is None:  # a Triton whose interpreter keeps no record: nothing to hook
        yield
        return
    missing, first_values, set_attr = object(), {}, scope_type.set_attr

    def recording_set_attr(self, obj, name, value):
        first_values.setdefault((id(obj), name), (obj, name, getattr(obj, name, missing)))
        if name == "__index__":  # Triton 3.6 converts a one-element array with int(), which NumPy 2.4 refuses
            value = _index_of_one_element
        set_attr(self, obj, name, value)

    scope_type.set_attr = recording_set_attr
    try:
        yield
    finally:
        scope_type.set_attr = set_attr
        for obj, name, value in first_values.values():
            if value is missing:
                if hasattr(obj, name):
                    delattr(obj, name)
            else:
                setattr(obj, name, value)


def interpreter_computes_bfloat16():
    """Make the interpreter compute bfloat16 tiles as a GPU does (idempotent).

    The interpreter keeps a bfloat16 tile as its raw 16 bits (NumPy has no bfloat16), and
    its ``tl.dot``, arithmetic and math functions then work on those bits as integers:
    garbage, where a GPU computes. Triton 3.6 and 3.7 also have no bfloat16 scalars, so
    ``tile * scale`` stops. And a float argument stays a Python number, which takes the other
    operand's dtype, where a compiled kernel takes it as a float32 scalar: ``q * scale`` is
    bfloat16 there and float32 on a GPU; here it is float32 as on a GPU. Each bfloat16
    operation widens its bfloat16 operands to float32
    (exact: a bfloat16 is the top half of a float32), computes, and rounds a bfloat16 result
    back to nearest even, so a right bfloat16 kernel is right under the interpreter too.
    Returns a function that puts Triton's own operations back (None if already done)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    if getattr(InterpreterBuilder, "computes_bfloat16", False):
        return None
    comparisons = {np.less, np.greater, np.less_equal, np.greater_equal, np.equal, np.not_equal}

    def is_bfloat16(handle):
        return handle.dtype.scalar == tl.bfloat16

    def widened(handle):
        if not is_bfloat16(handle):
            return handle
        return TensorHandle((handle.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

    def narrowed(handle):
        values = np.asarray(handle.data, dtype=np.float32)
        bits = values.view(np.uint32)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        return TensorHandle(np.where(np.isnan(values), np.uint16(0x7FC0), rounded), tl.bfloat16)

    create_dot, binary_op, unary_op, create_fma = (InterpreterBuilder.create_dot, InterpreterBuilder.binary_op,
                                                   InterpreterBuilder.unary_op, InterpreterBuilder.create_fma)

    def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return create_dot(self, widened(a), widened(b), d, input_precision, max_num_imprecise_acc)

    def binary(self, lhs, rhs, op):
        if not (is_bfloat16(lhs) and is_bfloat16(rhs)):
            return binary_op(self, lhs, rhs, op)
        result = binary_op(self, widened(lhs), widened(rhs), op)
        return result if op in comparisons else narrowed(result)

    def unary(self, arg, op):
        return narrowed(unary_op(self, widened(arg), op)) if is_bfloat16(arg) else unary_op(self, arg, op)

    def fma(self, x, y, z):
        if not is_bfloat16(z):
            return create_fma(self, x, y, z)
        return narrowed(create_fma(self, widened(x), widened(y), widened(z)))

    def get_bf16(self, value):
        return narrowed(TensorHandle(np.array([value], dtype=np.float32), tl.float32))

    from triton.runtime import interpreter

    implicit_cvt = interpreter._implicit_cvt

    def float_arguments_as_float32(arg):
        # A compiled kernel takes a Python float argument as an fp32 scalar (bf16 * it is fp32);
        # the interpreter kept it a Python number, a literal that takes the other operand's dtype.
        if type(arg) is float:
            return tl.tensor(TensorHandle(np.array([arg], dtype=np.float32), tl.float32), tl.float32)
        return implicit_cvt(arg)

    replaced = {"create_dot": dot, "binary_op": binary, "unary_op": unary, "create_fma": fma}
    if not hasattr(InterpreterBuilder, "get_bf16"):  # Triton 3.6 and 3.7 have none
        replaced["get_bf16"] = get_bf16
    originals = {name: InterpreterBuilder.__dict__.get(name) for name in replaced}
    for name, function in replaced.items():
        original = originals[name]
        setattr(InterpreterBuilder, name, functools.wraps(original)(function) if original else function)
    InterpreterBuilder.computes_bfloat16 = True
    interpreter._implicit_cvt = float_arguments_as_float32

    def undo():
        interpreter._implicit_cvt = implicit_cvt
        for name, original in originals.items():
            if original is None:
                delattr(InterpreterBuilder, name)
            else:
                setattr(InterpreterBuilder, name, original)
        del InterpreterBuilder.computes_bfloat16

    return undo


ON_GPU, _REASON = _choose_backend()

import triton  # noqa: E402

try:  # host-side TMA descriptors (Triton 3.4 and later), which launch() keys its kernels by
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:
    class TensorDescriptor:  # no instance of it exists
        pass


def _wrap_triton_takes_interpreted_kernels():
    """Under the interpreter, let ``torch.library.wrap_triton`` take an interpreted kernel.

    torch 2.13 accepts one; torch 2.11 refuses anything but a compiled-mode ``@triton.jit``
    function. Under the interpreter a kernel launched through it runs eagerly, inside a
    ``custom_op`` whose fake implementation stands in for it when traced (chapter 5), so the
    kernel itself, launched as ``kernel[grid]``, is what wrap_triton should give back.
    Returns a function that puts torch's own back."""
    from triton.runtime.interpreter import InterpretedFunction

    torch_wrap_triton = torch.library.wrap_triton

    @functools.wraps(torch_wrap_triton)
    def wrap_triton(fn):
        try:
            return torch_wrap_triton(fn)
        except RuntimeError:
            if isinstance(fn, InterpretedFunction):
                return fn
            raise

    torch.library.wrap_triton = wrap_triton

    def undo():
        torch.library.wrap_triton = torch_wrap_triton

    return undo


def _version(text):
    return tuple(int(part) for part in text.split("+")[0].split(".")[:2] if part.isdigit())


def _check_interpreter_numpy(triton_version, numpy_version):
    """Triton 3.6's interpreter and older fail inside every loop of a kernel (``tl.range``)
    with numpy 2.4 or newer: "only 0-dimensional arrays can be converted to Python
    scalars". Say so at import, with the fix, rather than there."""
    if _version(triton_version) < (3, 7) and _version(numpy_version) >= (2, 4):
        raise ImportError(
            f"course_lib: Triton {triton_version}'s CPU interpreter does not work with numpy "
            f"{numpy_version}; install numpy<2.4 (pip install 'numpy<2.4') or Triton 3.7 or newer"
        )


DEVICE = torch.device("cuda") if ON_GPU else torch.device("cpu")


def course_lib_namespaces():
    """The namespaces of course_lib's imported modules, where its kernels and their @jit helpers live."""
    return [vars(module) for name, module in list(sys.modules.items())
            if (name == "course_lib" or name.startswith("course_lib.")) and module is not None]


_interpreter_undo = []  # what use_interpreter changed, as functions that put it back, in order


def use_interpreter():
    """Run course_lib's kernels in Triton's CPU interpreter, on CPU tensors, where no GPU
    compiles them: what the course's notebooks and tests call first. Without it course_lib
    computes CPU tensors with its PyTorch references instead.

    From this call on, ``@triton.jit`` kernels defined anywhere are interpreted too
    (``TRITON_INTERPRET=1`` is set, which Triton reads when it decorates one); the kernels
    already defined (course_lib's, and Triton's own ``@jit`` helpers such as ``tl.sum``) are
    replaced by their interpreted functions; ``torch.library.wrap_triton`` takes interpreted
    kernels (torch 2.11 refuses them); the interpreter computes bfloat16 tiles as a GPU does
    (:func:`interpreter_computes_bfloat16`). :func:`stop_interpreter` puts all of it back,
    and what the interpreter patched in triton.language while kernels ran.

    Returns True when kernels now run in the interpreter. On a machine whose GPU compiles
    them it changes nothing and returns False: to interpret there, set
    ``TRITON_INTERPRET=1`` before importing course_lib.
    """
    if ON_GPU:
        return False
    if _interpreter_undo:
        return True
    import numpy

    _check_interpreter_numpy(triton.__version__, numpy.__version__)
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    _interpreter_undo.append(lambda: os.environ.pop("TRITON_INTERPRET", None) if previous is None
                             else os.environ.__setitem__("TRITON_INTERPRET", previous))
    patches = contextlib.ExitStack()  # what the interpreter patches as kernels run, put back at the end
    patches.enter_context(interpreter_patches_undone())
    _interpreter_undo.append(patches.close)
    replaced = interpret_jit_functions([*triton_language_namespaces(), *course_lib_namespaces()])
    _interpreter_undo.append(lambda: [namespace.update(originals) for namespace, originals in replaced])
    _interpreter_undo.append(_wrap_triton_takes_interpreted_kernels())
    undo_bfloat16 = interpreter_computes_bfloat16()
    if undo_bfloat16 is not None:
        _interpreter_undo.append(undo_bfloat16)
    return True


def stop_interpreter():
    """Undo :func:`use_interpreter`: Triton, torch and the environment as they were, and
    course_lib's kernels compiled-mode functions again (CPU tensors then take the
    references). Kernels decorated while the interpreter was on stay interpreted."""
    while _interpreter_undo:
        _interpreter_undo.pop()()


def interpreting():
    """Whether course_lib's kernels run in Triton's interpreter now (:func:`use_interpreter`,
    in this copy of course_lib or another the process loaded, or ``TRITON_INTERPRET=1``)."""
    return not ON_GPU and os.environ.get("TRITON_INTERPRET") == "1"


def upcasts_dot(dtype):
    """A kernel's UPCAST_DOT for operands of ``dtype``: whether its products take float32
    copies of the tiles. Triton's interpreter multiplies bfloat16 tiles wrongly (Triton 3.6:
    errors of 1e10 on values near 1), so off the GPU bfloat16 products are made in float32."""
    return not ON_GPU and dtype == torch.bfloat16


def describe():
    """One line saying where kernels run and with which Triton."""
    if ON_GPU:
        major, minor = torch.cuda.get_device_capability()
        return (
            f"course_lib: Triton {triton.__version__} kernels compiled for {_REASON} "
            f"(compute capability {major}.{minor}), torch {torch.__version__}"
        )
    if interpreting():
        return (
            f"course_lib: Triton {triton.__version__} kernels run in the CPU interpreter "
            f"because {_REASON}; torch {torch.__version__}"
        )
    return (
        f"course_lib: {_REASON}, so CPU tensors are computed by the PyTorch references "
        f"(runtime.use_interpreter() runs the Triton {triton.__version__} kernels in the CPU "
        f"interpreter instead); torch {torch.__version__}"
    )


def gpu_name():
    """The GPU's name, or 'cpu-interpreter' (no GPU: where the course runs its kernels)."""
    return torch.cuda.get_device_name() if ON_GPU else "cpu-interpreter"


@functools.cache  # launchers ask on every call; the device query costs microseconds
def multiprocessor_count():
    """How many programs can run at once, roughly: the SM count on a GPU."""
    if ON_GPU:
        return torch.cuda.get_device_properties(DEVICE).multi_processor_count
    return 4  # the interpreter runs programs one by one; a few keep grids small


@functools.cache
def max_shared_memory():
    """Bytes of shared memory one program may use: Triton's own limit for this GPU.

    Pipelined loops keep their next tiles there, so launchers ask before pipelining
    deep; the interpreter has no such limit.
    """
    if ON_GPU:
        return triton.runtime.driver.active.utils.get_device_properties(DEVICE.index or 0)["max_shared_mem"]
    return math.inf


# ------------------------------------------------------------------------- launches
# kernel[grid](...) does the same work on every call before it launches: it binds the
# arguments, works out how each one specialises the kernel (dtypes, which integers are
# 1 or multiples of 16, which pointers are 16-byte aligned), builds a cache key from
# that and finds the compiled kernel: microseconds of host time on every launch
# (chapter 5 measures them), when many of the course's kernels run for a few tens.
# ``launch`` keeps the compiled kernel of each specialisation and launches it directly.
#
# The key holds everything Triton specialises on, and more: a launch either finds a
# kernel compiled for exactly these facts, or goes through kernel[grid] to compile one.
# The direct call uses Triton's launcher interface, which changes between releases, so
# it is taken only on the releases it was checked on; elsewhere launch is kernel[grid].
#
# Under torch.compile the launchers run once more, at compile time, on fake tensors
# (the bodies of the operators kernel_operator makes): there ``launch`` records the
# kernel through torch.library.wrap_triton, and inductor then launches it itself, from
# its own generated code, without any of this Python.
DIRECT_LAUNCH_TRITON = ("3.6.",)


def direct_launch_supported(triton_version):
    """Whether ``launch`` may call this Triton release's compiled kernels directly (a
    private interface, checked release by release); elsewhere it takes kernel[grid]."""
    return triton_version.startswith(DIRECT_LAUNCH_TRITON)


_direct_launch = ON_GPU and direct_launch_supported(triton.__version__)
_compiled_kernels = {}
# Triton's interpreter keeps the running grid in globals: two threads launching at once
# read each other's programs (wrong values, or errors from inside Triton), so there
# launches take turns. Compiled kernels launch from any thread as they come.
_kernel_grid_guard = contextlib.nullcontext() if ON_GPU else threading.Lock()


def _signature(args):
    """What Triton compiles a launch of ``args`` for, and more, in one pass over them (a
    launch's host time counts): each tensor's dtype and whether it starts 16-byte aligned,
    each tensor descriptor's dtype, block shape and padding (Triton makes the TMA
    descriptor itself from its shape and strides at every launch), each other argument's
    type and value (an integer's value fixes whether it is 1, a multiple of 16, beyond 32
    bits; its type tells True from 1)."""
    return tuple([(arg.dtype, arg.data_ptr() & 15 == 0) if isinstance(arg, torch.Tensor)
                  else (arg.__class__, arg.base.dtype, tuple(arg.block_shape), arg.padding)
                  if isinstance(arg, TensorDescriptor) else (arg.__class__, arg)
                  for arg in args])


def kernel_operator(name):
    """Decorator: ``fn``, which allocates tensors and calls ``launch``, as the operator
    ``name`` for torch.compile. On a GPU a torch.library.triton_op, whose body inductor
    sees through. Under the interpreter wrap_triton cannot record kernels, so there it
    is an opaque torch.library.custom_op, and the same body, launching nothing on fake
    tensors, is its fake implementation."""
    def decorate(fn):
        if ON_GPU:
            return torch.library.triton_op(name, fn, mutates_args=())
        operator = torch.library.custom_op(name, fn, mutates_args=())
        operator.register_fake(fn)
        return operator
    return decorate


def is_traced(tensor):
    """Whether ``tensor`` is one torch.compile or opcheck traces with (no data behind it)."""
    return isinstance(tensor, (FakeTensor, FunctionalTensor))


@functools.cache
def cooperative_launch_supported():
    """Whether this Triton can launch a grid cooperatively: CUDA then runs the launch only
    with every program resident at once, whatever else shares the GPU (another stream,
    another process through MPS), and refuses a grid that cannot be."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    return "launch_cooperative_grid" in getattr(CUDAOptions, "__dataclass_fields__", {})


def spin_waits_allowed(tensor):
    """Whether programs of one launch on ``tensor`` may wait on each other (split rows).

    Only where every program is guaranteed resident while others wait: a cooperative launch
    (``launch(..., cooperative=True)``) on a GPU. Not in the interpreter, which runs the
    programs one after another, and not while torch.compile traces, whose launches are not
    cooperative: the callers take their two-launch paths there."""
    return ON_GPU and cooperative_launch_supported() and not is_traced(tensor)


def is_cooperative_refusal(error):
    """Whether a launch failed because CUDA could not make its programs resident at once
    (fewer multiprocessors than the grid needs: an MPS share, a MIG slice, a smaller GPU)."""
    return "cooperative" in str(error).lower()


def is_16_byte_aligned(tensor):
    """Whether the tensor's first element sits on a 16-byte boundary. Traced, from its
    offset into the storage, which the caching allocator starts aligned."""
    if is_traced(tensor):
        return tensor.storage_offset() * tensor.element_size() % 16 == 0
    return tensor.data_ptr() % 16 == 0


def launch(kernel, grid, *args, num_warps=4, num_stages=None, maxnreg=None, cooperative=False, **constexprs):
    """``kernel[grid](*args, **constexprs, num_warps=..., ...)``, without its per-call work
    after the first launch of each specialisation (Triton 3.6 on a GPU). ``args`` are the
    kernel's runtime arguments in order; ``constexprs`` its tl.constexpr ones, by name.
    ``cooperative``: all programs resident at once or no launch (see spin_waits_allowed,
    which callers ask first)."""
    options = {"num_warps": num_warps}
    if cooperative:
        if not spin_waits_allowed(args[0]):
            raise RuntimeError(f"{kernel.__name__}: a cooperative launch needs a GPU, a Triton that has it, "
                               "and no torch.compile tracing (spin_waits_allowed)")
        options["launch_cooperative_grid"] = True
    if num_stages is not None:
        options["num_stages"] = num_stages
    if is_traced(args[0]):  # every kernel's first argument is a tensor
        if ON_GPU:  # inductor compiles the kernel with its own options, which have no register limit
            torch.library.wrap_triton(kernel)[grid](*args, **constexprs, **options)
        return  # under the interpreter: a fake implementation, which only shapes the outputs
    if maxnreg is not None:
        options["maxnreg"] = maxnreg
    if not _direct_launch:  # always so under the interpreter
        with _kernel_grid_guard:
            kernel[grid](*args, **constexprs, **options)
        return
    key = (kernel, _signature(args), *constexprs.items(), num_warps, num_stages, maxnreg, cooperative)
    found = _compiled_kernels.get(key)
    if found is None:
        compiled = kernel[grid](*args, **constexprs, **options)
        # Constexprs go to the launcher too, in the kernel's parameter order, defaults included.
        values = tuple(constexprs.get(p.name, p.default) for p in kernel.params[len(args):])
        _compiled_kernels[key] = compiled, values
        return
    _launch_compiled(*found, grid, args)


def _launch_compiled(compiled, values, grid, args):
    """The one place that calls Triton's private launcher interface (Triton 3.6's
    ``CompiledKernel.run``), as kernel[grid] would after finding ``compiled``; ``values``
    are the constexprs the launcher takes after ``args``."""
    stream = torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice())  # what Triton's driver asks
    enter, exit_ = triton.knobs.runtime.launch_enter_hook, triton.knobs.runtime.launch_exit_hook
    if enter.calls or exit_.calls:  # a profiler's hooks: passed as kernel[grid] passes them
        metadata = compiled.launch_metadata(grid, stream, *args, *values)
    else:  # none: kernel[grid] would still build their metadata and call both empty chains
        metadata = enter = exit_ = None
    compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream,
                 compiled.function, compiled.packed_metadata, metadata, enter, exit_, *args, *values)


@contextlib.contextmanager
def kernel_grid_launches():
    """Inside this block every launch goes through kernel[grid], as if ``launch`` did not
    keep compiled kernels: what it saves can be measured in the same run."""
    global _direct_launch
    saved, _direct_launch = _direct_launch, False
    try:
        yield
    finally:
        _direct_launch = saved


def pick(*, gpu, cpu):
    """Choose a size: realistic on a GPU, small under the interpreter."""
    return gpu if ON_GPU else cpu


# Host-side integer helpers for launchers. triton.cdiv and triton.next_power_of_2 do
# the same and also work inside kernels, but on the host they cost several times as
# much as these; a launcher makes several such calls on every call.
def cdiv(a, b):
    """Ceiling division of non-negative integers: how many blocks of b cover a."""
    return -(-a // b)


def next_power_of_2(n):
    """The smallest power of 2 that is at least n >= 1 (0 for 0, as triton's)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


if os.environ.get("TRITON_INTERPRET") == "1":  # asked for before the import: the same as the call
    use_interpreter()
