"""Triton kernels derived step by step: the tested kernels of the course.

The package is four rooms, each importing only from the rooms below it:

- ``course_lib.teaching``: exercises and their checkers, the access recorder, notebook
  helpers, instructor tools;
- ``course_lib.models``: CoLT5's routed block and chapter 7's recall task;
- ``course_lib.kernels``: one module a kernel;
- ``course_lib.core``: runtime, validation, row helpers, launch plans, the operator
  helper, the references and the benchmark harness.

``registry`` lists the kernels for the benchmarks, the GPU run and the tests.
Everything a user calls is importable from ``course_lib`` itself.

Importing the package changes nothing in ``triton`` or ``torch``. Without a GPU the kernels'
functions compute CPU tensors with their PyTorch references; ``runtime.use_interpreter()``
runs the kernels there in Triton's CPU interpreter instead (the notebooks and tests call it).
"""

from .core import runtime  # noqa: F401
from .kernels import (MAX_HEAD_DIM, LayerNorm, causal_softmax, coor_descent, layer_norm, layernorm,
                      local_causal_attention, matmul, softmax, weighted_sum)
from .models import (CoordinateDescentRouter, RecallModel, RecallTask, RoutedBlock, recall_batch, top_k_routing,
                     train_recall)

__all__ = ["runtime", "weighted_sum", "softmax", "causal_softmax", "layernorm", "layer_norm", "LayerNorm",
           "coor_descent", "local_causal_attention", "MAX_HEAD_DIM", "matmul", "RoutedBlock", "CoordinateDescentRouter",
           "top_k_routing", "RecallTask", "RecallModel", "recall_batch", "train_recall"]
__version__ = "0.1.0"
