"""Shared by every public function: input checks (clear errors before any launch), and how a call is launched."""

import contextlib

import torch

from .runtime import DEVICE, ON_GPU, describe

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INT32_LIMIT = 2**31 - 1  # kernels index rows and columns with 32-bit integers


def _names(dtypes):
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def check_tensor(op, name, tensor, *, dtypes=FLOAT_DTYPES, min_ndim=1):
    """Check one argument's type, device and dtype; raise saying what is accepted."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != DEVICE.type:
        where = "a CUDA GPU" if ON_GPU else "CPU tensors (Triton's interpreter)"
        raise ValueError(
            f"{op}: {name} is on {tensor.device}, but kernels here run on {where}; "
            f"move it with .to('{DEVICE.type}'). ({describe()})"
        )
    if tensor.dtype not in dtypes:
        raise TypeError(f"{op}: {name} has dtype {tensor.dtype}; accepted: {_names(dtypes)}")
    if tensor.ndim < min_ndim:
        raise ValueError(
            f"{op}: {name} must have at least {min_ndim} dimension(s), got shape {tuple(tensor.shape)}"
        )


def check_same_device_and_dtype(op, **tensors):
    """All named tensors on one device and of one dtype."""
    (first_name, first), *others = tensors.items()
    for name, tensor in others:
        if tensor.device != first.device:
            raise ValueError(
                f"{op}: {name} is on {tensor.device} but {first_name} is on {first.device}; "
                "put them on the same device"
            )
        if tensor.dtype != first.dtype:
            raise TypeError(
                f"{op}: {name} has dtype {tensor.dtype} but {first_name} has {first.dtype}; "
                "cast one so both match"
            )


def check_index_range(op, **sizes):
    """Sizes the kernels index with 32-bit integers must stay below 2**31."""
    for name, size in sizes.items():
        if size > INT32_LIMIT:
            raise ValueError(f"{op}: {name} = {size} is too large; at most {INT32_LIMIT} is supported")


def wants_gradient(*inputs):
    """Whether autograd records this call: grad mode is on and a tensor among ``inputs``
    requires a gradient. When it does not, the public functions call their forward
    launchers directly and skip the autograd.Function's bookkeeping, tens of
    microseconds of host time a call."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs)


def on_device_of(tensor):
    """Launch on the GPU that holds ``tensor`` (it may not be the current one).

    Switching devices costs microseconds of host time on every launch, so it is
    done only when needed."""
    if ON_GPU and tensor.device.index != torch.cuda.current_device():
        return torch.cuda.device(tensor.device)
    return contextlib.nullcontext()
