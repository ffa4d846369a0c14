"""Shared by every public function: input checks (clear errors before any launch), and how a call is launched."""

import contextlib
import functools

import torch
from torch.autograd import forward_ad
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .runtime import DEVICE, ON_GPU, describe, interpreting

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# float64 no kernel computes in: a public function given it computes with its pure-PyTorch
# reference (core.references), on any device, which autograd differentiates to any order
# (gradcheck, gradgradcheck, torch.func). So do CPU tensors where the kernels do not run
# on the CPU (runtime.use_interpreter() not called) and the tensors of torch.func's transforms.
REFERENCE_DTYPE = torch.float64
PUBLIC_DTYPES = (*FLOAT_DTYPES, REFERENCE_DTYPE)
INT32_LIMIT = 2**31 - 1  # kernels index rows and columns with 32-bit integers


def _names(dtypes):
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


def _wraps_others(tensor):
    """Whether ``tensor`` is a tensor subclass that wraps others (TwoTensor, DTensor), whose
    memory a kernel cannot read. Plain tensors answer from their type alone."""
    return type(tensor) not in PLAIN_TENSOR_TYPES and is_traceable_wrapper_subclass(tensor)


def not_a_tensor(op, name, value):
    """The error for an argument that is not a torch.Tensor (a NumPy array, a list)."""
    hint = f"; convert a NumPy array with torch.from_numpy({name})" if type(value).__module__ == "numpy" else ""
    return TypeError(f"{op}: {name} must be a torch.Tensor, got {type(value).__name__}{hint}")


def runs_reference(*tensors):
    """Whether a public function given these arguments (its first tensor first) computes with
    its PyTorch reference instead of its kernels: for float64 (REFERENCE_DTYPE), for a CPU
    tensor unless the kernels run in the interpreter, and where an argument is a tensor of a
    torch.func transform (vmap, grad, jvp) or carries a forward-mode tangent, which the
    kernels cannot compute with."""
    # Called on every call of a public function: the common answer (a CUDA tensor, no
    # transform, no tangent) costs a few attribute reads.
    first = next((t for t in tensors if isinstance(t, torch.Tensor)), None)
    if first is None:
        return False
    if first.dtype == REFERENCE_DTYPE or (not first.is_cuda and first.device.type == "cpu" and not interpreting()):
        return True
    if torch.compiler.is_compiling():
        return False
    tangents = _in_dual_level()
    is_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
    return any(isinstance(t, torch.Tensor) and (is_wrapped(t) or tangents and _carries_tangent(t)) for t in tensors)


def _in_dual_level():
    """Whether a forward_ad.dual_level() is open, so that a tensor may carry a tangent."""
    return getattr(forward_ad, "_current_level", 0) >= 0  # -1 outside every dual level


def plain_inputs(*tensors):
    """Whether the kernels take ``tensors`` (None skipped; the first a tensor) as they are:
    plain tensors (torch.Tensor, nn.Parameter) of a kernel dtype, dense, without lazy bits
    (is_neg, zero tensors), all on one device where the kernels run, and no torch.compile
    tracing, torch.func transform, forward-mode AD or autocast around the call. It is the
    call a training step makes, every step, and this asks one question a tensor of what
    check_tensor and runs_reference ask in many: a public function that gets True passes
    ``plain=True`` to check_tensor, which then checks dimensions alone, and skips
    runs_reference and autocast. False says nothing is wrong: the full checks decide."""
    if (torch.compiler.is_compiling() or _in_dual_level()
            or torch.is_autocast_enabled(DEVICE.type) or not (ON_GPU or interpreting())):
        return False
    first = tensors[0]
    if type(first) not in PLAIN_TENSOR_TYPES:
        return False
    device = first.get_device()  # the GPU's index (-1 off the GPU): no device object made
    is_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
    for t in tensors:
        if t is not None and (
                type(t) not in PLAIN_TENSOR_TYPES or not (t.is_cuda if ON_GPU else t.is_cpu)
                or t.get_device() != device or t.dtype not in FLOAT_DTYPES or t.layout != torch.strided
                or t.is_nested or t.is_neg() or t._is_zerotensor() or is_wrapped(t)):
            return False
    return True


