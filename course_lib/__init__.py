"""Triton kernels derived step by step: the tested kernels of the course.

``runtime`` is imported first: it decides between compiled kernels on a GPU and
Triton's CPU interpreter, which must happen before any ``@triton.jit`` runs.
"""

from . import runtime  # noqa: F401  (must come first)
from .coor_descent import coor_descent
from .layernorm import LayerNorm, layernorm
from .softmax import causal_softmax, softmax
from .weighted_sum import weighted_sum

__all__ = ["runtime", "weighted_sum", "softmax", "causal_softmax", "layernorm", "LayerNorm", "coor_descent"]
__version__ = "0.1.0"
