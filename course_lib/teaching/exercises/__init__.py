"""One checker per exercise, a module a chapter (``chapter1`` ... ``chapter6``). Each runs
the student's code on fresh random inputs of several shapes, compares with the
references, prints one line starting ``Exercise N.M passed`` or raises
:class:`~course_lib.teaching.checking.ExerciseError` saying what is wrong and where.

Every checker is importable from here: ``exercises.check_scale_columns(scale_columns)``.
"""

from . import common  # noqa: F401  (the grader switches hidden sizes on through it)
from .chapter1 import check_scale_columns, check_weighted_sum_grads, check_column_sum
from .chapter2 import check_softmax_rows, check_causal_mask, check_softmax_grad, check_online_softmax_stats
from .chapter3 import check_layernorm_rows, check_layernorm_dx, check_column_partial_sums, check_grad_through_row_max
from .chapter4 import check_coor_descent_step, check_routing_weights, check_row_logsumexp_of_min, check_da_next_da
from .chapter5 import check_scale_columns_op, check_scale_columns_autograd, check_without_graph_breaks
from .chapter6 import check_scatter_back, check_routed_causal_mask, check_route

__all__ = [
    "check_scale_columns",
    "check_weighted_sum_grads",
    "check_column_sum",
    "check_softmax_rows",
    "check_causal_mask",
    "check_softmax_grad",
    "check_online_softmax_stats",
    "check_layernorm_rows",
    "check_layernorm_dx",
    "check_column_partial_sums",
    "check_grad_through_row_max",
    "check_coor_descent_step",
    "check_routing_weights",
    "check_row_logsumexp_of_min",
    "check_da_next_da",
    "check_scale_columns_op",
    "check_scale_columns_autograd",
    "check_without_graph_breaks",
    "check_scatter_back",
    "check_routed_causal_mask",
    "check_route",
]
