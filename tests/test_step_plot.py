"""The book's plot of training-step times (scripts/step_plot.py)."""

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))  # step_plot imports benchmarks_page from beside it
_spec = importlib.util.spec_from_file_location("step_plot", ROOT / "scripts" / "step_plot.py")
step_plot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(step_plot)


def step(kernel, impl, shape, ms, pass_="step", dtype="bfloat16"):
    return {"kernel": kernel, "pass": pass_, "impl": impl, "dtype": dtype, "shape": list(shape), "ms": ms}


def document(gpu, rows):
    return {"gpu": gpu, "torch": "2.11", "triton": "3.6", "copy_gbps": 1000.0, "rows": rows}


def test_each_marker_is_a_recorded_step_time():
    """One panel a (GPU, kernel) with step rows; each implementation's markers sit at its
    rows' times, case by case; forward rows, and implementations the tables leave out,
    are not drawn."""
    h100 = document("H100", [
        step("layernorm", "course_lib", (8, 1024), 0.25),
        step("layernorm", "torch", (8, 1024), 0.5),
        step("layernorm", "course_lib", (8, 4096), 0.75),
        step("layernorm", "course_lib", (8, 1024), 9.0, pass_="fwd"),
        step("routed_block", "course_lib", (8, 64, 32), 3.0),
        step("routed_block", "colt5_attention", (8, 64, 32), 7.0),
    ])
    h200 = document("H200", [step("softmax", "torch.compile.cudagraphs", (4, 512), 0.125)])
    fig = step_plot.draw([h100, document("no steps", [step("softmax", "torch", (4, 512), 1.0, pass_="bwd")]), h200])
    drawn = {ax.get_title(): {line.get_label(): [float(y) for y in line.get_ydata()] for line in ax.get_lines()}
             for ax in fig.axes if ax.get_title()}
    assert drawn == {
        "layernorm (H100)": {"course_lib": [0.25, 0.75], "torch": [0.5]},
        "routed_block (H100)": {"course_lib": [3.0]},
        "softmax (H200)": {"torch.compile.cudagraphs": [0.125]},
    }


def test_the_same_results_write_the_same_file(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "gpu.json").write_text(json.dumps(document("H100", [step("layernorm", "course_lib", (8, 1024), 0.25)])))
    first, second = tmp_path / "a.svg", tmp_path / "b.svg"
    step_plot.main(["--results", str(results), "--out", str(first)])
    step_plot.main(["--results", str(results), "--out", str(second)])
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes().startswith(b"<?xml") and b"<svg" in first.read_bytes()


def test_without_step_results_the_figure_says_so():
    fig = step_plot.draw([document("H100", [step("layernorm", "course_lib", (8, 1024), 0.25, pass_="fwd")])])
    assert any("No training-step results" in text.get_text() for text in fig.axes[0].texts)
