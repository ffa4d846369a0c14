"""The course's performance targets as data, and the check of a benchmark row against them.

The targets are the design's (the README's issues state the same numbers): each applies
to one kernel and pass, at some shapes, and bounds one measure of a row of
``course_lib/results/<gpu>.json``. Standard library only, so that the book's build
(``scripts/benchmarks_page.py``) can check the stored results without torch.

Every check is made twice: on the benchmark's time (``ms``, do_bench's median, the one
the targets are stated for) and on the GPU's own time of the same calls (``gpu_ms``).
Where only the first misses, the host's work for each call (Python, autograd, launches)
took longer than the GPU's and set the pace.
"""

import importlib.util
from pathlib import Path
from typing import Callable, NamedTuple

FRACTION = "fraction of C"
EAGER = "× torch"
COMPILE = "× torch.compile"
MEMORY = "peak extra ÷ input"
GRAPHS = "× torch.compile, both in CUDA graphs"  # course_lib.cudagraphs against torch.compile.cudagraphs
BOTH_COMPILED = "× torch.compile, both compiled"  # course_lib.compile against torch.compile
PEER = "× colt5_attention"  # the routed block against the colt5-attention package
PEAK_VS_PEER = "peak ÷ colt5_attention's"
PEAK_VS_COMPILE = "peak ÷ torch.compile's"
HOST = "host time ÷ torch eager's"  # of a training step, on the host alone ("host" rows)
FLOOR = "host time ÷ the floor's"  # the same kernels in a bare autograd.Function (benchmarks/floor.py)
OWN_GPU = "step ÷ its own GPU time"  # how far the host stretches a step past its kernels' time
AT_MOST = {MEMORY, PEAK_VS_PEER, PEAK_VS_COMPILE, HOST, FLOOR, OWN_GPU}  # every other measure is a lower bound

WIDE_ROW = 2**17  # the wide-row targets' width


class Target(NamedTuple):
    kernel: str
    pass_: str
    where: str  # the shapes it applies to, in words
    applies: Callable[[tuple], bool]  # shape -> whether it applies
    measure: str
    bound: float

    def describe(self):
        return f"{'≤' if self.measure in AT_MOST else '≥'} {self.bound:g} {self.measure}"


def _everywhere(shape):
    return True


def _not_wide(shape):
    return shape[-1] < WIDE_ROW


def _wide(shape):
    return shape[-1] >= WIDE_ROW


def _layernorm_wide_enough(shape):
    return 4096 <= shape[-1] < WIDE_ROW


def _layernorm_narrow(shape):
    return shape[-1] < 4096


def _block_large(shape):
    return tuple(shape) == (8, 4096, 1024)


def _block_small(shape):
    return tuple(shape) == (8, 2048, 512)


GEMM_SHAPES = {(4096, 4096, 4096), (8192, 8192, 8192), (16384, 1024, 4096)}


def _gemm_shapes(shape):
    return tuple(shape) in GEMM_SHAPES


