"""The benchmark targets (benchmarks/targets.py) and the book's page built from the results
(scripts/benchmarks_page.py)."""

import importlib.util
import json
from pathlib import Path

import pytest

from benchmarks import targets
from course_lib.core import benchmarking

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("benchmarks_page", ROOT / "scripts" / "benchmarks_page.py")
benchmarks_page = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(benchmarks_page)


def result(kernel, pass_, impl, shape, ms, gpu_ms, frac=None, dtype="float32", **extra):
    frac = 0.9 if frac is None else frac
    return {"kernel": kernel, "pass": pass_, "impl": impl, "dtype": dtype, "shape": list(shape), "ms": ms,
            "gbps": 1.0, "frac_of_copy": frac, "gpu_ms": gpu_ms, "gpu_frac_of_copy": frac * ms / gpu_ms, **extra}


def measures(checks):
    return sorted((c.target.measure, c.target.bound) for c in checks)


def test_targets_follow_the_shape():
    """LayerNorm's backward: bandwidth and 2x eager from 4096 columns, only 'not slower
    than eager' at 1024, only bandwidth at 2^17."""
    def for_width(n):
        return measures(targets.check(result("layernorm", "bwd", "course_lib", (64, n), 1.0, 1.0)))

    assert for_width(1024) == sorted([(targets.EAGER, 1.0), (targets.COMPILE, 1.1)])
    assert for_width(4096) == sorted([(targets.FRACTION, 0.75), (targets.EAGER, 2.0), (targets.COMPILE, 1.1)])
    assert for_width(2**17) == [(targets.FRACTION, 0.6)]


def test_a_check_uses_both_times():
    """Speedups from the benchmark's times and, separately, from the GPU's own times."""
    ours = result("weighted_sum", "bwd", "course_lib", (8, 8), ms=1.0, gpu_ms=0.5, frac=0.7)
    eager = result("weighted_sum", "bwd", "torch", (8, 8), ms=1.2, gpu_ms=1.2)
    checks = {c.target.measure: c for c in targets.check(ours, eager)}
    assert checks[targets.EAGER].value == pytest.approx(1.2) and not checks[targets.EAGER].met
    assert checks[targets.EAGER].gpu_value == pytest.approx(2.4) and checks[targets.EAGER].met_on_gpu
    assert checks[targets.FRACTION].value == pytest.approx(0.7) and not checks[targets.FRACTION].met
    assert checks[targets.FRACTION].gpu_value == pytest.approx(1.4) and checks[targets.FRACTION].met_on_gpu


def test_missing_comparison_is_a_miss():
    checks = targets.check(result("weighted_sum", "fwd", "course_lib", (8, 8), 1.0, 1.0))
    eager = next(c for c in checks if c.target.measure == targets.EAGER)
    assert eager.value is None and not eager.met and not eager.met_on_gpu


def test_memory_is_an_upper_bound():
    """Peak extra memory over the input's bytes: at most 3x (float32 input of 1 MiB)."""
    def memory_check(peak_bytes):
        row = result("coor_descent", "fwd", "course_lib", (256, 1024), 1.0, 1.0, peak_extra_bytes=peak_bytes)
        return next(c for c in targets.check(row) if c.target.measure == targets.MEMORY)

    assert memory_check(2 * 2**20).value == pytest.approx(2.0) and memory_check(2 * 2**20).met
    assert not memory_check(4 * 2**20).met


def test_every_stored_row_of_course_lib_is_checked():
    for name, document in benchmarking.load_results().items():
        for row in document["rows"]:
            if row["impl"] == "course_lib":
                assert targets.check(row), (name, row["kernel"], row["pass"], row["shape"])


def test_page_lists_each_miss_and_counts_it(tmp_path):
    rows = [
        result("weighted_sum", "fwd", "course_lib", (16, 32), ms=2.0, gpu_ms=1.0, frac=0.5, copy_same_bytes_frac=0.62),
        result("weighted_sum", "fwd", "torch", (16, 32), ms=3.0, gpu_ms=3.0),
        result("weighted_sum", "fwd", "torch.compile", (16, 32), ms=3.0, gpu_ms=3.0),
    ]
    (tmp_path / "gpu.json").write_text(json.dumps(
        {"gpu": "Test GPU", "torch": "2", "triton": "3", "copy_gbps": 1000.0, "rows": rows}))
    page = benchmarks_page.render(tmp_path)
    assert page == benchmarks_page.render(tmp_path)  # the same results, the same page
    # fraction of C: 0.5 on the benchmark's time, 1.0 on the GPU's; the speedups are met
    assert "Targets: 2 of 3 checks met on the benchmark's time. 1 more are met on the GPU's own time" in page
    assert "- weighted\\_sum fwd float32 16×32: ≥ 0.85 fraction of C, 0.5 [1]" in page
    table_row = next(line for line in page.splitlines() if line.startswith("| fwd | float32 | 16×32 |"))
    assert table_row.endswith("| ≥ 0.85 fraction of C: 0.5 [1] |")
    assert "| 2.000 | 0.50 | 1.000 | 1.00 | 0.62 | 3.000 |" in table_row  # the copy of as many bytes
    assert "| weighted\\_sum | fwd | every shape | ≥ 0.85 fraction of C; ≥ 1 × torch; ≥ 1 × torch.compile |" in page


