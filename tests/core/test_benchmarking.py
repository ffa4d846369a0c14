import json
import re
import statistics
import time

import pytest
import torch
from conftest import gpu_only

from benchmarks import bench_local_attention, bench_routed_block
from course_lib.core import benchmarking
from course_lib.core.runtime import DEVICE


def test_row_counts_bandwidth_and_fraction_of_copy():
    timings = benchmarking.Timings(ms=2.0, gpu_ms=1.5)
    r = benchmarking.row("weighted_sum", "fwd", "course_lib", torch.bfloat16, (4, 8), timings, n_bytes=6e9,
                         copy_gbps=4000.0)
    assert r["gbps"] == pytest.approx(3000.0)
    assert r["frac_of_copy"] == pytest.approx(0.75)  # from ms, the benchmark's time
    assert r["ms"] == 2.0 and r["gpu_ms"] == 1.5
    assert r["gpu_frac_of_copy"] == pytest.approx(1.0)
    assert r["dtype"] == "bfloat16" and r["shape"] == [4, 8]
    assert r["bytes"] == 6_000_000_000


def test_row_counts_flops_only_when_given():
    timings = benchmarking.Timings(ms=2.0, gpu_ms=1.0)
    r = benchmarking.row("matmul", "fwd", "course_lib", torch.bfloat16, (4, 8, 16), timings, n_bytes=6e9,
                         copy_gbps=4000.0, flops=2e12)
    assert r["tflops"] == pytest.approx(1000.0) and r["gpu_tflops"] == pytest.approx(2000.0)
    assert r["frac_of_copy"] == pytest.approx(0.75)  # the rest of the row as without flops
    without = benchmarking.row("matmul", "fwd", "course_lib", torch.bfloat16, (4, 8, 16), timings, 6e9, 4000.0)
    assert "tflops" not in without and "gpu_tflops" not in without


def test_training_step_clears_the_gradients_and_runs_the_backward():
    x = torch.randn(5, 3, requires_grad=True)
    w = torch.randn(3, requires_grad=True)
    frozen = torch.randn(3)
    step = benchmarking.training_step(lambda x, w, frozen: x @ (w + frozen), x, w, frozen)
    step()
    first = (x.grad.clone(), w.grad.clone())
    step()  # the gradients are set to None first: they do not add up over steps
    torch.testing.assert_close((x.grad, w.grad), first)
    # Both gradients come from one output gradient g: grad_x = g v^T and grad_w = x^T g, v = w + frozen.
    v = (w + frozen).detach()
    column = v.abs().argmax()  # divide by the largest entry of v, never by one near zero
    g = x.grad[:, column] / v[column]
    torch.testing.assert_close(x.grad, g[:, None] * v[None, :], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(w.grad, x.detach().T @ g, rtol=1e-4, atol=1e-4)
    assert frozen.grad is None


def test_gpu_slug():
    assert benchmarking.gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert benchmarking.gpu_slug("NVIDIA A100-SXM4-80GB") == "nvidia-a100-sxm4-80gb"


def test_results_round_trip(tmp_path):
    rows = [benchmarking.row("weighted_sum", "bwd", "torch", torch.float32, (2, 3), benchmarking.Timings(1.0, 0.8), 1e6, 100.0)]
    path = benchmarking.write_results(rows, 100.0, tmp_path / "gpu.json")
    document = json.loads(path.read_text())
    assert set(document) == {"gpu", "torch", "triton", "commit", "date", "copy_gbps", "rows"}
    assert document["commit"] and re.fullmatch(r"\d{4}-\d{2}-\d{2}", document["date"])
    assert benchmarking.load_results(tmp_path)["gpu"]["rows"] == rows


def test_no_results_says_where_it_looked(tmp_path):
    # An empty answer would leave every speed section of the notebooks silently empty.
    with pytest.raises(FileNotFoundError, match=rf"no benchmark results \(\*.json\) in {tmp_path}"):
        benchmarking.load_results(tmp_path)


def test_a_file_that_is_not_results_is_named(tmp_path):
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ValueError, match=r"broken.json: not a benchmark results file"):
        benchmarking.load_results(tmp_path)


