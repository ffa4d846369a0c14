"""Small helpers the chapters' notebooks share."""

import inspect


def source_of(obj):
    """Source code of a function, class or Triton kernel (compiled or interpreted)."""
    # @triton.jit wraps the Python function in a JITFunction (GPU) or an
    # InterpretedFunction (interpreter); both keep it as `.fn`.
    return inspect.getsource(getattr(obj, "fn", obj))


def show_source(*objects):
    """Print the source of each object, as the book shows the finished kernels."""
    print("\n\n".join(source_of(obj).rstrip() for obj in objects))
