"""The routed block of chapter 7: one training step (forward and backward, as a user's
loop runs it) and its peak memory, bfloat16.

    python -m benchmarks --only routed_block

Implementations: course_lib's block eager, inside torch.compile (course_lib.compile) and
inside torch.compile(mode="reduce-overhead"), which replays the step as CUDA graphs
(course_lib.cudagraphs); the same block on the PyTorch references eager (torch) and
compiled both ways (torch.compile, torch.compile.cudagraphs); and colt5-attention 0.11.2's
routed attention and feed-forward with its Triton router (colt5_attention). A step sets
the weights' gradients to None first, as ``optimizer.zero_grad()`` does. Every block
routes num_heavy_tokens = seq / 8 tokens (512 at 4096), 8 heads of 64, a light window of
128. The implementations of a shape are timed together in alternating rounds, as the
kernels' step rows are (benchmarking.alternating_step_timings). Each row's ``peak_bytes`` is the most memory
allocated during a step beyond what was allocated before it (weights, their gradients
from the warm-up step, and the input). ``bytes`` counts the input read and the output
written only, so the fraction of C says little here: compare the times.
"""

import torch

from course_lib.core.benchmarking import alternating_step_timings, row, training_step
from course_lib.models.recall_task import routed_block

SHAPES = [(8, 4096, 1024), (8, 2048, 512)]
DTYPE = torch.bfloat16
HEADS, DIM_HEAD, WINDOW = 8, 64, 128

# impl name -> (block impl of recall_task.routed_block, torch.compile mode or None for eager)
IMPLS = {
    "course_lib": ("course_lib", None),
    "course_lib.compile": ("course_lib", "default"),
    "course_lib.cudagraphs": ("course_lib", "reduce-overhead"),
    "torch": ("reference", None),
    "torch.compile": ("reference", "default"),
    "torch.compile.cudagraphs": ("reference", "reduce-overhead"),
    "colt5_attention": ("colt5_attention", None),
}


def num_heavy_tokens(seq_len):
    return seq_len // 8


def make_block(impl, dim, seq_len, device="cuda", dtype=DTYPE, window=WINDOW):
    """The block behind ``impl`` (a key of IMPLS), and the function a step calls. Compiled
    without clearing dynamo's caches: the benchmark keeps every block of a shape compiled
    at once, to time them together."""
    block_impl, mode = IMPLS[impl]
    torch.manual_seed(0)
    block = routed_block(block_impl, dim, num_heavy_tokens=num_heavy_tokens(seq_len), seq_len=seq_len,
                         light_window_size=window, heads=HEADS, dim_head=DIM_HEAD).to(device=device, dtype=dtype)
    return block, torch.compile(block, dynamic=False, mode=mode) if mode else block


def peak_step_bytes(step):
    """The most memory allocated during ``step()`` beyond what was allocated before it."""
    step()  # warm-up: allocates the weights' gradients, compiles
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def run(copy_gbps, shapes=SHAPES, steps_only=False):  # its rows are all steps
    """Every implementation of a shape is built, compiled and run (its peak memory
    measured) before any is timed; then all are timed together, in alternating rounds
    (alternating_step_timings), as the kernels' step rows are."""
    rows = []
    for shape in shapes:
        batch, seq_len, dim = shape
        torch._dynamo.reset()  # one reset a shape: the blocks compiled below must all stay compiled
        x = torch.randn(shape, device="cuda", dtype=DTYPE, requires_grad=True)
        n_bytes = 2 * x.numel() * x.element_size()
        blocks, steps, peaks = [], {}, {}
        for impl in IMPLS:
            block, fn = make_block(impl, dim, seq_len)
            blocks.append(block)
            steps[impl] = training_step(fn, x, parameters=block.parameters())
            peaks[impl] = peak_step_bytes(steps[impl])
        timings = alternating_step_timings(steps)
        for impl in IMPLS:
            rows.append(row("routed_block", "step", impl, DTYPE, shape, timings[impl], n_bytes, copy_gbps))
            rows[-1]["peak_bytes"] = peaks[impl]
        del blocks, steps
        torch.cuda.empty_cache()
    return rows