def test_stored_results_have_the_documented_shape():
    for name, document in benchmarking.load_results().items():
        assert document["copy_gbps"] > 0, name
        for r in document["rows"]:
            assert r["pass"] in ("fwd", "bwd", "step", "host"), (name, r)
            if r["pass"] == "host":  # benchmarks/host.py: the host's time of an eager step (course_lib, torch and
                # the floor: the same kernels through plain kernel[grid]), and its GPU time
                assert r["impl"] in ("course_lib", "torch", "floor") and 0 < r["ms"] and 0 < r["gpu_ms"], (name, r)
                assert r["ms"] == pytest.approx(statistics.median(r["host_ms_rounds"])), (name, r)
                continue
            impls = [impl for impl, _, _ in benchmarking.STEP_IMPLS]
            assert r["impl"] in (bench_routed_block.IMPLS if r["kernel"] == "routed_block" else impls), (name, r)
            assert r["pass"] == "step" or not r["impl"].endswith(".cudagraphs"), (name, r)  # graphs: steps only
            # A merged file (python -m benchmarks --merge) keeps each row's own run's ceiling.
            assert r["frac_of_copy"] == pytest.approx(r["gbps"] / r.get("copy_gbps", document["copy_gbps"]))
            # The GPU's own time is part of the benchmark's, but each is a median of its own
            # runs. Coordinate descent's eager reference is the exception: a Python loop of
            # hundreds of tiny kernels a call, whose GPU-alone time came out 1.16 and 1.41
            # times do_bench's at 4 x 131072 on two H200 hosts. It says nothing there. So
            # for the routed blocks that run such a loop eagerly (the reference's router,
            # colt5-attention's): 1.21 and 1.27 times at 8 x 2048 x 512 on an H200.
            many_tiny_kernels = r["impl"] in ("torch", "colt5_attention") and r["kernel"] in ("coor_descent",
                                                                                            "routed_block")
            assert 0 < r["gpu_ms"] and (many_tiny_kernels or r["gpu_ms"] <= 1.1 * r["ms"]), (name, r)
            assert r["gpu_frac_of_copy"] == pytest.approx(r["frac_of_copy"] * r["ms"] / r["gpu_ms"])
            if "bytes" in r:  # recorded since the copy ceilings were added
                assert r["gbps"] == pytest.approx(r["bytes"] / r["ms"] / 1e6), (name, r)
                assert 0 < r["copy_same_bytes_frac"] < 1.1, (name, r)  # a copy never far above C
        # The ceiling belongs to a number of bytes, not to an implementation: measured
        # once for each number in a run, it is the same in every row of the run that moves as many.
        # A merged file's kernels come from runs of their own, and two runs can measure the
        # same C to the last digit (the timer counts in ticks), so a kernel's rows are compared
        # among themselves.
        ceilings = {}
        for r in document["rows"]:
            if "bytes" in r:
                run_key = (r["kernel"], r["bytes"], r.get("copy_gbps"))
                ceilings.setdefault(run_key, set()).add(r["copy_same_bytes_frac"])
        assert all(len(values) == 1 for values in ceilings.values()), name


