"""Exercise 7.1's checker: add the heavy rows back."""

import torch
import triton

from ....core.runtime import DEVICE, ON_GPU
from ...checking import ExerciseError, compare
from ...student_kernels import kernel_runs, report_speed, require_kernel
from ..common import hidden_case, random_size, say
from .shared import _as_rows, _with_hint


def launch_add_routed_rows(add_routed_rows_kernel, light, heavy, indices, out=None, block_tokens=8, block_dim=32):
    """How exercise 7.1's checker launches the kernel: ``out`` starts as a copy of ``light``
    (b, n, d) (or is the given tensor, which the kernel changes in place), and program
    (t, c, b) adds the heavy rows ``heavy[b, r]`` of routed tokens ``r`` of tile t, columns
    of tile c, into row ``indices[b, r]`` of ``out[b]``. Returns ``out``."""
    if out is None:
        out = light.clone()
    batch, num_routed, dim = heavy.shape
    grid = (triton.cdiv(num_routed, block_tokens), triton.cdiv(dim, block_dim), batch)
    add_routed_rows_kernel[grid](_as_rows(out), _as_rows(heavy), indices, num_routed, dim, out.stride(0), out.stride(1),
                                 heavy.stride(0), heavy.stride(1), indices.stride(0),
                                 BLOCK_TOKENS=block_tokens, BLOCK_DIM=block_dim)
    return out


def _add_routed_rows_hint(got, light, heavy, indices):
    """The usual mistake behind a wrong answer of exercise 7.1, or None."""
    if not isinstance(got, torch.Tensor) or got.shape != light.shape:
        return None
    got, light, heavy, indices = (t.detach().cpu() for t in (got, light, heavy, indices))
    if torch.equal(got, light):
        return "out is the light output unchanged: no heavy row was added (is there a store, and is its mask right?)"
    routed = torch.zeros(light.shape[:2], dtype=torch.bool).scatter(1, indices, True)
    if got.shape[0] > 1:
        into_first = light.clone()
        for b in range(light.shape[0]):
            into_first[0].index_add_(0, indices[b], heavy[b])
        if torch.allclose(got, into_first, rtol=1e-5, atol=1e-6):
            return ("every sequence's heavy rows were added into the first sequence: the program of sequence b "
                    "starts at b * stride_out_b in out (and b * stride_heavy_b, b * stride_indices_b)")
    if not torch.equal(got[~routed], light[~routed]):
        return ("rows the router did not pick have changed. An index is a row number, not an address: row p of "
                "a sequence starts p * stride_out_n elements after the sequence's first row")
    picked = indices[..., None].expand(-1, -1, light.shape[-1])
    if torch.equal(got.gather(1, picked), heavy):
        return ("the routed rows hold the heavy rows alone, and the light branch's output there is lost: the "
                "block adds the two, so load what out holds, add, and store the sum")
    return None


def check_add_routed_rows(add_routed_rows_kernel):
    """Exercise 7.1: ``add_routed_rows_kernel``, launched by :func:`launch_add_routed_rows`,
    adds ``heavy[b, r]`` into ``out[b, indices[b, r]]`` for every sequence b and routed
    token r, leaving the other rows of ``out`` (the light branch's output) as they are."""
    name = "Exercise 7.1 (add_routed_rows_kernel)"
    kernel = require_kernel(name, add_routed_rows_kernel, "add_routed_rows_kernel")

    def check_case(what, light, heavy, indices):
        expected = light.clone()
        for b in range(light.shape[0]):
            expected[b].index_add_(0, indices[b], heavy[b])
        for how, got in kernel_runs(name, launch_add_routed_rows, kernel, light, heavy, indices):
            try:
                compare(f"{what}" + (f", {how}" if how else ""), got, expected, rtol=1e-6, atol=0)
            except ExerciseError as error:
                raise _with_hint(error, _add_routed_rows_hint(got, light, heavy, indices)) from None

    cases = [(1, 1, 1, 1, False), (2, 9, 5, 3, False), (3, 40, 20, 70, False), (2, 16, 16, 33, True)]
    cases += hidden_case(lambda: (lambda n: (random_size(1, 3), n, random_size(1, n), random_size(1, 80), False))(
        random_size(1, 50)))
    for batch, seq_len, num_routed, dim, sliced in cases:
        what = (f"{name}, {batch} sequence{'s' * (batch > 1)} of {seq_len} token{'s' * (seq_len > 1)} of width "
                f"{dim}, {num_routed} routed")
        light = torch.randn(batch, seq_len, dim, device=DEVICE)
        if sliced:  # the heavy rows as a view of a wider tensor: stride_heavy_k is not dim
            heavy = torch.randn(batch, num_routed, dim + 7, device=DEVICE)[..., :dim]
            what += f", heavy a view whose rows are {heavy.stride(1)} elements apart"
        else:
            heavy = torch.randn(batch, num_routed, dim, device=DEVICE)
        indices = torch.rand(batch, seq_len, device=DEVICE).topk(num_routed, dim=-1).indices  # distinct, any order
        check_case(what, light, heavy, indices)
    # Not counted in the line below: sizes past the printed cases' (a long sequence, many routed tokens,
    # a wide row), one sequence's positions all routed in reverse order.
    for batch, seq_len, num_routed, dim in ((2, 300, 130, 70), (1, 40, 40, 200)):
        what = f"{name}, {batch} sequence(s) of {seq_len} tokens of width {dim}, {num_routed} routed"
        light = torch.randn(batch, seq_len, dim, device=DEVICE)
        heavy = torch.randn(batch, num_routed, dim, device=DEVICE)
        indices = torch.rand(batch, seq_len, device=DEVICE).topk(num_routed, dim=-1).indices
        check_case(what, light, heavy, indices)
    say(f"{name.split(' (')[0]} passed: {len(cases)} shapes, the routed rows added and the others untouched.")
    batch, seq_len, num_routed, dim = 8, 4096, 512, 1024
    if ON_GPU:
        light = torch.randn(batch, seq_len, dim, device=DEVICE)
        heavy = torch.randn(batch, num_routed, dim, device=DEVICE)
        indices = torch.rand(batch, seq_len, device=DEVICE).topk(num_routed, dim=-1).indices
        picked = indices[..., None].expand(-1, -1, dim).contiguous()
    else:
        light = heavy = indices = picked = None
    # Read the heavy rows and the routed rows of out, write those rows back, read the indices.
    n_bytes = 3 * batch * num_routed * dim * 4 + batch * num_routed * 8
    report_speed(name, lambda: launch_add_routed_rows(kernel, light, heavy, indices, light, 16, 256), n_bytes,
                 against=("torch's scatter_add_", lambda: light.scatter_add_(1, picked, heavy)),
                 advice="give each program a tile of routed rows and a run of contiguous columns (BLOCK_DIM of "
                        "them), so that every row's loads and stores combine into wide vectors")