TARGETS = [
    Target("weighted_sum", "fwd", "every shape", _everywhere, FRACTION, 0.85),
    Target("weighted_sum", "fwd", "every shape", _everywhere, EAGER, 1.0),
    Target("weighted_sum", "fwd", "every shape", _everywhere, COMPILE, 1.0),
    Target("weighted_sum", "bwd", "every shape", _everywhere, FRACTION, 0.80),
    Target("weighted_sum", "bwd", "every shape", _everywhere, EAGER, 1.5),
    Target("causal_softmax", "fwd", "every shape", _everywhere, FRACTION, 0.85),
    Target("causal_softmax", "fwd", "every shape", _everywhere, EAGER, 2.0),
    Target("causal_softmax", "fwd", "every shape", _everywhere, COMPILE, 1.2),
    Target("causal_softmax", "bwd", "every shape", _everywhere, FRACTION, 0.80),
    Target("causal_softmax", "bwd", "every shape", _everywhere, EAGER, 2.0),
    Target("causal_softmax", "bwd", "every shape", _everywhere, COMPILE, 1.3),
    Target("softmax", "fwd", "2^17 columns", _wide, FRACTION, 0.6),
    Target("softmax", "bwd", "2^17 columns", _wide, FRACTION, 0.6),
    Target("layernorm", "fwd", "N < 2^17", _not_wide, FRACTION, 0.85),
    Target("layernorm", "fwd", "N < 2^17", _not_wide, EAGER, 1.3),
    Target("layernorm", "fwd", "N < 2^17", _not_wide, COMPILE, 1.0),
    Target("layernorm", "bwd", "4096 ≤ N < 2^17", _layernorm_wide_enough, FRACTION, 0.75),
    Target("layernorm", "bwd", "4096 ≤ N < 2^17", _layernorm_wide_enough, EAGER, 2.0),
    Target("layernorm", "bwd", "N < 2^17", _not_wide, COMPILE, 1.1),
    Target("layernorm", "bwd", "N < 4096 (not slower than eager)", _layernorm_narrow, EAGER, 1.0),
    Target("layernorm", "fwd", "2^17 columns", _wide, FRACTION, 0.6),
    Target("layernorm", "bwd", "2^17 columns", _wide, FRACTION, 0.6),
    Target("coor_descent", "fwd", "every shape", _everywhere, EAGER, 30.0),
    Target("coor_descent", "fwd", "every shape", _everywhere, COMPILE, 3.0),
    Target("coor_descent", "fwd", "every shape", _everywhere, MEMORY, 3.0),
    Target("coor_descent", "bwd", "every shape", _everywhere, EAGER, 10.0),
    Target("coor_descent", "bwd", "every shape", _everywhere, COMPILE, 3.0),
    Target("coor_descent", "bwd", "every shape", _everywhere, MEMORY, 3.0),
    # The training step (forward and backward as a user's loop calls them), on do_bench's time.
    Target("weighted_sum", "step", "every shape", _everywhere, EAGER, 1.0),
    Target("weighted_sum", "step", "every shape", _everywhere, GRAPHS, 1.0),
    Target("causal_softmax", "step", "every shape", _everywhere, EAGER, 2.0),
    Target("causal_softmax", "step", "every shape", _everywhere, GRAPHS, 1.3),
    Target("softmax", "step", "every shape", _everywhere, EAGER, 1.0),
    Target("softmax", "step", "every shape", _everywhere, GRAPHS, 1.0),
    Target("layernorm", "step", "every shape", _everywhere, EAGER, 1.0),
    Target("layernorm", "step", "every shape", _everywhere, GRAPHS, 1.0),
    Target("coor_descent", "step", "every shape", _everywhere, EAGER, 10.0),
    Target("coor_descent", "step", "every shape", _everywhere, COMPILE, 1.5),
    Target("coor_descent", "step", "every shape", _everywhere, GRAPHS, 3.0),
    # The host's time for the eager training step (benchmarks/host.py), against torch eager's
    # and against the floor's: what course_lib adds to its kernels' launches and autograd's work.
    *(Target(kernel, "host", "every shape", _everywhere, measure, bound)
      for kernel in ("weighted_sum", "softmax", "causal_softmax", "layernorm", "coor_descent")
      for measure, bound in ((HOST, 1.5), (FLOOR, 1.15))),
    # Chapter 7's fused local attention, against the same attention with its scores
    # written (the references, eager and compiled): set when the kernel was added, at
    # about two thirds of what it first measured on an H200.
    Target("local_attention", "fwd", "every shape", _everywhere, COMPILE, 2.0),
    Target("local_attention", "bwd", "every shape", _everywhere, COMPILE, 1.5),
    Target("local_attention", "step", "every shape", _everywhere, EAGER, 2.0),
    Target("local_attention", "step", "every shape", _everywhere, COMPILE, 1.5),
    Target("local_attention", "step", "every shape", _everywhere, GRAPHS, 1.0),
    # Chapter 6's matrix multiplication against cuBLAS (torch.matmul): on one amount of work,
    # the ratio of times is the ratio of TFLOP/s. The fused epilogue (bias and gelu in the
    # kernel) ahead of torch's product, bias and gelu as separate operations.
    Target("matmul", "fwd", "M×N×K 4096³, 8192³, 16384×1024×4096", _gemm_shapes, EAGER, 0.85),
    Target("matmul", "bwd", "M×N×K 4096³, 8192³, 16384×1024×4096", _gemm_shapes, EAGER, 0.85),
    Target("matmul_bias_gelu", "fwd", "every shape", _everywhere, EAGER, 1.0),
    # The training step (forward and backward) as a loop calls it, eager and in CUDA graphs.
    Target("matmul", "step", "4096³", _everywhere, EAGER, 0.85),
    Target("matmul", "step", "4096³", _everywhere, GRAPHS, 0.85),
    # Its backward: gelu's derivative in one pass, then the two products.
    Target("matmul_bias_gelu", "bwd", "every shape", _everywhere, EAGER, 0.85),
    # Chapter 7's routed block: its step against the package it comes from and the
    # reference compiled, in time and in peak memory.
    Target("routed_block", "step", "every shape", _everywhere, PEER, 1.5),
    Target("routed_block", "step", "every shape", _everywhere, BOTH_COMPILED, 1.2),
    Target("routed_block", "step", "every shape", _everywhere, PEAK_VS_PEER, 1.0),
    Target("routed_block", "step", "every shape", _everywhere, PEAK_VS_COMPILE, 1.0),
    # Its eager step, host-bound: how far past the GPU's own time the host's work stretches it.
    Target("routed_block", "step", "8×4096×1024", _block_large, OWN_GPU, 1.5),
    Target("routed_block", "step", "8×2048×512", _block_small, OWN_GPU, 2.5),
]


