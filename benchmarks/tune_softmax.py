"""Sweep tiles for the softmax kernels; how forward_tiles/backward_tiles are chosen.

    python -m benchmarks.tune_softmax [one_block|looped|threshold ...] [out.json]

one_block: rows per program and warps of the one-block kernels, on causal shapes
(the benchmark's, and shorter rows where several rows share a program).
looped: columns per tile, warps, and programs a multiprocessor
(LOOPED_PROGRAMS_PER_SM) of the looped kernels, on plain rows of 2**17.
threshold: both kernels on rows of 8192 to 32768 columns, to place
SINGLE_BLOCK_MAX_COLS.

Prints, for each case, the default tiles' time and the best swept tiles, as
fractions of copy bandwidth; with out.json, also the twelve best of each case.
"""

import itertools
import json
import sys

import torch
import triton

from course_lib.core.benchmarking import copy_bandwidth_gbps, median_ms, require_gpu
from course_lib.core.plans import LaunchPlan
from course_lib.kernels import softmax_op as softmax_module
from course_lib.kernels.softmax_op import backward_tiles, forward_tiles, softmax_backward, softmax_forward

from .bench_softmax import DTYPES, SHAPES, WIDE_SHAPE

ONE_BLOCK_CASES = [(True, (batch, n, n)) for batch, n in SHAPES + [(256, 128), (64, 512)]]
LOOPED_CASES = [(False, WIDE_SHAPE)]
THRESHOLD_CASES = [(False, (2048, 8192)), (False, (1024, 16384)), (False, (512, 32768)), (True, (1, 16384, 16384))]
ROWS = [1, 2, 4, 8, 16, 32, 64]
WARPS = [2, 4, 8, 16, 32]
LOOPED_COLS = [1024, 2048, 4096, 8192, 16384]
LOOPED_PROGRAMS_PER_SM = [1, 2, 4, 8]


def one_block_candidates(n_cols):
    """Whole rows, several a program up to 8192 values, 4 to 32 values a thread."""
    block_cols = triton.next_power_of_2(n_cols)
    for block_rows, warps in itertools.product(ROWS, WARPS):
        elements = block_rows * block_cols
        if elements <= max(8192, block_cols) and 4 <= elements // (32 * warps) <= 32:
            yield LaunchPlan(block_rows, block_cols, warps)


def looped_candidates(n_cols, cols=LOOPED_COLS, warps=WARPS):
    """One row at a time, tiles of 4 to 64 values a thread."""
    for block_cols, num_warps in itertools.product(cols, warps):
        if block_cols < n_cols and 4 <= block_cols // (32 * num_warps) <= 64:
            yield LaunchPlan(1, block_cols, num_warps)


def both_kernels(n_cols):
    yield from one_block_candidates(n_cols)
    yield from looped_candidates(n_cols, cols=[4096, 8192], warps=[8, 16])


def sweep(causal, shape, dtype, candidates, copy_gbps, label=""):
    """Time the default and every candidate tile, forward and backward."""
    x = torch.randn(shape, device="cuda", dtype=dtype)
    grad_y = torch.randn_like(x)
    y = softmax_forward(x, causal)
    n_bytes = x.numel() * x.element_size()
    # Causal: read the lower triangle and write all (backward: two triangles read).
    fwd_bytes, bwd_bytes = (1.5 * n_bytes, 2 * n_bytes) if causal else (2 * n_bytes, 3 * n_bytes)
    results = []
    for pass_, launch, default, bytes_moved in (
        ("fwd", lambda t: softmax_forward(x, causal, t), forward_tiles, fwd_bytes),
        ("bwd", lambda t: softmax_backward(y, grad_y, causal, t), backward_tiles, bwd_bytes),
    ):
        default_tiles = default(shape[-1], x.element_size())
        timed = []
        for tiles in [default_tiles, *candidates(shape[-1])]:
            try:
                ms = median_ms(lambda: launch(tiles), rep=50)
            except triton.runtime.errors.OutOfResources as error:
                print(f"    {tiles}: {error}")
                continue
            timed.append((bytes_moved / ms / 1e6 / copy_gbps, tiles))
        best = max(timed)
        kind = "causal" if causal else "plain"
        print(f"{pass_} {str(dtype):15} {kind:6} {'x'.join(map(str, shape)):>16}{label} default {default_tiles} "
              f"{timed[0][0]:.3f} C | best {best[1]} {best[0]:.3f} C", flush=True)
        results.append({"pass": pass_, "causal": causal, "dtype": str(dtype), "shape": list(shape), "label": label,
                        "default": [list(default_tiles), timed[0][0]],
                        "all": [[list(t), f] for f, t in sorted(timed, reverse=True)[:12]]})
    return results


def sweep_cases(cases, candidates, copy_gbps, label=""):
    return [r for dtype in DTYPES for causal, shape in cases
            for r in sweep(causal, shape, dtype, candidates, copy_gbps, label)]


def sweep_looped(copy_gbps):
    """The looped kernels at each number of programs a multiprocessor."""
    chosen = softmax_module.LOOPED_PROGRAMS_PER_SM
    results = []
    try:
        for programs in LOOPED_PROGRAMS_PER_SM:
            softmax_module.LOOPED_PROGRAMS_PER_SM = programs  # read by looped_grid at each launch
            results += sweep_cases(LOOPED_CASES, looped_candidates, copy_gbps, f" {programs}/SM")
    finally:
        softmax_module.LOOPED_PROGRAMS_PER_SM = chosen
    return results


SECTIONS = {
    "one_block": lambda copy_gbps: sweep_cases(ONE_BLOCK_CASES, one_block_candidates, copy_gbps),
    "looped": sweep_looped,
    "threshold": lambda copy_gbps: sweep_cases(THRESHOLD_CASES, both_kernels, copy_gbps),
}


def main():
    require_gpu("tuning")
    names = [a for a in sys.argv[1:] if a in SECTIONS] or list(SECTIONS)
    out = [a for a in sys.argv[1:] if a.endswith(".json")]
    copy_gbps = copy_bandwidth_gbps()
    print(f"copy bandwidth C = {copy_gbps:.0f} GB/s")
    results = {}
    for name in names:
        print(f"--- {name}", flush=True)
        results[name] = SECTIONS[name](copy_gbps)
    if out:
        with open(out[0], "w") as f:
            json.dump({"copy_gbps": copy_gbps, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