def test_step_rows_get_their_own_table_and_the_cuda_graph_target(tmp_path):
    """A step is checked against torch eager and, in CUDA graphs, against torch.compile's
    graphs; its table lists all five implementations."""
    times = {"course_lib": 2.0, "torch": 3.0, "torch.compile": 2.5, "course_lib.cudagraphs": 1.0,
             "torch.compile.cudagraphs": 0.8}
    rows = [result("layernorm", "step", impl, (16, 32), ms=ms, gpu_ms=ms) for impl, ms in times.items()]
    ours, eager, compiled, graphs, compiled_graphs = rows
    checks = {c.target.measure: c for c in targets.check(ours, eager, compiled, graphs, compiled_graphs)}
    assert checks[targets.EAGER].value == pytest.approx(1.5) and checks[targets.EAGER].met
    assert checks[targets.GRAPHS].value == pytest.approx(0.8) and not checks[targets.GRAPHS].met
    (tmp_path / "gpu.json").write_text(json.dumps(
        {"gpu": "Test GPU", "torch": "2", "triton": "3", "copy_gbps": 1000.0, "rows": rows}))
    page = benchmarks_page.render(tmp_path)
    table_row = next(line for line in page.splitlines() if line.startswith("| float32 | 16×32 |"))
    assert "| 2.000 | 3.000 | 2.500 | 1.000 | 0.8000 | 2.000 | 1.50× | 1.25× | 0.80× |" in table_row
    assert table_row.endswith("≥ 1 × torch.compile, both in CUDA graphs: 0.8 [0.8] |")
    assert "| step |" not in page.split("## Test GPU")[1].split("Training steps")[0]  # not in the kernels' table


@pytest.mark.parametrize("ours_ms, met", [(0.29, True), (0.31, False)], ids=["within", "beyond"])
def test_host_rows_are_checked_against_torch_eager_and_get_their_own_table(tmp_path, ours_ms, met):
    """A host row's time is the host's (benchmarks/host.py): at most 1.5 times torch eager's
    and 1.15 times the floor's, on whichever time the check reads, listed in a table of their
    own with the GPU times."""
    rows = [result("layernorm", "host", "course_lib", (16, 32), ms=ours_ms, gpu_ms=0.05),
            result("layernorm", "host", "torch", (16, 32), ms=0.2, gpu_ms=0.1),
            result("layernorm", "host", "floor", (16, 32), ms=0.26, gpu_ms=0.05)]  # benchmarks/floor.py
    host_check, floor_check = targets.check(rows[0], rows[1], floor=rows[2])
    assert (host_check.target.measure, floor_check.target.measure) == (targets.HOST, targets.FLOOR)
    assert host_check.value == host_check.gpu_value == pytest.approx(ours_ms / 0.2)
    assert floor_check.value == floor_check.gpu_value == pytest.approx(ours_ms / 0.26)
    assert host_check.met is met and host_check.met_on_gpu is met
    assert floor_check.met is met and floor_check.met_on_gpu is met
    (tmp_path / "gpu.json").write_text(json.dumps(
        {"gpu": "Test GPU", "torch": "2", "triton": "3", "copy_gbps": 1000.0, "rows": rows}))
    page = benchmarks_page.render(tmp_path)
    host_section = page.split("Host time of `layernorm`")[1]
    table_row = next(line for line in host_section.splitlines() if line.startswith("| float32 | 16×32 |"))
    assert f"| {ours_ms * 1e3:.1f}" in table_row or f"{ours_ms:.3f}" in table_row
    # the floor's time, then course_lib's ÷ torch's and ÷ the floor's
    assert f"| 0.2600 | {ours_ms / 0.2:.3g} | {ours_ms / 0.26:.3g} |" in table_row
    assert table_row.endswith("| ✓ |") is met
    assert "| host |" not in page.split("## Test GPU")[1].split("Host time")[0]  # not in the kernels' table


