"""The benchmark harness: median times, copy bandwidth, and the results file.

Every number is taken in one run: C, the bandwidth of a large device-to-device copy
(bytes read plus written over time), is measured beside the kernels, and each row
reports its bandwidth as a fraction of it.
"""

import json
import re
from pathlib import Path

import torch
import triton

from .runtime import ON_GPU, gpu_name

RESULTS_DIR = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def require_gpu(what="benchmarks"):
    if not ON_GPU:
        raise RuntimeError(f"{what} need a CUDA GPU of compute capability 8.0 or newer")


def median_ms(fn, rep=200):
    """Median time of ``fn`` in milliseconds over about ``rep`` ms of runs.

    do_bench clears the L2 cache between runs, so inputs are read from memory.
    """
    return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")


def fresh_compile(fn):
    """torch.compile(fn) with dynamo's caches cleared: call it once per shape.

    Every shape, dtype and grad mode is a new graph, and past dynamo's recompile limit
    (8 by default) torch.compile silently runs eager: the 'torch.compile' rows would
    then measure eager PyTorch.
    """
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False)


def forward_backward_ms(fn, *inputs):
    """Median times of ``fn(*inputs)`` without autograd, and of its backward.

    The backward is torch.autograd.grad with respect to every input, on one forward
    graph kept alive (retain_graph), with a random output gradient.
    """
    with torch.no_grad():
        forward = median_ms(lambda: fn(*inputs))
    y = fn(*inputs)
    grad_y = torch.randn_like(y)
    backward = median_ms(lambda: torch.autograd.grad(y, inputs, grad_y, retain_graph=True))
    return forward, backward


def copy_bandwidth_gbps(n_bytes=2**30):
    """Bandwidth of a large device-to-device copy, counting bytes read plus written."""
    require_gpu()
    src = torch.randn(n_bytes // 4, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    return 2 * n_bytes / ms / 1e6


def row(kernel, pass_, impl, dtype, shape, ms, n_bytes, copy_gbps):
    """One result in the shape of benchmarks/results/<gpu>.json."""
    gbps = n_bytes / ms / 1e6
    return {
        "kernel": kernel,
        "pass": pass_,
        "impl": impl,
        "dtype": str(dtype).replace("torch.", ""),
        "shape": [int(s) for s in shape],
        "ms": ms,
        "gbps": gbps,
        "frac_of_copy": gbps / copy_gbps,
    }


def gpu_slug(name=None):
    """'NVIDIA H200' -> 'nvidia-h200': the results file's name."""
    return re.sub(r"[^a-z0-9]+", "-", (name or gpu_name()).lower()).strip("-")


def write_results(rows, copy_gbps, path=None):
    path = Path(path or RESULTS_DIR / f"{gpu_slug()}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "gpu": gpu_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "copy_gbps": copy_gbps,
        "rows": rows,
    }
    path.write_text(json.dumps(document, indent=1) + "\n")
    return path


def load_results(results_dir=RESULTS_DIR):
    """Every stored results file, newest GPU name order: {file stem: document}."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(Path(results_dir).glob("*.json"))}
