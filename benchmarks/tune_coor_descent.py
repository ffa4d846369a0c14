"""Sweep launch plans for the coordinate-descent kernels; how forward_plan/backward_plan were chosen.

    python -m benchmarks.tune_coor_descent [--out FILE.json]

For each benchmark shape, times the default plan and every candidate: whole rows in
registers with several warp counts, and rows split into tiles of several sizes (the
forward's split plans run in one launch, all programs resident, as forward_plan
makes them). Prints the default and the best few, in microseconds.
"""

import argparse
import json
import math

import torch
import triton

from course_lib.core.benchmarking import median_ms, require_gpu
from course_lib.kernels.coor_descent_op import (
    BackwardPlan,
    ForwardPlan,
    backward_plan,
    coor_descent_backward,
    coor_descent_forward,
    eps_schedule,
    forward_plan,
)
from course_lib.core.runtime import multiprocessor_count

from .bench_coor_descent import SETTINGS, SHAPES

WARPS = [1, 2, 4, 8, 16]
TILES = [1024, 2048, 4096, 8192, 16384]
WHOLE_ROW_MAX = 32768


def forward_candidates(n_rows, n_cols):
    sms = multiprocessor_count()
    if n_cols <= WHOLE_ROW_MAX:
        block = triton.next_power_of_2(n_cols)
        for warps in WARPS:
            if 32 * warps <= block:
                yield ForwardPlan(block, 1, n_rows, warps, True)
    for block in TILES:
        tiles = triton.cdiv(n_cols, block)
        if 1 < tiles <= sms:
            for warps in WARPS[2:]:
                yield ForwardPlan(block, tiles, min(n_rows, sms // tiles), warps, True)


def backward_candidates(n_rows, n_cols):
    if n_cols <= WHOLE_ROW_MAX:
        block = triton.next_power_of_2(n_cols)
        for warps in WARPS:
            if 32 * warps <= block:
                yield BackwardPlan(block, 1, warps)
    for block in TILES:
        if block < n_cols:
            for warps in WARPS[2:]:
                yield BackwardPlan(block, triton.cdiv(n_cols, block), warps)


def sweep(pass_, launch, default, candidates):
    timed = []
    for plan in [default, *(plan for plan in candidates if plan != default)]:
        try:
            timed.append((median_ms(lambda: launch(plan), rep=50) * 1e3, plan))
        except Exception as error:  # a plan may not compile (registers, shared memory)
            print(f"  {pass_} {plan}: {type(error).__name__}: {str(error).splitlines()[0][:80]}")
    return timed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write every measurement to this JSON file")
    arguments = parser.parse_args()
    require_gpu("tuning")
    results = []
    for n_rows, n_cols in SHAPES:
        s = torch.randn(n_rows, n_cols, device="cuda")
        dy = torch.randn_like(s)
        schedule = eps_schedule(SETTINGS["n_iters"], SETTINGS["eps"], float(SETTINGS["eps_init"]),
                                SETTINGS["eps_decay"], s.device)
        logk = math.log(n_cols / 8)
        _, a, row_max = coor_descent_forward(s, None, logk, schedule)
        for pass_, launch, default, candidates in (
            ("fwd", lambda p: coor_descent_forward(s, None, logk, schedule, p),
             forward_plan(n_rows, n_cols), forward_candidates(n_rows, n_cols)),
            ("bwd", lambda p: coor_descent_backward(s, None, logk, schedule, a, row_max, dy, p),
             backward_plan(n_rows, n_cols), backward_candidates(n_rows, n_cols)),
        ):
            timed = sweep(pass_, launch, default, candidates)
            best = sorted(timed, key=lambda t: t[0])
            print(f"{pass_} {n_rows:>5}x{n_cols:<6} default {timed[0][1]} {timed[0][0]:8.1f} us", flush=True)
            for us, plan in best[:4]:
                print(f"      {us:8.1f} us  {plan}", flush=True)
            results.append({"pass": pass_, "shape": [n_rows, n_cols], "default": [list(timed[0][1]), timed[0][0]],
                            "all": [[list(plan), us] for us, plan in best]})
    if arguments.out:
        with open(arguments.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
