"""The kernels, one module a kernel, each read top to bottom: Triton kernels, host
launchers, the operator with its autograd, the public function. LayerNorm is a small
subpackage (rows in one tile, rows wider than a tile, the parts both share).

A module is named for its operation with ``_op`` (``softmax_op``), so that no module
shares a name with the function the package exports (``course_lib.softmax``).
"""

from .coor_descent_op import coor_descent
from .layernorm_op import LayerNorm, layer_norm, layernorm
from .local_attention_op import MAX_HEAD_DIM, local_causal_attention
from .matmul_op import matmul
from .softmax_op import causal_softmax, softmax
from .weighted_sum_op import weighted_sum

__all__ = ["weighted_sum", "softmax", "causal_softmax", "layernorm", "layer_norm", "LayerNorm", "coor_descent",
           "local_causal_attention", "MAX_HEAD_DIM", "matmul"]
