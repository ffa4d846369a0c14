"""Where one training step's time goes: host against GPU, a torch.profiler timeline.

    python -m benchmarks.profile_step                      # LayerNorm bfloat16 16384 x 1024
    python -m benchmarks.profile_step --kernel softmax --shape 64,1024,1024 --trace step.json
    python -m benchmarks.profile_step --kernel weighted_sum --python 25   # the step's Python, by function
    python -m benchmarks.profile_step --kernel routed_block --shape 8,2048,512  # chapter 7's block, eager

For course_lib (and for course_lib again with every launch through kernel[grid], which
shows what ``runtime.launch`` saves) and for torch eager, one step as a user's loop runs it (gradients set to
None, forward, backward): the host's time for the step while the GPU is kept busy (so
the host never waits for it), the GPU's time for the step's kernels, how many kernels
it launches, and the step's host operations in the order they ran, on each thread
(autograd runs the backward on a thread of its own), with their host time. For the routed
block (``--kernel routed_block``, batch,seq,dim), torch is the same block on the PyTorch
references (benchmarks.bench_routed_block's "torch"), and every operation of the timeline
is counted by name. A step whose
host time exceeds its GPU time is host-bound: there, fewer launches and less Python
speed it up, and faster kernels do not.
"""

import argparse
import collections
import contextlib
import cProfile
import functools
import io
import pstats
import statistics
import time

import torch
import torch.nn.functional as F

from benchmarks import floor
from benchmarks.bench_routed_block import make_block
from benchmarks.bench_softmax import masked_softmax
from course_lib import causal_softmax, coor_descent, layernorm, softmax, weighted_sum
from course_lib.core import references, runtime
from course_lib.core.benchmarking import gpu_events, require_gpu, training_step
from course_lib.teaching.notebook import host_and_gpu_events


_hidden_keys = functools.cache(references.causal_mask)  # made once a shape, as a model keeps it


def _masked_softmax(x):
    """torch's causal softmax as bench_softmax times it, its mask made once a shape, not in every step."""
    return masked_softmax(x, _hidden_keys(x.shape[-1], x.device))


# Coordinate descent's settings in every step (k: an eighth of the row), as its benchmarks take them.
COOR_DESCENT_SETTINGS = {"n_iters": 20, "eps": 0.03, "eps_init": 4, "eps_decay": 0.7}

# kernel -> (course_lib's function, torch's, the inputs' shapes as function of --shape, and what those are)
KERNELS = {
    "weighted_sum": (weighted_sum, lambda x, w: x @ w, lambda shape: [shape, shape[-1:]]),
    "softmax": (softmax, lambda x: x.softmax(-1), lambda shape: [shape]),
    "causal_softmax": (causal_softmax, _masked_softmax, lambda shape: [shape]),
    "layernorm": (layernorm, lambda x, g, b: F.layer_norm(x, x.shape[-1:], g, b),
                  lambda shape: [shape, shape[-1:], shape[-1:]]),
    "coor_descent": (lambda s: coor_descent(s, k=s.shape[-1] / 8, **COOR_DESCENT_SETTINGS),
                     lambda s: references.coor_descent(s, k=s.shape[-1] / 8, **COOR_DESCENT_SETTINGS),
                     lambda shape: [shape]),
}
DEFAULT_SHAPES = {"weighted_sum": (65536, 1024), "softmax": (512, 4096), "causal_softmax": (64, 1024, 1024),
                  "layernorm": (16384, 1024), "coor_descent": (1024, 4096), "routed_block": (8, 2048, 512)}


def floor_function(kernel, *inputs):
    """benchmarks.floor's function for ``kernel`` on these inputs: course_lib's kernels and nothing more."""
    settings = {"k": inputs[0].shape[-1] / 8, **COOR_DESCENT_SETTINGS} if kernel == "coor_descent" else {}
    return floor.FLOORS[kernel](*inputs, **settings)


def kernel_steps(kernel, shape, dtype, with_floor=False):
    """{"course_lib": step, "torch": step} of one kernel's training step (training_step), and
    "floor": step where ``with_floor`` asks (benchmarks.floor), all on the same inputs."""
    ours, theirs, input_shapes = KERNELS[kernel]
    inputs = [torch.randn(s, device="cuda", dtype=dtype, requires_grad=True) for s in input_shapes(shape)]
    steps = {"course_lib": training_step(ours, *inputs), "torch": training_step(theirs, *inputs)}
    if with_floor:
        steps["floor"] = training_step(floor_function(kernel, *inputs), *inputs)
    return steps


def routed_block_steps(shape, dtype):
    """The same, for chapter 7's block: its weights' gradients are set to None too."""
    _, seq_len, dim = shape
    x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
    steps = {}
    for impl in ("course_lib", "torch"):
        block, _ = make_block(impl, dim, seq_len, dtype=dtype)
        steps[impl] = training_step(block, x, parameters=block.parameters())
    return steps


