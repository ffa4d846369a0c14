"""The benchmark harness: median times, copy bandwidth, and the results file.

Every number is taken in one run: C, the bandwidth of a large device-to-device copy
(bytes read plus written over time), is measured beside the kernels, and each row
reports its bandwidth as a fraction of it. Each row also keeps the GPU's own time of
the same calls (gpu_only_ms): where it is shorter, the host set the pace.
"""

import functools
import json
import os
import re
import statistics
import subprocess
import textwrap
import time
import warnings
from pathlib import Path
from typing import NamedTuple

import torch
import triton

from .runtime import ON_GPU, gpu_name

# Inside the package, so that an installed course_lib (Colab, pip install) carries the
# results its notebooks plot; pyproject.toml ships them as package data.
RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"


def require_gpu(what="benchmarks"):
    if not ON_GPU:
        raise RuntimeError(f"{what} need a CUDA GPU of compute capability 8.0 or newer")


def median_ms(fn, rep=200):
    """Median time of ``fn`` in milliseconds over about ``rep`` ms of runs.

    do_bench clears the L2 cache between runs, so inputs are read from memory.
    """
    return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")


@functools.cache
def _sleep_cycles_per_ms():
    """GPU clock cycles in a millisecond of torch.cuda._sleep, measured once."""
    cycles = 20_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / start.elapsed_time(end)