def _carries_tangent(tensor):
    """Whether ``tensor`` carries a forward-mode tangent (torch.autograd.forward_ad)."""
    return (_in_dual_level()
            and isinstance(tensor, torch.Tensor) and forward_ad.unpack_dual(tensor).tangent is not None)


def by_reference(reference, *args, **settings):
    """``reference(*args, **settings)``, a pure-PyTorch reference, as a public function computes
    it where runs_reference says so: float16 and bfloat16 tensors in float32, as the kernels
    compute them, the result back in the first tensor's dtype."""
    widened = [arg.float() if isinstance(arg, torch.Tensor) and arg.dtype in FLOAT_DTYPES[1:] else arg
               for arg in args]
    result = reference(*widened, **settings)
    first = next(arg for arg in args if isinstance(arg, torch.Tensor))
    return result.to(first.dtype)


# Where autocast is on, course_lib's functions compute in the dtype torch's own operations
# would: on CUDA, softmax and layer_norm in float32 (autocast's "fp32" list); on CUDA and the
# CPU, matrix products and attention in autocast's dtype ("lower precision" list).
def _autocasting(tensors):
    first = next((t for t in tensors if isinstance(t, torch.Tensor)), None)
    if first is None:
        return None
    device = "cuda" if first.is_cuda else first.device.type  # is_cuda: no device object made
    return device if device in ("cuda", "cpu") and torch.is_autocast_enabled(device) else None


def _cast(tensors, dtype):
    # float64 stays, as autocast leaves it; anything else is for the checks to name
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.dtype in FLOAT_DTYPES else t for t in tensors)


def autocast_as_float32_ops(*tensors):
    """``tensors`` as autocast casts the inputs of softmax and layer_norm: to float32 under
    CUDA autocast, unchanged otherwise."""
    return _cast(tensors, torch.float32) if _autocasting(tensors) == "cuda" else tensors


def autocast_as_matmul(*tensors):
    """``tensors`` as autocast casts the inputs of a matrix product: to its dtype
    (torch.get_autocast_dtype) where it is on, unchanged otherwise."""
    device = _autocasting(tensors)
    return _cast(tensors, torch.get_autocast_dtype(device)) if device else tensors


def check_tensor(op, name, tensor, *, dtypes=FLOAT_DTYPES, min_ndim=1, plain=False):
    """Check one argument's type, device and dtype; raise saying what is accepted. A float64
    tensor, where ``dtypes`` accept it, is computed by PyTorch's own operations (the
    references): any device and torch.func's transforms are fine then. ``plain``:
    plain_inputs said so of the call's tensors, which leaves its dtype and dimensions."""
    if plain and tensor.dtype in dtypes:
        _check_ndim(op, name, tensor, min_ndim)
        return
    if not isinstance(tensor, torch.Tensor):
        raise not_a_tensor(op, name, tensor)
    if tensor.layout != torch.strided:
        raise TypeError(
            f"{op}: {name} has layout {tensor.layout}; only dense tensors (torch.strided) are accepted, "
            f"so convert it with {name}.to_dense()"
        )
    if tensor.is_nested:  # a nested tensor of the older kind reports the strided layout
        raise TypeError(
            f"{op}: {name} is a nested tensor; only dense tensors are accepted, so pad it with "
            f"torch.nested.to_padded_tensor({name}, 0.0) (and pass a mask where the function takes one)"
        )
    if tensor.dtype in dtypes and runs_reference(tensor) and not tensor.is_quantized:
        _check_ndim(op, name, tensor, min_ndim)  # PyTorch's own operations take any device and strides
        return
    if tensor.is_quantized:
        raise TypeError(
            f"{op}: {name} is quantized ({tensor.dtype}); accepted: {_names(dtypes)} tensors, "
            f"so convert it with {name}.dequantize()"
        )
    if tensor.device.type != DEVICE.type:
        where = ("a CUDA GPU, and CPU tensors by PyTorch" if ON_GPU else
                 "CPU tensors (Triton's interpreter)" if interpreting() else "CPU tensors (PyTorch's operations)")
        raise ValueError(
            f"{op}: {name} is on {tensor.device}, but kernels here run on {where}; "
            f"move it with .to('{DEVICE.type}'). ({describe()})"
        )
    if tensor.dtype not in dtypes:
        raise TypeError(f"{op}: {name} has dtype {tensor.dtype}; accepted: {_names(dtypes)}")
    # Bits that change what the memory means without changing it: a kernel reads the memory.
    # (Traced, torch.compile materializes them itself, and cannot trace these queries.)
    if not torch.compiler.is_compiling():
        if _wraps_others(tensor):
            raise TypeError(f"{op}: {name} is a {type(tensor).__name__}, a tensor subclass that wraps others, "
                            f"whose memory the kernels cannot read; pass a plain torch.Tensor")
        if tensor.is_neg():
            raise ValueError(f"{op}: {name} is a lazily negated view (its is_neg() bit is set, as after "
                             f".conj().imag); pass {name}.resolve_neg()")
        if tensor._is_zerotensor():
            raise ValueError(f"{op}: {name} is a zero tensor without memory (torch._efficientzerotensor); "
                             f"pass torch.zeros_like({name})")
    _check_ndim(op, name, tensor, min_ndim)


