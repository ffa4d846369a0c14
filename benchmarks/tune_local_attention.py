"""Sweep tiles for the local attention kernels; how FORWARD_TILES, BACKWARD_Q_TILES and
BACKWARD_KV_TILES were chosen.

    python -m benchmarks.tune_local_attention [--head-dims 64 128] [--out FILE.json]

For each head size (bfloat16, (8, 8, 4096, head_dim), windows of 128, q, k and v the
chunks of one projection as the block passes them) and each kernel, times every
candidate launch plan beside the default. The backward's two kernels are swept one at
a time, the other keeping its default tiles. Prints microseconds and the fraction of
copy bandwidth of the bytes each pass must move (bench_local_attention's counts).
"""

import argparse
import itertools
import json
import multiprocessing

import torch
import triton

from course_lib.core.plans import LaunchPlan
from course_lib.kernels import local_attention_op as la
from course_lib.core.benchmarking import copy_bandwidth_gbps, median_ms, require_gpu

from .bench_local_attention import WINDOW, make_projection, split_qkv

TILE_SHAPES = [(32, 64), (64, 32), (64, 64), (128, 32), (32, 128), (128, 64), (64, 128), (128, 128)]
WARPS = [4, 8]
STAGES = [1, 2, 3]


def candidates():
    for (block_m, block_n), warps, stages in itertools.product(TILE_SHAPES, WARPS, STAGES):
        yield LaunchPlan(block_m, block_n, warps, stages)


def kernels(head_dim):
    """Each kernel's default tiles, bytes moved, and a launch of it with given tiles."""
    q, k, v = split_qkv(make_projection(8, 8, 4096, head_dim, torch.bfloat16).detach(), head_dim)
    out, lse = la.local_attention_forward(q, k, v, WINDOW)
    grad_out = torch.randn_like(out)
    tensor_bytes = q.numel() * q.element_size()
    return {
        "forward": (la.FORWARD_TILES, 4 * tensor_bytes,
                    lambda t: la.local_attention_forward(q, k, v, WINDOW, tiles=t)),
        "backward_q": (la.BACKWARD_Q_TILES, 8 * tensor_bytes,
                       lambda t: la.local_attention_backward(grad_out, q, k, v, out, lse, WINDOW, q_tiles=t)),
        "backward_kv": (la.BACKWARD_KV_TILES, 8 * tensor_bytes,
                        lambda t: la.local_attention_backward(grad_out, q, k, v, out, lse, WINDOW, kv_tiles=t)),
    }


def compile_share(head_dim, share, workers):
    """Launch every worker-th candidate once, so Triton's disk cache holds its binary."""
    launches = kernels(head_dim)
    for i, (name, tiles) in enumerate(itertools.product(launches, candidates())):
        if i % workers == share:
            try:
                launches[name][2](tiles)
            except triton.runtime.errors.OutOfResources:
                pass  # reported by the timing pass


def compile_in_parallel(head_dim, workers):
    """Compiling is most of a sweep's time and runs on the host: spread it over processes."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers) as pool:
        pool.starmap(compile_share, [(head_dim, share, workers) for share in range(workers)])


def sweep(head_dim, copy_gbps):
    results = []
    for name, (table, n_bytes, run) in kernels(head_dim).items():
        default = la.tiles_for(table, head_dim)
        timed = []
        for tiles in [default, *candidates()]:
            try:
                timed.append((median_ms(lambda: run(tiles), rep=50) * 1e3, tiles))
            except triton.runtime.errors.OutOfResources as error:
                print(f"    {tuple(tiles)}: {error}", flush=True)
        best_us, best = min(timed)
        fraction = n_bytes / (best_us * 1e-6) / 1e9 / copy_gbps
        print(f"d={head_dim:<3} {name:12} default {tuple(default)} {timed[0][0]:7.1f} us | best {tuple(best)} "
              f"{best_us:7.1f} us ({fraction:.3f} C of the pass's bytes)", flush=True)
        results.append({"head_dim": head_dim, "kernel": name, "default": [list(default), timed[0][0]],
                        "best": [[list(t), us] for us, t in sorted(timed)[:12]]})
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--compile-workers", type=int, default=8, help="processes that compile the candidates first")
    parser.add_argument("--out", help="write every measurement to this JSON file")
    arguments = parser.parse_args()
    require_gpu("tuning")
    copy_gbps = copy_bandwidth_gbps()
    results = []
    for head_dim in arguments.head_dims:
        if arguments.compile_workers > 1:
            compile_in_parallel(head_dim, arguments.compile_workers)
        results += sweep(head_dim, copy_gbps)
    if arguments.out:
        with open(arguments.out, "w") as f:
            json.dump({"copy_gbps": copy_gbps, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