def test_routed_block_is_checked_against_colt5_and_the_compiled_reference():
    """Time against colt5_attention (≥ 1.5×), and compiled against the reference compiled
    (≥ 1.2×); peak memory no more than colt5_attention's or torch.compile's."""
    def step(impl, ms, peak):
        return result("routed_block", "step", impl, (8, 4096, 1024), ms=ms, gpu_ms=ms, dtype="bfloat16",
                      peak_bytes=peak)

    ours = step("course_lib", 2.0, 100)
    compiled, peer = step("torch.compile", 2.6, 120), step("colt5_attention", 2.8, 90)
    ours_compiled = step("course_lib.compile", 2.0, 110)
    checks = {c.target.measure: c for c in targets.check(ours, step("torch", 5.0, 200), compiled, peer=peer,
                                                          ours_compiled=ours_compiled)}
    assert checks[targets.BOTH_COMPILED].value == pytest.approx(1.3) and checks[targets.BOTH_COMPILED].met
    assert targets.COMPILE not in checks  # eager against compiled is not what the target asks
    assert checks[targets.PEER].value == pytest.approx(1.4) and not checks[targets.PEER].met
    assert checks[targets.PEAK_VS_COMPILE].value == pytest.approx(100 / 120) and checks[targets.PEAK_VS_COMPILE].met
    assert checks[targets.PEAK_VS_PEER].value == pytest.approx(100 / 90) and not checks[targets.PEAK_VS_PEER].met
    without_peer = {c.target.measure: c for c in targets.check(ours, compiled=compiled)}
    assert without_peer[targets.PEER].value is None and not without_peer[targets.PEER].met
    assert without_peer[targets.BOTH_COMPILED].value is None and not without_peer[targets.BOTH_COMPILED].met


@pytest.mark.parametrize("shape, bound", [((8, 4096, 1024), 1.5), ((8, 2048, 512), 2.5)])
@pytest.mark.parametrize("over", [0.9, 1.1], ids=["within", "beyond"])
def test_routed_block_eager_step_is_checked_against_its_own_gpu_time(shape, bound, over):
    """The eager block's step at most 1.5x (4096 tokens) or 2.5x (2048) its GPU time: a
    miss there is the host's, so it is met on the GPU's own time."""
    gpu_ms = 3.0
    ours = result("routed_block", "step", "course_lib", shape, ms=gpu_ms * bound * over, gpu_ms=gpu_ms,
                  dtype="bfloat16")
    (check,) = [c for c in targets.check(ours) if c.target.measure == targets.OWN_GPU]
    assert check.target.bound == bound
    assert check.value == pytest.approx(bound * over) and check.met is (over < 1)
    assert check.gpu_value == pytest.approx(1.0) and check.met_on_gpu


def test_merge_keeps_each_runs_copy_bandwidth(tmp_path):
    from benchmarks.__main__ import merge

    def document(copy_gbps, kernel, gpu="NVIDIA H200"):
        return {"gpu": gpu, "torch": "2.11", "triton": "3.6.0", "copy_gbps": copy_gbps,
                "rows": [result(kernel, "fwd", "course_lib", (4, 8), ms=1.0, gpu_ms=1.0)]}

    paths = []
    for name, doc in [("a", document(4000.0, "softmax")), ("b", document(4200.0, "layernorm")),
                      ("c", document(4100.0, "coor_descent"))]:
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(doc))
    merged = json.loads(merge(paths, tmp_path / "merged.json").read_text())
    assert [(r["kernel"], r["copy_gbps"]) for r in merged["rows"]] == [
        ("softmax", 4000.0), ("layernorm", 4200.0), ("coor_descent", 4100.0)]
    assert merged["copy_gbps"] == 4100.0 and merged["gpu"] == "NVIDIA H200"

    # A later run of a kernel replaces its rows, keeping the order and the other rows.
    (tmp_path / "d.json").write_text(json.dumps(document(4300.0, "layernorm")))
    merged = json.loads(merge([tmp_path / "merged.json", tmp_path / "d.json"], tmp_path / "again.json").read_text())
    assert [(r["kernel"], r["copy_gbps"]) for r in merged["rows"]] == [
        ("softmax", 4000.0), ("layernorm", 4300.0), ("coor_descent", 4100.0)]

    paths[1].write_text(json.dumps(document(4200.0, "layernorm", gpu="NVIDIA H100")))
    with pytest.raises(SystemExit, match="one GPU"):
        merge(paths, tmp_path / "merged.json")
