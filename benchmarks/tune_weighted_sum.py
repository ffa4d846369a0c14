"""Sweep tile sizes for the weighted-sum kernels; how forward_tiles/backward_tiles were chosen.

    python -m benchmarks.tune_weighted_sum [--sweep tiles|stages|programs|all] [--out FILE.json]

Prints, for each shape and dtype, the default tiles' time and the best swept tiles,
and the backward's time for several programs per multiprocessor, as fractions of copy
bandwidth beside the fraction a plain copy of the same bytes reaches.
"""

import argparse
import itertools
import json

import torch

from course_lib.core.benchmarking import copy_bandwidth_gbps, median_ms, require_gpu
from course_lib.core.plans import LaunchPlan
from course_lib.kernels.weighted_sum_op import (
    backward_tiles,
    forward_tiles,
    weighted_sum_backward,
    weighted_sum_forward,
)

from .bench_weighted_sum import DTYPES, SHAPES

ROWS = [1, 2, 4, 8, 16, 32, 64]
COLS = [64, 128, 256, 512, 1024, 2048, 4096, 8192]
WARPS = [2, 4, 8, 16]


def candidates(n_cols, element_size):
    for block_rows, block_cols, warps in itertools.product(ROWS, COLS, WARPS):
        elements = block_rows * block_cols
        if block_cols <= 2 * max(n_cols, 64) and 2048 <= elements * element_size <= 32768:
            if 32 * warps <= elements:
                yield LaunchPlan(block_rows, block_cols, warps)


def copy_ceiling(n_bytes, copy_gbps):
    """Fraction of C that a plain copy moving ``n_bytes`` reaches: the ceiling at this size."""
    src = torch.empty(n_bytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return n_bytes / median_ms(lambda: dst.copy_(src), rep=50) / 1e6 / copy_gbps


def cases():
    """Fresh random inputs for every benchmarked dtype and shape: (dtype, shape, x, w, g)."""
    for dtype in DTYPES:
        for n_rows, n_cols in SHAPES:
            x = torch.randn(n_rows, n_cols, device="cuda", dtype=dtype)
            w = torch.randn(n_cols, device="cuda", dtype=dtype)
            g = torch.randn(n_rows, device="cuda", dtype=dtype)
            yield dtype, (n_rows, n_cols), x, w, g


def passes(x, w, g):
    """(pass, launch taking tiles, default tiles function, bytes moved) for forward and backward."""
    n_bytes = x.numel() * x.element_size()
    return (
        ("fwd", lambda t: weighted_sum_forward(x, w, t), forward_tiles, n_bytes),
        ("bwd", lambda t: weighted_sum_backward(x, w, g, t), backward_tiles, 2 * n_bytes),
    )


def sweep_stages(copy_gbps):
    """Software pipelining of the loops (NUM_STAGES) with the default tiles."""
    results = []
    for dtype, (n_rows, n_cols), x, w, g in cases():
        for pass_, launch, default, bytes_moved in passes(x, w, g):
            tiles = default(n_cols, x.element_size())
            timed = {stages: bytes_moved / median_ms(lambda: launch(tiles._replace(num_stages=stages)), rep=50) / 1e6 / copy_gbps
                     for stages in (1, 2, 3, 4)}
            print(f"{pass_} stages {str(dtype):15} {n_rows:>8}x{n_cols:<5} "
                  + " ".join(f"{k}:{v:.3f}" for k, v in timed.items()), flush=True)
            results.append({"pass": pass_, "dtype": str(dtype), "shape": [n_rows, n_cols], "stages": timed})
    return results


def sweep_backward_programs(copy_gbps):
    """The backward's programs per multiprocessor, with the default tiles."""
    from course_lib.kernels import weighted_sum_op as module

    default = module.BACKWARD_PROGRAMS_PER_SM
    results = []
    for dtype, (n_rows, n_cols), x, w, g in cases():
        n_bytes = 2 * x.numel() * x.element_size()
        timed = {}
        for programs in (2, 4, 8, 16, 32):
            module.BACKWARD_PROGRAMS_PER_SM = programs
            timed[programs] = n_bytes / median_ms(lambda: weighted_sum_backward(x, w, g), rep=50) / 1e6 / copy_gbps
        module.BACKWARD_PROGRAMS_PER_SM = default
        ceiling = copy_ceiling(n_bytes, copy_gbps)
        print(f"bwd programs/SM {str(dtype):15} {n_rows:>8}x{n_cols:<5} "
              + " ".join(f"{p}:{f:.3f}" for p, f in timed.items()) + f" | copy of same bytes {ceiling:.3f} C",
              flush=True)
        results.append({"pass": "bwd", "dtype": str(dtype), "shape": [n_rows, n_cols],
                        "programs_per_sm": timed, "copy_ceiling": ceiling})
    return results


def sweep_tiles(copy_gbps):
    """Every candidate tile for the forward and backward, beside the default."""
    results = []
    for dtype, (n_rows, n_cols), x, w, g in cases():
        for pass_, launch, default, bytes_moved in passes(x, w, g):
            default_tiles = default(n_cols, x.element_size())
            timed = []
            for tiles in [default_tiles, *candidates(n_cols, x.element_size())]:
                ms = median_ms(lambda: launch(tiles), rep=50)
                timed.append((bytes_moved / ms / 1e6 / copy_gbps, tiles))
            best = max(timed)
            print(f"{pass_} {str(dtype):15} {n_rows:>8}x{n_cols:<5} default {default_tiles} "
                  f"{timed[0][0]:.3f} C | best {best[1]} {best[0]:.3f} C | "
                  f"copy of same bytes {copy_ceiling(bytes_moved, copy_gbps):.3f} C", flush=True)
            results.append({"pass": pass_, "dtype": str(dtype), "shape": [n_rows, n_cols],
                            "default": [list(default_tiles), timed[0][0]],
                            "all": [[list(t), f] for f, t in sorted(timed, reverse=True)[:12]]})
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", choices=["tiles", "stages", "programs", "all"], default="all")
    parser.add_argument("--out", help="write every measurement to this JSON file")
    arguments = parser.parse_args()
    require_gpu("tuning")
    copy_gbps = copy_bandwidth_gbps()
    results = []
    if arguments.sweep in ("tiles", "all"):
        results += sweep_tiles(copy_gbps)
    if arguments.sweep in ("stages", "all"):
        results += sweep_stages(copy_gbps)
    if arguments.sweep in ("programs", "all"):
        results += sweep_backward_programs(copy_gbps)
    if arguments.out:
        with open(arguments.out, "w") as f:
            json.dump({"copy_gbps": copy_gbps, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