def _load_registry():
    """``course_lib/registry.py``, read by its path: it needs only the standard library,
    while importing ``course_lib`` would load torch, which the book's build does without."""
    path = Path(__file__).resolve().parents[1] / "course_lib" / "registry.py"
    spec = importlib.util.spec_from_file_location("course_lib_registry_for_targets", path)
    registry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(registry)
    return registry


REGISTERED = {name for kernel in _load_registry().KERNELS for name in kernel.result_names}
_unregistered = sorted({target.kernel for target in TARGETS} - REGISTERED)
if _unregistered:
    raise ValueError(f"targets for {', '.join(_unregistered)}, which course_lib/registry.py does not list")


class Check(NamedTuple):
    target: Target
    value: float | None  # from the benchmark's time; None when a row it needs is missing
    gpu_value: float | None  # from the GPU's own time

    @property
    def met(self):
        return _within(self.target, self.value)

    @property
    def met_on_gpu(self):
        return _within(self.target, self.gpu_value)


def _within(target, value):
    if value is None:
        return False
    return value <= target.bound if target.measure in AT_MOST else value >= target.bound


def _element_size(dtype):
    """Of the input: a row's dtype names it first ("bfloat16 (float32 params)")."""
    return {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}[dtype.split()[0]]


def _peak_ratio(ours, other):
    if ours is None or other is None or "peak_bytes" not in ours or not other.get("peak_bytes"):
        return None
    return ours["peak_bytes"] / other["peak_bytes"]


def _measure(measure, ours, eager, compiled, graphs, compiled_graphs, peer, ours_compiled, floor, time_key,
             fraction_key):
    if measure == FRACTION:
        return ours.get(fraction_key)
    if measure == MEMORY:
        if "peak_extra_bytes" not in ours:
            return None
        input_bytes = _element_size(ours["dtype"])
        for size in ours["shape"]:
            input_bytes *= size
        return ours["peak_extra_bytes"] / input_bytes
    if measure == PEAK_VS_PEER:
        return _peak_ratio(ours, peer)
    if measure == PEAK_VS_COMPILE:
        return _peak_ratio(ours, compiled)
    if measure in (HOST, FLOOR):  # host rows hold the host's time as ms, whichever time the check reads
        other = eager if measure == HOST else floor
        return ours["ms"] / other["ms"] if other and other.get("ms") else None
    if measure == OWN_GPU:  # on the GPU's own time this is 1: a miss is the host's
        return ours[time_key] / ours["gpu_ms"] if ours.get("gpu_ms") else None
    if measure == GRAPHS:
        ours, other = graphs, compiled_graphs
    elif measure == BOTH_COMPILED:
        ours, other = ours_compiled, compiled
    elif measure == PEER:
        other = peer
    else:
        other = eager if measure == EAGER else compiled
    if ours is None or other is None or not ours.get(time_key) or other.get(time_key) is None:
        return None
    return other[time_key] / ours[time_key]


def check(ours, eager=None, compiled=None, graphs=None, compiled_graphs=None, peer=None, ours_compiled=None,
          floor=None):
    """The Checks of course_lib's row ``ours`` against every target that applies to it,
    with the torch and torch.compile rows of the same pass, dtype and shape, for a
    step, the course_lib.cudagraphs and torch.compile.cudagraphs rows, and for the
    routed block, colt5_attention's row (``peer``) and course_lib.compile's (``ours_compiled``),
    and for a host row, the floor's (benchmarks/floor.py)."""
    shape = tuple(ours["shape"])
    others = (eager, compiled, graphs, compiled_graphs, peer, ours_compiled, floor)
    return [
        Check(
            target,
            _measure(target.measure, ours, *others, "ms", "frac_of_copy"),
            _measure(target.measure, ours, *others, "gpu_ms", "gpu_frac_of_copy"),
        )
        for target in TARGETS
        if target.kernel == ours["kernel"] and target.pass_ == ours["pass"] and target.applies(shape)
    ]
