import json

import pytest
import torch

from course_lib import benchmarking


def test_row_counts_bandwidth_and_fraction_of_copy():
    r = benchmarking.row("weighted_sum", "fwd", "course_lib", torch.bfloat16, (4, 8), ms=2.0, n_bytes=6e9, copy_gbps=4000.0)
    assert r["gbps"] == pytest.approx(3000.0)
    assert r["frac_of_copy"] == pytest.approx(0.75)
    assert r["dtype"] == "bfloat16" and r["shape"] == [4, 8]


def test_gpu_slug():
    assert benchmarking.gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert benchmarking.gpu_slug("NVIDIA A100-SXM4-80GB") == "nvidia-a100-sxm4-80gb"


def test_results_round_trip(tmp_path):
    rows = [benchmarking.row("weighted_sum", "bwd", "torch", torch.float32, (2, 3), 1.0, 1e6, 100.0)]
    path = benchmarking.write_results(rows, 100.0, tmp_path / "gpu.json")
    document = json.loads(path.read_text())
    assert set(document) == {"gpu", "torch", "triton", "copy_gbps", "rows"}
    assert benchmarking.load_results(tmp_path)["gpu"]["rows"] == rows


def test_stored_results_have_the_documented_shape():
    for name, document in benchmarking.load_results().items():
        assert document["copy_gbps"] > 0, name
        for r in document["rows"]:
            assert r["pass"] in ("fwd", "bwd") and r["impl"] in ("course_lib", "torch", "torch.compile")
            assert r["frac_of_copy"] == pytest.approx(r["gbps"] / document["copy_gbps"])
