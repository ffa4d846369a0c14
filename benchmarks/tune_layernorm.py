"""Sweep the LayerNorm kernels' tiles: how forward_tiles and backward_config are chosen.

    python -m benchmarks.tune_layernorm [--pass fwd|bwd] [--dtype float32|bfloat16] [--out out.json]

Prints, for each shape and dtype, the default's fraction of copy bandwidth and the best
candidates (bytes counted as in bench_layernorm). Both sides of each threshold are
swept: whole rows in registers and the looped / two-stage kernels. The two-stage
backward is swept in two steps: the partial-sums tiles and programs a multiprocessor
with the default dx tiles, then the dx tiles with the best of those. Every candidate's
result is checked against the default's, so a miscompiled tile shows as WRONG.
"""

import argparse
import itertools
import json

import torch
import triton
from triton.runtime.errors import OutOfResources

from course_lib.core.benchmarking import copy_bandwidth_gbps, median_ms, require_gpu
from course_lib.kernels.layernorm_op.whole_rows import layernorm_backward, layernorm_forward
from course_lib.core.plans import LaunchPlan
from course_lib.kernels.layernorm_op.parts import BackwardConfig, backward_config, forward_tiles

from .bench_layernorm import DTYPES, SHAPES

TOP = 5  # candidates printed a shape
STAGES = [1, 2, 3]


def _values_a_thread(tiles):
    return tiles.block_rows * tiles.block_cols // (32 * tiles.num_warps)


def forward_candidates(n_cols):
    width = triton.next_power_of_2(n_cols)
    if width <= 32768:  # whole rows in registers
        for rows, warps in itertools.product([1, 2, 4, 8, 16], [2, 4, 8, 16, 32]):
            tiles = LaunchPlan(rows, width, warps)
            if (rows == 1 or rows * width <= 16384) and 4 <= _values_a_thread(tiles) <= 64:
                yield tiles
    for cols, warps, stages in itertools.product([2048, 4096, 8192, 16384], [4, 8, 16], STAGES):  # looped
        tiles = LaunchPlan(1, cols, warps, stages)
        if cols < n_cols and 4 <= _values_a_thread(tiles) <= 32:
            yield tiles


def backward_candidates(n_cols):
    """Whole rows in registers; the two-stage kernels come from partials_candidates and dx_candidates."""
    width = triton.next_power_of_2(n_cols)
    if width > 16384:
        return
    for rows, warps, stages in itertools.product([1, 2, 4, 8], [4, 8, 16], STAGES):
        tiles = LaunchPlan(rows, width, warps, stages)
        if (rows == 1 or rows * width <= 8192) and 8 <= _values_a_thread(tiles) <= 32:
            for per_sm in [1, 2, 4, 8]:
                if warps * per_sm <= 64:
                    yield BackwardConfig(tiles, per_sm)


def partials_candidates(n_cols, dx_tiles):
    shapes = [(8, 256), (16, 256), (4, 512), (8, 512), (2, 1024), (4, 1024)]
    for (rows, cols), warps, stages, per_sm in itertools.product(shapes, [4, 8], [1, 2], [2, 4, 8]):
        if cols < n_cols:
            yield BackwardConfig(LaunchPlan(rows, cols, warps, stages), per_sm, dx_tiles)


def dx_candidates(best_partials):
    for rows, cols, warps, stages in itertools.product([1, 2], [2048, 4096, 8192], [4, 8, 16], [1, 2]):
        tiles = LaunchPlan(rows, cols, warps, stages)
        if 4 <= _values_a_thread(tiles) <= 32:
            yield best_partials._replace(dx_tiles=tiles)


def sweep(launch, default, candidates, n_bytes, copy_gbps, dtype):
    """[(fraction of copy bandwidth, config, matches the default's result)], best first; and the default's."""
    reference = launch(default)
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    timed = []
    for config in [default, *candidates]:
        try:
            got = launch(config)
        except OutOfResources as error:  # too many stages for shared memory, say
            print(f"    skipped {config}: {error}", flush=True)
            continue
        right = all(torch.allclose(a.float(), b.float(), rtol=tolerance, atol=tolerance)
                    for a, b in zip(got, reference))
        ms = median_ms(lambda: launch(config), rep=30)
        timed.append((n_bytes / ms / 1e6 / copy_gbps, config, right))
    return sorted(timed[1:], key=lambda t: t[0], reverse=True), timed[0]