def _check_ndim(op, name, tensor, min_ndim):
    if tensor.ndim < min_ndim:
        raise ValueError(
            f"{op}: {name} must have at least {min_ndim} dimension(s), got shape {tuple(tensor.shape)}"
        )


def check_same_device(op, **tensors):
    """All named tensors on one device."""
    (first_name, first), *others = tensors.items()
    for name, tensor in others:
        if tensor.device != first.device:
            raise ValueError(
                f"{op}: {name} is on {tensor.device} but {first_name} is on {first.device}; "
                "put them on the same device"
            )


def check_same_device_and_dtype(op, **tensors):
    """All named tensors on one device and of one dtype."""
    check_same_device(op, **tensors)
    (first_name, first), *others = tensors.items()
    for name, tensor in others:
        if tensor.dtype != first.dtype:
            raise TypeError(
                f"{op}: {name} has dtype {tensor.dtype} but {first_name} has {first.dtype}; "
                "cast one so both match"
            )


def check_like(op, name, tensor, shape, like, *, dtype=None, contiguous=False):
    """``tensor`` a dense tensor of ``shape`` on ``like``'s device, of ``dtype`` (by default
    ``like``'s), ``contiguous`` where the kernels index it so: what a backward operator
    checks of the tensors the forward saved, so that one called directly never reads
    memory it was not given."""
    dtypes = (like.dtype,) if dtype is None else dtype if isinstance(dtype, tuple) else (dtype,)
    check_tensor(op, name, tensor, dtypes=dtypes, min_ndim=0)
    check_same_device(op, **{"the input": like, name: tensor})
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{op}: {name} must have shape {tuple(shape)}, got {tuple(tensor.shape)}")
    if contiguous and not tensor.is_contiguous():
        raise ValueError(f"{op}: {name} must be contiguous, as the forward wrote it; got strides {tensor.stride()}")


def check_anchor(op, anchor, like):
    """The ``anchor`` of an anchored backward operator (core.operator): a float tensor of any
    shape on ``like``'s device, which its kernels take and never read."""
    check_tensor(op, "anchor", anchor, min_ndim=0)
    check_same_device(op, **{"the input": like, "anchor": anchor})


def check_index_range(op, **sizes):
    """Sizes the kernels index with 32-bit integers must stay below 2**31."""
    for name, size in sizes.items():
        if size > INT32_LIMIT:
            raise ValueError(f"{op}: {name} = {size} is too large; at most {INT32_LIMIT} is supported")


