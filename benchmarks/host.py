"""The host's time for each public function's training step, against torch eager's: the
results' "host" rows.

    python -m benchmarks.host                  # merged into course_lib/results/<gpu>.json
    python -m benchmarks.host --out host.json  # this run's rows alone

A step as a user's loop runs it (gradients set to None, forward, backward), timed on the
host while the GPU is kept busy, so that the host never waits for it: what eager mode costs
before any kernel runs. course_lib's step, torch's and the floor's (benchmarks.floor: the same
Triton kernels in a bare autograd.Function, the least such a step can cost) are timed in
rounds, course_lib's and the floor's taking turns step by step, so that the host's speed,
which drifts twofold over seconds on the lent machines, is the same for both. Each row holds
the median of its rounds (each the median of its steps) as ``ms`` and the GPU's own time of
the same step (the profiler's kernels) as ``gpu_ms``: a step whose host time passes its GPU
time is host-bound, and there its host time is its speed.
"""

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from benchmarks.__main__ import merge
from benchmarks.profile_step import ROUNDS, host_us, host_us_each, kernel_steps, profile
from course_lib.core.benchmarking import (RESULTS_DIR, copy_bandwidth_gbps, gpu_slug, measured_on, require_gpu,
                                          write_document)

# Each kernel at the shape of profile_step (GPU-bound on an H100) and at a small one, where
# both libraries are host-bound and the host is all there is.
SHAPES = {
    "weighted_sum": [(65536, 1024), (4096, 1024)],
    "softmax": [(16384, 1024), (1024, 1024)],
    "causal_softmax": [(64, 1024, 1024), (4, 256, 256)],
    "layernorm": [(16384, 1024), (1024, 1024)],
    "coor_descent": [(1024, 4096), (64, 1024)],
}


# Steps of each of the pair a window: half of host_us's 100, so that the window's launches stay
# as many as one implementation's 100 steps queued before the pairing (three implementations of
# 100 steps each, in one window, made every launch slower: the commit that paired them says more).
PAIRED_RUNS = 50


def host_rows(kernel, shape, dtype):
    """The course_lib, torch and floor "host" rows of one kernel at one shape."""
    steps = kernel_steps(kernel, shape, dtype, with_floor=True)
    times = {impl: [] for impl in steps}
    for round_ in range(ROUNDS):
        # course_lib's and the floor's steps take turns, the first changing each round; torch's
        # in a window of its own: its kernels (hundreds a step for coor_descent's reference) would
        # fill CUDA's launch queue while the GPU sleeps, and the next launches would wait for it.
        pair = ("course_lib", "floor") if round_ % 2 else ("floor", "course_lib")
        measured = {**host_us_each({impl: steps[impl] for impl in pair}, runs=PAIRED_RUNS),
                    "torch": host_us(steps["torch"])}
        for impl, us in measured.items():
            times[impl].append(us)
    rows = {}
    for impl, step in steps.items():
        gpu_us = profile(step)[0]
        rows[impl] = {"kernel": kernel, "pass": "host", "impl": impl, "dtype": str(dtype).replace("torch.", ""),
                      "shape": list(shape), "ms": statistics.median(times[impl]) / 1e3, "gpu_ms": gpu_us / 1e3,
                      "host_ms_rounds": [t / 1e3 for t in times[impl]]}
    ours, theirs, floor = rows["course_lib"], rows["torch"], rows["floor"]
    print(f"{kernel:>14} {ours['dtype']:>8} {str(list(shape)):>18}  host {ours['ms'] * 1e3:7.1f} us "
          f"(GPU {ours['gpu_ms'] * 1e3:7.1f})  torch host {theirs['ms'] * 1e3:7.1f} us "
          f"(GPU {theirs['gpu_ms'] * 1e3:7.1f})  floor host {floor['ms'] * 1e3:7.1f} us  "
          f"ours / torch's host time {ours['ms'] / theirs['ms']:.2f}  ours / floor's {ours['ms'] / floor['ms']:.2f}",
          flush=True)
    return list(rows.values())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help=f"comma-separated subset of {','.join(SHAPES)}")
    parser.add_argument("--out", help="write this run's rows here instead of merging them into the results file")
    arguments = parser.parse_args()
    require_gpu("the host timings")
    kernels = arguments.only.split(",") if arguments.only else list(SHAPES)
    rows = []
    for kernel in kernels:
        # coordinate descent runs in float32 (its benchmarks' dtype); the others in bfloat16
        dtype = torch.float32 if kernel == "coor_descent" else torch.bfloat16
        for shape in SHAPES[kernel]:
            rows += host_rows(kernel, shape, dtype)
    document = {**measured_on(), "copy_gbps": copy_bandwidth_gbps(), "rows": rows}
    if arguments.out:
        print("wrote", write_document(document, arguments.out))
        return
    results = RESULTS_DIR / f"{gpu_slug()}.json"
    with tempfile.TemporaryDirectory() as scratch:
        run = write_document(document, Path(scratch) / "host.json")
        print("wrote", merge([results, run] if results.exists() else [run], results))


if __name__ == "__main__":
    main()