def report(pass_, dtype, shape, ranked, default, results):
    print(f"{pass_} {str(dtype):15} {shape[0]:>6}x{shape[1]:<6} default {default[1]} {default[0]:.3f} C", flush=True)
    for fraction, config, right in ranked[:TOP]:
        print(f"    {fraction:.3f} C  {config}{'' if right else '  WRONG'}", flush=True)
    wrong = [config for _, config, right in ranked if not right]
    if wrong:
        print(f"    WRONG results from {len(wrong)} candidates: {wrong}", flush=True)
    results.append({
        "pass": pass_, "dtype": str(dtype), "shape": list(shape),
        "default": [repr(default[1]), default[0]],
        "top": [[repr(config), fraction, right] for fraction, config, right in ranked[:3 * TOP]],
    })


def tune_forward(x, gamma, beta, copy_gbps, results):
    n_cols = x.shape[-1]

    def launch(tiles):
        return layernorm_forward(x, gamma, beta, 1e-5, save_stats=False, tiles=tiles)[:1]

    default = forward_tiles(n_cols, x.element_size())
    n_bytes = 2 * x.numel() * x.element_size()
    ranked, default_timed = sweep(launch, default, forward_candidates(n_cols), n_bytes, copy_gbps, x.dtype)
    report("fwd", x.dtype, x.shape, ranked, default_timed, results)


def tune_backward(x, gamma, beta, copy_gbps, results):
    n_cols = x.shape[-1]
    grad_y = torch.randn_like(x)
    _, stats = layernorm_forward(x, gamma, beta, 1e-5, save_stats=True)

    def launch(config):
        return layernorm_backward(grad_y, x, gamma, True, stats, config=config)

    default = backward_config(n_cols, x.element_size())
    n_bytes = 3 * x.numel() * x.element_size()
    ranked, default_timed = sweep(launch, default, backward_candidates(n_cols), n_bytes, copy_gbps, x.dtype)
    if n_cols > 4096:
        dx_tiles = default.dx_tiles or backward_config(2**20, x.element_size()).dx_tiles
        two_stage, _ = sweep(launch, default, partials_candidates(n_cols, dx_tiles), n_bytes, copy_gbps, x.dtype)
        best_partials = next((config for _, config, right in two_stage if right), default)
        dx_ranked, _ = sweep(launch, default, dx_candidates(best_partials), n_bytes, copy_gbps, x.dtype)
        ranked = sorted(ranked + two_stage + dx_ranked, key=lambda t: t[0], reverse=True)
    report("bwd", x.dtype, x.shape, ranked, default_timed, results)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pass", dest="pass_", choices=["fwd", "bwd"], help="one pass only")
    parser.add_argument("--dtype", choices=[str(d).replace("torch.", "") for d in DTYPES], help="one dtype only")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    require_gpu("tuning")
    copy_gbps = copy_bandwidth_gbps()
    print(f"copy bandwidth C = {copy_gbps:.0f} GB/s", flush=True)
    dtypes = [getattr(torch, args.dtype)] if args.dtype else DTYPES
    results = []
    for dtype in dtypes:
        for n_rows, n_cols in SHAPES:
            x = torch.randn(n_rows, n_cols, device="cuda", dtype=dtype)
            gamma = torch.randn(n_cols, device="cuda", dtype=dtype)
            beta = torch.randn(n_cols, device="cuda", dtype=dtype)
            if args.pass_ in (None, "fwd"):
                tune_forward(x, gamma, beta, copy_gbps, results)
            if args.pass_ in (None, "bwd"):
                tune_backward(x, gamma, beta, copy_gbps, results)
            if args.out:  # after every shape, so a run cut short keeps what it measured
                with open(args.out, "w") as f:
                    json.dump({"copy_gbps": copy_gbps, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