ROUNDS = 5
# The GPU sleeps this many cycles (about half a second) while the host runs the timed steps,
# so that the host never waits for it: longer than 100 steps of any default shape's host time.
HOST_SLEEP_CYCLES = 1_000_000_000


def host_us(step, runs=100):
    """Median host time of a step in microseconds, with the GPU kept busy meanwhile, so
    that the host never waits for it."""
    return host_us_each({"step": step}, runs)["step"]


def host_us_each(steps, runs=100):
    """{name: median host time of its step in µs} of ``steps`` ({name: step}), which take
    turns step by step while the GPU is kept busy (as host_us), so that the host's speed,
    which drifts over seconds, is the same for each."""
    for step in steps.values():
        for _ in range(5):
            step()
    torch.cuda.synchronize()
    times = {name: [] for name in steps}
    torch.cuda._sleep(HOST_SLEEP_CYCLES)
    for _ in range(runs):
        for name, step in steps.items():
            started = time.perf_counter()
            step()
            times[name].append((time.perf_counter() - started) * 1e6)
    torch.cuda.synchronize()
    return {name: statistics.median(values) for name, values in times.items()}


def profile(step, steps=5):
    """(GPU microseconds a step, kernels a step, the host events of the last step as
    notebook.host_and_gpu_events gives them, the profile)."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            with torch.profiler.record_function("step"):
                step()
        torch.cuda.synchronize()
    gpu = gpu_events(prof)
    gpu_us = sum(e.device_time for e in gpu) / steps
    host = [event for event in host_and_gpu_events(prof) if event[0] != "GPU"]
    return gpu_us, len(gpu) / steps, host, prof


def python_profile(step, top, runs=200):
    """The ``top`` Python functions of a step by their own host time (cProfile over ``runs``
    steps, the GPU kept busy), as pstats prints them: which Python lines a lean path removes."""
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    torch.cuda._sleep(HOST_SLEEP_CYCLES)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(runs):
        step()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def timeline(host_events):
    """Lines 'thread  start  duration  name' of the host events of one step, in µs."""
    return [f"  {row:>13} {start:9.1f} {duration:8.1f}  {name}" for row, name, start, duration in host_events]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="layernorm", choices=[*KERNELS, "routed_block"])
    parser.add_argument("--shape", help="comma-separated, default per kernel")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--trace", help="write the course_lib step's Chrome trace here")
    parser.add_argument("--python", type=int, metavar="TOP", help="also print the TOP Python functions of "
                        "course_lib's step by their own time (cProfile)")
    arguments = parser.parse_args()
    require_gpu("profiling")
    shape = tuple(int(n) for n in arguments.shape.split(",")) if arguments.shape else DEFAULT_SHAPES[arguments.kernel]
    dtype = torch.float32 if arguments.kernel == "coor_descent" else getattr(torch, arguments.dtype)
    print(f"{arguments.kernel} {str(dtype).replace('torch.', '')} {list(shape)}: one training step")
    steps = (routed_block_steps(shape, dtype) if arguments.kernel == "routed_block"
             else kernel_steps(arguments.kernel, shape, dtype))
    impls = {  # name -> (step, the context it runs in)
        "course_lib": (steps["course_lib"], contextlib.nullcontext),
        "course_lib, launched through kernel[grid]": (steps["course_lib"], runtime.kernel_grid_launches),
        "torch": (steps["torch"], contextlib.nullcontext),
    }
    # The host's speed drifts over seconds: rounds that take each in turn compare them fairly.
    host_times = {impl: [] for impl in impls}
    for _ in range(ROUNDS):
        for impl, (step, context) in impls.items():
            with context():
                host_times[impl].append(host_us(step))
    for impl, (step, context) in impls.items():
        with context():
            gpu_us, kernels, host_events, prof = profile(step)
        print(f"\n{impl}: host {statistics.median(host_times[impl]):.1f} us a step (median of {ROUNDS} rounds, "
              f"from {min(host_times[impl]):.1f} to {max(host_times[impl]):.1f}), GPU {gpu_us:.1f} us "
              f"in {kernels:.0f} kernels")
        if arguments.kernel == "routed_block":
            counts = collections.Counter(name for _, name, _, _ in host_events)
            print(f"  {len(host_events)} top-level host operations a step, by name:")
            print("\n".join(f"  {count:5d}  {name}" for name, count in counts.most_common()))
        else:
            print("  host timeline of one step (thread, start us, duration us, operation; top-level operations):")
            print("\n".join(timeline(host_events)))
        if impl == "course_lib" and arguments.trace:
            prof.export_chrome_trace(arguments.trace)
    if arguments.python:
        print(f"\ncourse_lib's step, its Python by function (cProfile, {arguments.python} by own time):")
        print(python_profile(steps["course_lib"], arguments.python))


if __name__ == "__main__":
    main()
