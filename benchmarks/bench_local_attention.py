"""Local causal attention (chapter 6's light branch) against the same attention written
with its scores, PyTorch's ``routed.local_causal_attention`` on the references (eager and
its torch.compile): forward, backward and the training step, bfloat16, windows of 128.

    python -m benchmarks --only local_attention

Shapes are the routed block benchmark's light branch: q, k, v of (batch, heads, n,
head_dim) = (8, 8, n, 64), the chunks of one projection, as the block passes them.
Bytes counted, with t = batch * heads * n * head_dim elements of e_s bytes a tensor: the
forward reads q, k, v and writes out, 4·t·e_s; the backward reads q, k, v, out and
grad_out and writes the three gradients, 8·t·e_s; the step both, 12·t·e_s. The scores
written by the reference are not counted: not writing them is the point.
"""

import torch

from course_lib import routed
from course_lib.benchmarking import forward_backward_ms, fresh_compile, row, step_rows
from course_lib.local_attention import local_causal_attention

SHAPES = [(8, 8, 4096, 64), (8, 8, 2048, 64)]
DTYPES = [torch.bfloat16]
WINDOW = 128


def course(q, k, v, window=WINDOW):
    return local_causal_attention(q, k, v, window)


def written_scores(q, k, v, window=WINDOW):
    """The reference: the (window, 2 * window) scores of every window written out, and
    the references' causal softmax on them."""
    return routed.local_causal_attention(q, k, v, window, routed.REFERENCE_OPS)


def projection_chunks(batch, heads, n, head_dim, dtype, device="cuda"):
    """q, k and v as (batch, heads, n, head_dim) views of one (batch, n, 3 * heads * head_dim) projection."""
    projection = torch.randn(batch, n, 3 * heads * head_dim, device=device, dtype=dtype)
    return [t.reshape(batch, n, heads, head_dim).transpose(1, 2).detach().requires_grad_()
            for t in projection.chunk(3, dim=-1)]


def run(copy_gbps, shapes=SHAPES, dtypes=DTYPES):
    rows = []
    for dtype in dtypes:
        for shape in shapes:
            q, k, v = projection_chunks(*shape, dtype)
            tensor_bytes = q.numel() * q.element_size()
            for impl, fn in {"course_lib": course, "torch": written_scores,
                             "torch.compile": fresh_compile(written_scores)}.items():
                fwd, bwd = forward_backward_ms(fn, q, k, v)
                rows.append(row("local_attention", "fwd", impl, dtype, shape, fwd, 4 * tensor_bytes, copy_gbps))
                rows.append(row("local_attention", "bwd", impl, dtype, shape, bwd, 8 * tensor_bytes, copy_gbps))
            rows += step_rows("local_attention", dtype, shape, course, written_scores,
                              (q, k, v), 12 * tensor_bytes, copy_gbps)
    return rows
