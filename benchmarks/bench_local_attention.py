"""Local causal attention (chapter 7's light branch) against the same attention written
with its scores, PyTorch's ``routed.local_causal_attention`` on the references (eager and
its torch.compile): forward, backward and the training step, bfloat16, windows of 128.

    python -m benchmarks --only local_attention

Shapes are the routed block benchmark's light branch: q, k, v of (batch, heads, n,
head_dim) = (8, 8, n, 64). As in the block, they are the chunks of one projection
(batch, n, 3 * heads * head_dim), which is the tensor whose gradient a step computes: the
backward ends in the chunks' backward, which writes the three gradients into one. (With
q, k and v the leaves instead, autograd would copy every gradient that is not laid out
as its tensor is, a copy the block never makes.)
Bytes counted, with t = batch * heads * n * head_dim elements of e_s bytes a tensor: the
forward reads q, k, v and writes out, 4·t·e_s; the backward reads q, k, v, out and
grad_out and writes the three gradients, 8·t·e_s; the step both, 12·t·e_s. The scores
written by the reference are not counted: not writing them is the point.
"""

import torch

from course_lib.models import routed
from course_lib.core.benchmarking import forward_backward_ms, fresh_compile, row, step_rows
from course_lib.kernels.local_attention_op import local_causal_attention

SHAPES = [(8, 8, 4096, 64), (8, 8, 2048, 64)]
DTYPES = [torch.bfloat16]
WINDOW = 128
HEAD_DIM = 64  # every shape's


def split_qkv(projection, head_dim=HEAD_DIM):
    """q, k and v, (batch, heads, n, head_dim), as views of one (batch, n, 3 * heads * head_dim) projection."""
    batch, n, _ = projection.shape
    return [t.reshape(batch, n, -1, head_dim).transpose(1, 2) for t in projection.chunk(3, dim=-1)]


def course(projection, window=WINDOW, head_dim=HEAD_DIM):
    return local_causal_attention(*split_qkv(projection, head_dim), window)


def written_scores(projection, window=WINDOW, head_dim=HEAD_DIM):
    """The reference: the (window, 2 * window) scores of every window written out, and
    the references' causal softmax on them."""
    return routed.local_causal_attention(*split_qkv(projection, head_dim), window, routed.REFERENCE_OPS)


def make_projection(batch, heads, n, head_dim, dtype, device="cuda"):
    return torch.randn(batch, n, 3 * heads * head_dim, device=device, dtype=dtype, requires_grad=True)


def run(copy_gbps, shapes=SHAPES, dtypes=DTYPES, steps_only=False):
    rows = []
    for dtype in dtypes:
        for shape in shapes:
            projection = make_projection(*shape, dtype)
            tensor_bytes = projection.numel() * projection.element_size() // 3  # one of q, k, v
            impls = {"course_lib": course, "torch": written_scores, "torch.compile": fresh_compile(written_scores)}
            for impl, fn in () if steps_only else impls.items():
                fwd, bwd = forward_backward_ms(fn, projection)
                rows.append(row("local_attention", "fwd", impl, dtype, shape, fwd, 4 * tensor_bytes, copy_gbps))
                rows.append(row("local_attention", "bwd", impl, dtype, shape, bwd, 8 * tensor_bytes, copy_gbps))
            rows += step_rows("local_attention", dtype, shape, course, written_scores,
                              (projection,), 12 * tensor_bytes, copy_gbps)
    return rows
