"""Checkers of chapter 3, LayerNorm: one function an exercise, a module an exercise.

``forward`` (3.1), ``dx_formula`` (3.2), ``partial_sums`` (3.3), ``backward_kernel`` (3.4),
and ``shared``, what the kernel checkers share."""

from ..common import Exercise
from .backward_kernel import check_layernorm_backward_rows, launch_layernorm_backward_rows
from .dx_formula import check_layernorm_dx
from .forward import check_layernorm_rows, launch_layernorm_rows
from .partial_sums import check_column_partial_sums, launch_column_partial_sums

__all__ = ["launch_layernorm_rows", "check_layernorm_rows", "check_layernorm_dx",
           "launch_column_partial_sums", "check_column_partial_sums",
           "launch_layernorm_backward_rows", "check_layernorm_backward_rows"]
# The chapter's exercises, in order, for the instructors' notes.
EXERCISES = (
    Exercise('3.1', 'several rows a program, with the statistics', 'check_layernorm_rows', kernel=True, skills='row tiles, two row reductions with masked padding, saved statistics', difficulty=3, minutes=30),
    Exercise('3.2', 'the gradient of x in PyTorch', 'check_layernorm_dx', kernel=False, skills='the LayerNorm backward', difficulty=2, minutes=20),
    Exercise('3.3', 'partial column sums, the first stage', 'check_column_partial_sums', kernel=True, skills='a loop over a range of rows, per-program partial sums', difficulty=3, minutes=25),
    Exercise('3.4', 'the backward kernel', 'check_layernorm_backward_rows', kernel=True, skills='row reductions and column partial sums in one persistent program', difficulty=4, minutes=45),
)
