"""Checkers of chapter 7, routed block: one function an exercise, a module an exercise.

``routed_rows`` (7.1), ``attention_forward`` (7.2), ``attention_backward`` (7.3),
``attention_shared``, what the two attention checkers share, and ``shared``, what all three do."""

from ..common import Exercise
from .attention_backward import check_local_attention_backward, launch_local_attention_backward
from .attention_forward import check_local_attention_forward, launch_local_attention_forward
from .routed_rows import check_add_routed_rows, launch_add_routed_rows

__all__ = ["launch_add_routed_rows", "check_add_routed_rows",
           "launch_local_attention_forward", "check_local_attention_forward",
           "launch_local_attention_backward", "check_local_attention_backward"]
# The chapter's exercises, in order, for the instructors' notes.
EXERCISES = (
    Exercise('7.1', 'add the heavy rows back', 'check_add_routed_rows', kernel=True, skills='index loads, gather and scatter addresses, a read-modify-write', difficulty=3, minutes=30),
    Exercise('7.2', 'the local-attention forward in bfloat16 with tl.dot', 'check_local_attention_forward', kernel=True, skills='tl.dot on bfloat16 tiles with float32 sums, the online softmax across key tiles, causal and window masks, loop bounds from the mask, the log-sum-exp for the backward', difficulty=5, minutes=90),
    Exercise('7.3', 'the local-attention backward with tl.dot', 'check_local_attention_backward', kernel=True, skills='the FlashAttention-2 backward: P recomputed from the log-sum-exp, dS = P ∘ (dP - D), a pass over key tiles for dk and dv and one over query tiles for dq, the loop bounds of each', difficulty=5, minutes=120),
)
