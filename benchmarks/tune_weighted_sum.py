"""Sweep tile sizes for the weighted-sum kernels; how forward_tiles/backward_tiles were chosen.

    python -m benchmarks.tune_weighted_sum [out.json]

Prints, for each shape and dtype, the default tiles' time and the best swept tiles,
both as fractions of copy bandwidth.
"""

import itertools
import json
import sys

import torch

from course_lib.benchmarking import copy_bandwidth_gbps, median_ms, require_gpu
from course_lib.weighted_sum import (
    backward_tiles,
    forward_tiles,
    weighted_sum_backward,
    weighted_sum_forward,
)

from .bench_weighted_sum import DTYPES, SHAPES

ROWS = [1, 2, 4, 8, 16, 32, 64]
COLS = [64, 128, 256, 512, 1024, 2048, 4096]
WARPS = [4, 8]


def candidates(n_cols, element_size):
    for block_rows, block_cols, warps in itertools.product(ROWS, COLS, WARPS):
        elements = block_rows * block_cols
        if block_cols <= 2 * max(n_cols, 64) and 2048 <= elements * element_size <= 32768:
            if 32 * warps <= elements:
                yield block_rows, block_cols, warps


def main():
    require_gpu("tuning")
    copy_gbps = copy_bandwidth_gbps()
    results = []
    for dtype in DTYPES:
        for n_rows, n_cols in SHAPES:
            x = torch.randn(n_rows, n_cols, device="cuda", dtype=dtype)
            w = torch.randn(n_cols, device="cuda", dtype=dtype)
            g = torch.randn(n_rows, device="cuda", dtype=dtype)
            n_bytes = x.numel() * x.element_size()
            for pass_, launch, default, bytes_moved in (
                ("fwd", lambda t: weighted_sum_forward(x, w, t), forward_tiles, n_bytes),
                ("bwd", lambda t: weighted_sum_backward(x, w, g, t), backward_tiles, 2 * n_bytes),
            ):
                default_tiles = default(n_cols, x.element_size())
                timed = []
                for tiles in [default_tiles, *candidates(n_cols, x.element_size())]:
                    ms = median_ms(lambda: launch(tiles), rep=50)
                    timed.append((bytes_moved / ms / 1e6 / copy_gbps, tiles))
                best = max(timed)
                print(f"{pass_} {str(dtype):15} {n_rows:>8}x{n_cols:<5} default {default_tiles} "
                      f"{timed[0][0]:.3f} C | best {best[1]} {best[0]:.3f} C", flush=True)
                results.append({"pass": pass_, "dtype": str(dtype), "shape": [n_rows, n_cols],
                                "default": [list(default_tiles), timed[0][0]],
                                "all": [[list(t), f] for f, t in sorted(timed, reverse=True)[:12]]})
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump({"copy_gbps": copy_gbps, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