def wants_gradient(op, names, tensors):
    """Whether autograd records this call: grad mode is on and one of ``tensors`` (called
    ``names`` in errors) requires a gradient. When it does not, the public functions call their forward
    launchers directly and skip the autograd.Function's bookkeeping, tens of
    microseconds of host time a call.

    Forward-mode AD is refused here, before that shortcut could drop a tangent: the
    kernels compute values and reverse-mode gradients only (the public functions send
    tangents to their references first: runs_reference)."""
    for name, tensor in zip(names, tensors) if _in_dual_level() else ():
        if _carries_tangent(tensor):
            raise NotImplementedError(
                f"{op}: {name} carries a forward-mode tangent (torch.autograd.forward_ad), and "
                "course_lib's kernels support reverse-mode gradients only (backward, torch.autograd.grad)"
            )
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def _readable_gradient(op, grad):
    """An incoming gradient as memory the kernels can read: a lazily negated view (is_neg())
    resolved (free when the bit is unset), a zero tensor without memory made real zeros; a
    tensor subclass that wraps others refused, naming the function."""
    if not isinstance(grad, torch.Tensor):
        return grad
    if _wraps_others(grad):
        raise TypeError(f"{op}: the gradient flowing into its backward is a {type(grad).__name__}, a tensor "
                        "subclass that wraps others, whose memory the kernels cannot read; pass a plain torch.Tensor")
    if grad._is_zerotensor():
        return torch.zeros(grad.shape, device=grad.device, dtype=grad.dtype)
    return grad.resolve_neg()


def first_order_only(op):
    """Decorate an autograd.Function's backward whose gradients are not themselves
    differentiable (they come from kernels, not from torch operations).

    With ``create_graph=True`` the gradients it returns are marked so that differentiating
    them again raises an error naming ``op``, as torch's ``once_differentiable`` does, but
    also when the incoming gradient is a constant: there once_differentiable returns them
    detached, and a gradient penalty built on them would silently lose its second-order
    terms."""
    message = (
        f"{op}: second-order gradients are not supported; its backward runs Triton kernels "
        "that autograd cannot differentiate again (a gradient of a gradient, create_graph=True)"
    ).encode()

    def decorate(backward):
        @functools.wraps(backward)
        def wrapper(ctx, *grad_outputs):
            grad_outputs = tuple(_readable_gradient(op, g) for g in grad_outputs)
            if not torch.is_grad_enabled():  # create_graph=False: nothing records the gradients
                return backward(ctx, *grad_outputs)
            with torch.no_grad():
                grads = backward(ctx, *grad_outputs)
            tensors = [g for g in grads if isinstance(g, torch.Tensor)]
            # The error node also takes the saved tensors that lead back to the inputs, so
            # that a gradient of these gradients toward a chosen input (autograd.grad(g, x))
            # reaches it and raises, rather than finding x unused and returning None.
            anchors = [t for t in (*ctx.saved_tensors, *getattr(ctx, "inputs_needing_grad", ()))
                       if isinstance(t, torch.Tensor) and t.requires_grad]
            failing = torch._C._functions.DelayedError(message, len(tensors) + len(anchors))(
                *(g.detach().requires_grad_() for g in tensors), *anchors
            )
            failing = iter(failing if isinstance(failing, tuple) else (failing,))
            return tuple(next(failing) if isinstance(g, torch.Tensor) else g for g in grads)

        return wrapper

    return decorate


@functools.cache
def first_order_only_as(function, op):
    """``function``, an autograd.Function whose backward first_order_only decorates, as
    another public caller ``op`` calls it (causal_softmax, LayerNorm): the same Function but
    for its errors, which name op. Named as ``function``, as profiles and autograd's nodes show it."""
    class Named(function):
        backward = staticmethod(first_order_only(op)(function.backward.__wrapped__))

    Named.__name__ = Named.__qualname__ = function.__name__
    return Named


def held_for_first_order_only(*inputs):
    """What a Function's forward keeps as ``ctx.inputs_needing_grad`` for first_order_only,
    whose error a gradient of a gradient toward any input must reach: the inputs that
    require grad and are leaves (autograd holds them anyway) or vectors (γ, β, a weight:
    small). Not a computed activation, which would stay alive until the backward: the
    functions reach those through what they save (the input itself, or the output,
    whose node leads back to it)."""
    return tuple(t for t in inputs
                 if isinstance(t, torch.Tensor) and t.requires_grad and (t.is_leaf or t.ndim <= 1))


def on_device_of(tensor):
    """Launch on the GPU that holds ``tensor`` (it may not be the current one).

    Switching devices costs microseconds of host time on every launch, so it is
    done only when needed."""
    if ON_GPU and tensor.get_device() != torch._C._cuda_getDevice():  # torch.cuda.current_device's own query
        return torch.cuda.device(tensor.device)
    return contextlib.nullcontext()
