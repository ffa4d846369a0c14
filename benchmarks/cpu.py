"""Each public function on the CPU, where course_lib computes with its PyTorch references,
against the torch expression it replaces: forward, and forward + backward.

    python -m benchmarks.cpu                 # prints the table
    python -m benchmarks.cpu --out cpu.json  # and writes the rows

Not the interpreter (runtime.use_interpreter() is never called here): what a user's model
on a machine without a GPU gets. The target is within 3x of torch's own expression.
"""

import argparse
import json
import platform
import statistics
import time

import torch
import torch.nn.functional as F

import course_lib
from course_lib.core import references

TARGET_RATIO = 3.0
SHAPE = (256, 1024)


def _local_mask(n, window):
    position = torch.arange(n)
    first_key = (position // window - 1) * window
    return (position[None, :] <= position[:, None]) & (position[None, :] >= first_key[:, None])


def cases():
    """name -> (make inputs, course_lib's call, torch's expression), float32 at one size."""
    rows, cols = SHAPE
    mask = _local_mask(256, 64)
    hidden = torch.ones(cols // 4, cols // 4, dtype=torch.bool).triu(1)
    return {
        "weighted_sum": (lambda: (torch.randn(rows, cols), torch.randn(cols)),
                         course_lib.weighted_sum, lambda x, w: (x * w).sum(-1)),
        "softmax": (lambda: (torch.randn(rows, cols),), course_lib.softmax, lambda x: torch.softmax(x, -1)),
        "causal_softmax": (lambda: (torch.randn(4, cols // 4, cols // 4),), course_lib.causal_softmax,
                           lambda x: torch.softmax(x.masked_fill(hidden, -torch.inf), -1)),
        "layernorm": (lambda: (torch.randn(rows, cols), torch.randn(cols), torch.randn(cols)), course_lib.layernorm,
                      lambda x, g, b: F.layer_norm(x, (cols,), g, b)),
        "coor_descent": (lambda: (torch.randn(rows, cols),),
                         lambda s: course_lib.coor_descent(s, n_iters=20, k=64, eps=0.03, eps_init=4, eps_decay=0.7),
                         lambda s: references.coor_descent(s, n_iters=20, k=64, eps=0.03, eps_init=4,
                                                           eps_decay=0.7)),
        "local_causal_attention": (lambda: tuple(torch.randn(2, 4, 256, 64) for _ in "qkv"),
                                   lambda q, k, v: course_lib.local_causal_attention(q, k, v, 64),
                                   lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)),
        "matmul": (lambda: (torch.randn(rows, cols), torch.randn(cols, 512), torch.randn(512)),
                   lambda a, b, bias: course_lib.matmul(a, b, bias=bias, activation="gelu"),
                   lambda a, b, bias: F.gelu(a @ b + bias, approximate="tanh")),
    }


def step_of(function, inputs, backward):
    """One call as a user's code makes it: the forward, or forward and backward."""
    if not backward:
        return lambda: function(*inputs)
    leaves = [t.requires_grad_() if t.is_floating_point() else t for t in inputs]

    def step():
        for t in leaves:
            t.grad = None
        function(*leaves).sum().backward()
    return step


def median_ms(steps, rounds=15, calls=3):
    """Each step's median time (ms) over ``rounds``, the steps taking turns within each round
    (the machine's speed drifts; both see the same drift)."""
    times = [[] for _ in steps]
    for step in steps:
        step()  # the first call builds what later ones reuse
    for _ in range(rounds):
        for step, own in zip(steps, times):
            start = time.perf_counter()
            for _ in range(calls):
                step()
            own.append((time.perf_counter() - start) / calls)
    return [statistics.median(own) * 1e3 for own in times]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the rows to this JSON file")
    args = parser.parse_args()
    assert not course_lib.runtime.interpreting(), "this measures the references, not the interpreter"
    torch.manual_seed(0)
    rows = []
    for name, (make, ours, theirs) in cases().items():
        for backward in (False, True):
            ours_ms, torch_ms = median_ms([step_of(ours, make(), backward), step_of(theirs, make(), backward)])
            rows.append({"kernel": name, "pass": "fwd+bwd" if backward else "fwd", "impl": "course_lib (cpu)",
                         "ms": ours_ms, "torch_ms": torch_ms, "ratio": ours_ms / torch_ms})
            print(f"{name:>22} {rows[-1]['pass']:>7}  course_lib {ours_ms:8.3f} ms  torch {torch_ms:8.3f} ms  "
                  f"ratio {ours_ms / torch_ms:5.2f} (target {TARGET_RATIO:.0f})", flush=True)
    document = {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                "torch": torch.__version__, "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(document, f, indent=1)


if __name__ == "__main__":
    main()