@gpu_only
def test_gpu_only_time_leaves_out_the_host():
    """A call that spends 2 ms on the host around a short kernel: median_ms times the
    host, gpu_only_ms the kernel; a long copy, with no host work to speak of, times the same."""
    x = torch.ones(2**20, device="cuda")

    def host_bound():
        time.sleep(0.002)
        return x * 2

    assert benchmarking.median_ms(host_bound, rep=50) > 1.5
    assert benchmarking.gpu_only_ms(host_bound, runs=10) < 0.5
    src = torch.randn(2**28 // 4, device="cuda")
    dst = torch.empty_like(src)
    copy_ms, copy_gpu_ms = benchmarking.median_ms(lambda: dst.copy_(src)), benchmarking.gpu_only_ms(lambda: dst.copy_(src))
    assert copy_gpu_ms == pytest.approx(copy_ms, rel=0.1)


@gpu_only
def test_gpu_only_time_holds_when_the_host_slows_down_after_the_first_call():
    """The sleep is sized from one call's host time; calls that then take the host ten
    times as long must not leave the GPU waiting inside the timed span."""
    x = torch.ones(2**20, device="cuda")
    calls = []

    def slowing_down():
        calls.append(None)
        time.sleep(0.0005 if len(calls) <= 2 else 0.005)  # the first two calls size the sleep
        return x * 2

    assert benchmarking.gpu_only_ms(slowing_down, runs=10) < 0.5


@gpu_only
def test_a_small_copy_reaches_less_of_c_than_a_large_one():
    """add_copy_ceilings: a copy moving 1 MiB spends most of its time starting and
    draining; one moving 1 GiB comes close to C, which is measured the same way."""
    copy_gbps = benchmarking.copy_bandwidth_gbps()
    rows = benchmarking.add_copy_ceilings(
        [{"bytes": 2**20}, {"bytes": 2**30}, {"bytes": 2**30 + 8}], copy_gbps)
    small, large, odd = (r["copy_same_bytes_frac"] for r in rows)
    assert small < 0.5 * large
    assert 0.8 < large < 1.1 and odd == pytest.approx(large, rel=0.1)


def test_routed_block_impls_run_one_block_each():
    """At a tiny size: every uncompiled implementation of the routed block benchmark
    builds and runs; course_lib and torch are one block (same weights) on other
    kernels, colt5_attention the package's own."""
    dim, seq_len = 16, 32
    assert list(bench_routed_block.IMPLS) == ["course_lib", "course_lib.compile", "course_lib.cudagraphs", "torch",
                                              "torch.compile", "torch.compile.cudagraphs", "colt5_attention"]
    assert bench_routed_block.num_heavy_tokens(4096) == 512  # the design's routing size
    x = torch.randn(2, seq_len, dim, device=DEVICE)
    outputs = {}
    for impl, (_, mode) in bench_routed_block.IMPLS.items():
        if mode is None:
            block, fn = bench_routed_block.make_block(impl, dim, seq_len, device=DEVICE, dtype=torch.float32,
                                                        window=8)
            assert fn is block
            outputs[impl] = fn(x)
            assert outputs[impl].shape == x.shape
            step = benchmarking.training_step(fn, x.requires_grad_(), parameters=block.parameters())
            step()
            first = [p.grad.clone() for p in block.parameters()]
            step()  # gradients set to None in between, not added to: the same gradients again
            for grad, p in zip(first, block.parameters()):
                torch.testing.assert_close(p.grad, grad)
    torch.testing.assert_close(outputs["course_lib"], outputs["torch"], rtol=1e-4, atol=1e-4)
    assert (outputs["colt5_attention"] - outputs["torch"]).abs().max() > 1e-3  # another block, not a copy


def test_local_attention_impls_compute_the_same_attention():
    """The local attention benchmark's two implementations agree at a tiny size (windows
    of 8, float32), on the routed block benchmark's light-branch shapes."""
    assert [(n, heads, head_dim) for _, heads, n, head_dim in bench_local_attention.SHAPES] == [
        (seq_len, bench_routed_block.HEADS, bench_routed_block.DIM_HEAD) for _, seq_len, _ in bench_routed_block.SHAPES]
    assert bench_local_attention.WINDOW == bench_routed_block.WINDOW
    assert all(head_dim == bench_local_attention.HEAD_DIM for *_, head_dim in bench_local_attention.SHAPES)
    projection = bench_local_attention.make_projection(2, 3, 32, 16, torch.float32, device=DEVICE)
    outputs = [fn(projection, window=8, head_dim=16)
               for fn in (bench_local_attention.course, bench_local_attention.written_scores)]
    assert outputs[0].shape == (2, 3, 32, 16)
    torch.testing.assert_close(*outputs, rtol=1e-5, atol=1e-5)
    grads = [torch.autograd.grad(out, projection, torch.ones_like(out))[0] for out in outputs]
    torch.testing.assert_close(*grads, rtol=1e-5, atol=1e-5)  # the gradient a step computes


def test_alternating_step_timings_takes_each_step_in_turn_and_keeps_the_median(monkeypatch):
    calls = []
    # Step "a" meets a slow moment of the host in one round; the median leaves it out.
    times = {"a": iter([1.0, 9.0, 1.0]), "b": iter([2.0, 2.0, 2.0]), "c": iter([3.0, 3.0, 3.0])}
    steps = {name: name for name in times}  # stand-ins: the patched timers get the step back

    def fake_median_ms(step, rep):
        calls.append((step, rep))
        return next(times[step])

    monkeypatch.setattr(benchmarking, "median_ms", fake_median_ms)
    monkeypatch.setattr(benchmarking, "gpu_only_ms", lambda step: {"a": 0.5, "b": 1.5, "c": 2.5}[step])
    timings = benchmarking.alternating_step_timings(steps, rounds=3)
    assert [step for step, _ in calls] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert {rep for _, rep in calls} == {200 // 3}
    assert timings == {"a": benchmarking.Timings(1.0, 0.5), "b": benchmarking.Timings(2.0, 1.5),
                       "c": benchmarking.Timings(3.0, 2.5)}


@gpu_only
def test_gpu_only_time_of_a_call_that_waits_for_the_gpu_is_its_kernels_time():
    """A call that reads a result back (a sync) cannot be queued ahead of the GPU however
    long it sleeps: gpu_only_ms must see that within a bounded number of runs and give the
    kernels' own time, not double the sleep until it hangs."""
    src = torch.randn(2**26 // 4, device="cuda")
    dst = torch.empty_like(src)

    def synchronizing():
        dst.copy_(src)
        return dst[0].item()

    started = time.perf_counter()
    gpu_ms = benchmarking.gpu_only_ms(synchronizing, runs=10)
    assert time.perf_counter() - started < 30
    copy_ms = benchmarking.kernel_ms(lambda: dst.copy_(src))
    assert gpu_ms == pytest.approx(copy_ms, rel=0.2)


def test_the_results_the_chapters_quote_are_complete_and_each_kernel_of_one_commit():
    """The reference file holds every pass of every registered kernel (forward, backward, the
    step eager and in CUDA graphs, with torch and torch.compile beside them) and the host rows;
    each kernel's forward and backward rows measured from one commit, and its step rows from
    one commit (``--steps-only`` re-measures them alone; a kernel added later is measured
    alone, beside the others' run): every comparison the book draws is between rows of one
    pass, measured in one run. The file names every commit and its last day; a superseded
    file names its successor."""
    from course_lib.registry import KERNELS

    documents = benchmarking.load_results()
    reference = benchmarking.reference_results()
    assert documents[benchmarking.REFERENCE_RESULTS] is not None and "superseded_by" not in reference
    commits = set(reference["commit"].split(", "))
    assert "unknown" not in commits
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", reference["date"])
    assert {r["commit"] for r in reference["rows"]} == commits
    have = {(r["kernel"], r["pass"], r["impl"]) for r in reference["rows"]}
    for kernel in KERNELS:
        names = kernel.result_names
        for passes_of_one_run in (("fwd", "bwd"), ("step",)):
            run_commits = {r["commit"] for r in reference["rows"]
                           if r["kernel"] in names and r["pass"] in passes_of_one_run}
            assert len(run_commits) <= 1, (kernel.name, passes_of_one_run, run_commits)
        passes = ["step"] if kernel.name == "routed_block" else ["fwd", "bwd", "step"]
        for pass_ in passes:
            for impl in ("course_lib", "torch", "torch.compile"):
                assert any((name, pass_, impl) in have for name in names), (kernel.name, pass_, impl)
        for impl in ("course_lib.cudagraphs", "torch.compile.cudagraphs"):
            assert any((name, "step", impl) in have for name in names), (kernel.name, impl)
    hosts = {r["kernel"] for r in reference["rows"] if r["pass"] == "host"}
    assert hosts >= {"weighted_sum", "softmax", "causal_softmax", "layernorm", "coor_descent"}
    for name, document in documents.items():
        if name != benchmarking.REFERENCE_RESULTS:
            assert document.get("superseded_by") in documents, f"{name}: quoted by no chapter, yet not superseded"