def gpu_only_ms(fn, runs=50):
    """Median time of ``fn`` on the GPU alone, in milliseconds, L2 cleared as in median_ms.

    median_ms times calls back to back, so a call whose host work (Python, autograd,
    launches) takes longer than its kernels leaves the GPU waiting, and that wait is
    timed too. Here the GPU sleeps before every call, three times as long as the call
    takes on the host, so all of the call is queued before its first kernel starts.
    A run counts only if it was: the GPU still asleep when the host had queued the
    whole call. The host's speed drifts, and a run where the GPU woke first would time
    the host's wait again; the sleep then doubles and the run is taken again.
    The difference from median_ms is what the host costs.

    A call that waits for the GPU itself (``.item()``, a sync inside a library) can never
    be queued ahead of it, however long the GPU sleeps: once the sleep has grown
    MAX_SLEEP_GROWTH-fold without a run counting, its GPU time is the sum of its kernels'
    times instead (kernel_ms), and a line says so.
    """
    cache = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    fn()
    torch.cuda.synchronize()
    started = time.perf_counter()
    fn()
    host_ms = (time.perf_counter() - started) * 1e3
    torch.cuda.synchronize()
    sleep_cycles = int(max(1.0, 3 * host_ms) * _sleep_cycles_per_ms())
    longest_sleep = MAX_SLEEP_GROWTH * sleep_cycles
    times = []
    for _ in range(4 * runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(sleep_cycles)
        cache.zero_()
        start.record()
        fn()
        queued_in_time = not start.query()  # the GPU had not reached the call's first kernel yet
        end.record()
        end.synchronize()
        if queued_in_time:
            times.append(start.elapsed_time(end))
            if len(times) == runs:
                return statistics.median(times)
        elif sleep_cycles >= longest_sleep:
            print(textwrap.fill(f"gpu_only_ms: {getattr(fn, '__name__', fn)} waits for the GPU inside the call "
                                "(it synchronizes); its GPU time is the sum of its kernels' times", 88),
                  flush=True)
            return kernel_ms(fn)
        else:
            sleep_cycles *= 2
    raise RuntimeError(f"gpu_only_ms: in {4 * runs} runs only {len(times)} had the call queued before the GPU "
                       f"reached it: the host's time for one call varies too much to time the GPU alone")


# How far gpu_only_ms lets the GPU's sleep grow past three times the host's time of a call
# before it concludes that the call waits for the GPU: far beyond the host's drift.
MAX_SLEEP_GROWTH = 64


def kernel_ms(fn, calls=5):
    """Milliseconds a call of ``fn`` keeps the GPU busy: the sum of its kernels' times in
    the profiler, a mean over ``calls`` calls (gaps between kernels not counted)."""
    fn()
    torch.cuda.synchronize()
    with warnings.catch_warnings():  # "Profiler clears events at the end of each cycle": one cycle here
        warnings.filterwarnings("ignore", message=".*Profiler clears events", category=UserWarning)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        return sum(e.device_time for e in gpu_events(profile)) / calls / 1e3


def gpu_events(profile):
    """The GPU's events (kernels, copies) of a torch.profiler run."""
    return [e for e in profile.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def fresh_compile(fn, mode=None):
    """torch.compile(fn, mode=mode) with dynamo's caches cleared: call it once per shape,
    just before timing it.

    Every shape, dtype and grad mode is a new graph, and past dynamo's recompile limit
    (8 by default) torch.compile silently runs eager: the 'torch.compile' rows would
    then measure eager PyTorch.
    """
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False, mode=mode)


class Timings(NamedTuple):
    """Milliseconds of one pass: median_ms, and gpu_only_ms of the same calls."""

    ms: float
    gpu_ms: float


def forward_backward_ms(fn, *inputs):
    """Timings of ``fn(*inputs)`` without autograd, and of its backward.

    The backward is torch.autograd.grad with respect to every input, on one forward
    graph kept alive (retain_graph), with a random output gradient.
    """
    def timings(call):
        return Timings(median_ms(call), gpu_only_ms(call))

    with torch.no_grad():
        forward = timings(lambda: fn(*inputs))
    y = fn(*inputs)
    grad_y = torch.randn_like(y)
    backward = timings(lambda: torch.autograd.grad(y, inputs, grad_y, retain_graph=True))
    return forward, backward


# The step's implementations: (impl name, whether it runs course_lib, torch.compile mode
# or None for eager). "reduce-overhead" records the step's kernels in CUDA graphs.
STEP_IMPLS = [
    ("course_lib", True, None),
    ("torch", False, None),
    ("torch.compile", False, "default"),
    ("course_lib.cudagraphs", True, "reduce-overhead"),
    ("torch.compile.cudagraphs", False, "reduce-overhead"),
]


def training_step(fn, *inputs, parameters=()):
    """One training step as a user's loop runs it: the gradients of the inputs and of
    ``parameters`` (a module's, say) set to None, ``fn(*inputs)``, and its backward with a
    fixed random output gradient.

    Each step starts a new CUDA-graph iteration: under mode="reduce-overhead" the
    gradients are outputs of a graph that its next replay overwrites, so they must be
    fresh tensors each step, never accumulated into.
    """
    leaves = [t for t in (*inputs, *parameters) if t.requires_grad]
    grad_y = torch.randn_like(fn(*inputs))

    def step():
        torch.compiler.cudagraph_mark_step_begin()
        for t in leaves:
            t.grad = None
        fn(*inputs).backward(grad_y)

    return step


STEP_ROUNDS = 5


def alternating_step_timings(steps, rounds=STEP_ROUNDS):
    """{name: Timings} of the ``steps`` ({name: step}), timed in rounds that take each step in
    turn, each round a 1/rounds share of median_ms's runs; a step's ms is the median of
    its rounds. The host's speed drifts over seconds on the lent GPU machines (twofold, at
    times), and where a step's host work outlasts its kernels, one step timed after
    another would compare those moments, not the steps. The GPU's own time does not
    drift, so gpu_only_ms times each step once."""
    ms = {name: [] for name in steps}
    names = list(steps)
    for round_ in range(rounds):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:  # a new first step each round
            ms[name].append(median_ms(steps[name], rep=200 // rounds))
    return {name: Timings(statistics.median(ms[name]), gpu_only_ms(step)) for name, step in steps.items()}


def step_rows(kernel, dtype, shape, course_fn, torch_fn, inputs, n_bytes, copy_gbps, flops=None):
    """A "step" row for every STEP_IMPLS entry; ``n_bytes`` counts the forward's and the
    backward's bytes together, as ``flops`` (where given) their floating-point operations.
    Every step is compiled and run before any is timed, then all are timed together
    (alternating_step_timings)."""
    torch._dynamo.reset()  # one reset a shape: the compiled steps below must all stay compiled
    steps = {}
    for impl, ours, mode in STEP_IMPLS:
        fn = course_fn if ours else torch_fn
        if mode == "reduce-overhead":
            # Inside a model the inputs would be the graph's own activations and
            # parameters; unmarked, CUDA graphs would copy them in at every replay.
            for t in inputs:
                torch._dynamo.mark_static_address(t)
        steps[impl] = training_step(torch.compile(fn, dynamic=False, mode=mode) if mode else fn, *inputs)
    for step in steps.values():  # any recompilation (the inputs marked static since) happens here
        for _ in range(3):
            step()
    timings = alternating_step_timings(steps)
    return [row(kernel, "step", impl, dtype, shape, timings[impl], n_bytes, copy_gbps, flops=flops) for impl in steps]


def copy_bandwidth_gbps(n_bytes=2**30):
    """Bandwidth of a large device-to-device copy, counting bytes read plus written."""
    require_gpu()
    src = torch.randn(n_bytes // 4, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    return 2 * n_bytes / ms / 1e6


@functools.cache
def same_bytes_copy_fraction(n_bytes, copy_gbps):
    """The fraction of C that a copy moving ``n_bytes`` (half of them read, half written)
    reaches on the GPU alone: what moving that many bytes costs at that size.

    C comes from copying 1 GiB (2 GiB moved); a smaller copy spends more of its time
    starting and draining, so at tens of megabytes even a copy stays well below C. A
    kernel's fraction of C is best read beside this."""
    require_gpu()
    src = torch.zeros(max(1, int(n_bytes) // 8), device="cuda")  # float32: n_bytes / 2 of them
    dst = torch.empty_like(src)
    ms = gpu_only_ms(lambda: dst.copy_(src))
    return 8 * src.numel() / ms / 1e6 / copy_gbps


def add_copy_ceilings(rows, copy_gbps):
    """Give every row its ``copy_same_bytes_frac``: same_bytes_copy_fraction of its bytes."""
    for result in rows:
        result["copy_same_bytes_frac"] = same_bytes_copy_fraction(result["bytes"], copy_gbps)
    return rows


def row(kernel, pass_, impl, dtype, shape, timings, n_bytes, copy_gbps, flops=None):
    """One result in the shape of course_lib/results/<gpu>.json, from Timings.

    ms, gbps and frac_of_copy come from median_ms, the benchmark's time; gpu_ms and
    gpu_frac_of_copy from the GPU's own time of the same calls (gpu_only_ms). ``bytes``
    is what the row counts as moved (add_copy_ceilings adds what a copy of as many
    bytes reaches). ``flops``, for a kernel that computes more than it moves (matmul),
    adds its rate from each time: tflops and gpu_tflops."""
    gbps = n_bytes / timings.ms / 1e6
    rates = {} if flops is None else {"tflops": flops / timings.ms / 1e9, "gpu_tflops": flops / timings.gpu_ms / 1e9}
    return {
        "kernel": kernel,
        "pass": pass_,
        "impl": impl,
        "dtype": str(dtype).replace("torch.", ""),
        "shape": [int(s) for s in shape],
        "bytes": int(n_bytes),
        "ms": timings.ms,
        "gbps": gbps,
        "frac_of_copy": gbps / copy_gbps,
        "gpu_ms": timings.gpu_ms,
        "gpu_frac_of_copy": n_bytes / timings.gpu_ms / 1e6 / copy_gbps,
        **rates,
    }


def gpu_slug(name=None):
    """'NVIDIA H200' -> 'nvidia-h200': the results file's name."""
    return re.sub(r"[^a-z0-9]+", "-", (name or gpu_name()).lower()).strip("-")


def measured_on():
    """Where results come from, as a results file's first keys: the GPU, torch and Triton,
    the commit of the code measured and the day. The commit is $COURSE_COMMIT (a GPU host
    given a copy of the tree without its history: scripts/gpu_run.sh sets it) or git's."""
    return {"gpu": gpu_name(), "torch": torch.__version__, "triton": triton.__version__,
            "commit": code_commit(), "date": time.strftime("%Y-%m-%d", time.gmtime())}


def code_commit():
    """The commit of the code being run: $COURSE_COMMIT, else git's HEAD, else "unknown"."""
    if os.environ.get("COURSE_COMMIT"):
        return os.environ["COURSE_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_document(document, path):
    """Write a results document (benchmark rows, chapter 7's training runs) as indented
    JSON, its folder created if needed; return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n")
    return path


def write_results(rows, copy_gbps, path=None):
    document = {**measured_on(), "copy_gbps": copy_gbps, "rows": rows}
    return write_document(document, path or RESULTS_DIR / f"{gpu_slug()}.json")


# The run the chapters quote: the GPU whose run made the notebooks' stored outputs. Its file
# holds every pass of every kernel (forward, backward, step, CUDA graphs, host) from one
# commit; a file marked "superseded_by" is kept for the Benchmarks page but no chapter reads it.
REFERENCE_RESULTS = "nvidia-h200"


def reference_results(results_dir=RESULTS_DIR):
    """The results document the chapters quote (REFERENCE_RESULTS), with its "gpu",
    "commit" and "date"."""
    return load_results(results_dir)[REFERENCE_RESULTS]


def load_results(results_dir=RESULTS_DIR):
    """Every stored results file, in file name order: {file stem: document}.

    A folder without results raises, naming the folder: an empty answer would leave every
    speed section of the notebooks silently empty."""
    paths = sorted(Path(results_dir).glob("*.json"))
    if not paths:
        raise FileNotFoundError(
            f"no benchmark results (*.json) in {results_dir}: course_lib was installed without its "
            "results, or none were recorded; `python -m benchmarks` on a GPU records them there")
    documents = {}
    for path in paths:
        try:
            documents[path.stem] = json.loads(path.read_text())
        except ValueError as error:
            raise ValueError(f"{path}: not a benchmark results file ({error})") from error
    return documents
