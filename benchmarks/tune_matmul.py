"""Time every configuration of matmul's autotuning space (matmul_op.CONFIGS); how the
space was chosen, and how to check it on another GPU.

    python -m benchmarks.tune_matmul [--dtype bfloat16] [--out FILE.json]

At each of bench_matmul's shapes, for the forward's product and the backward's two (on
transposed views, as matmul_backward launches them), prints every configuration's TFLOP/s
beside torch.matmul's, best first. A configuration that never wins anywhere can leave
the space; a shape where the best is far below torch.matmul wants a new one.
"""

import argparse
import json

import torch

from course_lib.core.benchmarking import median_ms, require_gpu
from course_lib.kernels import matmul_op

from .bench_matmul import SHAPES


def products(m, n, k, dtype):
    """{name: (a, b)}: the forward's a @ b and the backward's grad_c @ bᵀ and aᵀ @ grad_c."""
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    grad_c = torch.randn(m, n, device="cuda", dtype=dtype)
    return {"fwd a @ b": (a, b), "bwd grad_c @ bT": (grad_c, b.t()), "bwd aT @ grad_c": (a.t(), grad_c)}


def sweep(dtype):
    results = []
    for shape in SHAPES:
        for name, (a, b) in products(*shape, dtype).items():
            c = torch.empty(a.shape[0], b.shape[1], device="cuda", dtype=dtype)
            flops = 2 * a.shape[0] * a.shape[1] * b.shape[1]
            timed = [("torch.matmul", median_ms(lambda: torch.matmul(a, b, out=c)))]
            for config in matmul_op.CONFIGS:
                try:
                    timed.append((str(config), median_ms(lambda: matmul_op.launch_matmul(a, b, c, config=config))))
                except Exception as error:  # a configuration that does not fit this GPU's shared memory
                    print(f"{shape} {name}: {config} failed: {type(error).__name__}")
            print(f"\n{shape} {name}")
            for label, ms in sorted(timed, key=lambda item: item[1]):
                print(f"  {flops / ms / 1e9:7.1f} TFLOP/s  {ms * 1e3:8.1f} us  {label}")
                results.append({"shape": shape, "product": name, "config": label, "ms": ms})
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--out", help="also write the timings here (JSON)")
    arguments = parser.parse_args()
    require_gpu("the sweep")
    results = sweep(getattr(torch, arguments.dtype))
    if arguments.out:
        with open(arguments.out, "w") as file:
            json.dump(results, file, indent=1)


if __name__ == "__main__":
    main()
