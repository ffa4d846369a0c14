"""Every observation a chapter makes is replayed here with other GPUs' figures: an A100's, an
L4's (48 warps an SM, a tenth of an H200's bandwidth), an H100's, and hosts twice as fast and
twice as slow, each figure also varied at random. No reading may raise or come back empty, and
every chapter's ``observe`` calls name a registered reading that some chapter uses.

Seeds: ``OBSERVATION_SEED=n`` replays the random variations from another seed."""

import json
import os
import random
import re
from pathlib import Path

import pytest

from course_lib.teaching import observations
from course_lib.teaching.observations import format_figure, readings, report, stored_run, unit_of

ROOT = Path(__file__).resolve().parents[3]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SEED = int(os.environ.get("OBSERVATION_SEED", "20261129"))

# (name, copy bandwidth GB/s, warps an SM holds, SMs, host time's factor against the stored run's)
H200_GBPS = 4244
GPUS = [
    ("NVIDIA H200", 4244, 64, 132, 1.0),
    ("NVIDIA H100 80GB HBM3", 3000, 64, 132, 1.0),
    ("NVIDIA A100-SXM4-40GB", 1400, 64, 108, 1.0),
    ("NVIDIA L4", 250, 48, 58, 1.0),
    ("NVIDIA H200, a host twice as fast", 4244, 64, 132, 0.5),
    ("NVIDIA H200, a host twice as slow", 4244, 64, 132, 2.0),
]
DRAWS = 12


def figures_on(example, gpu, rng, vary):
    """The example figures as they could read on ``gpu``: GPU times scaled by its bandwidth,
    host times by its host, do_bench times by whichever is longer; each varied at random
    (a factor between 1/2 and 2) when ``vary``."""
    _, gbps, warps_per_sm, sms, host = gpu
    slower = H200_GBPS / gbps
    figures = {}
    for key, value in example.items():
        unit = unit_of(key)
        noise = 2 ** rng.uniform(-1, 1) if vary else 1.0
        if unit == "GPU µs":
            value = value * slower * noise
        elif unit == "host µs":
            value = value * host * noise
        elif unit == "µs":
            value = value * max(slower, host) * noise
        elif unit == "GB/s":
            value = gbps * noise
        elif unit == "TFLOP/s":  # a GPU's arithmetic, taken to scale as its bandwidth does
            value = value / slower * noise
        elif unit == "warps per SM":
            value = warps_per_sm
        elif unit == "SMs":
            value = sms
        elif unit in ("of C", "×", "KiB", "registers"):
            value = value * noise
        elif unit == "count":
            value = max(0, round(value * noise))
        figures[key] = value
    return figures


@pytest.mark.parametrize("name", sorted(readings()))
def test_every_reading_reads_every_gpus_figures_without_raising(name):
    rng = random.Random(f"{SEED}-{name}")
    reading = readings()[name]
    for gpu in GPUS:
        for draw in range(DRAWS + 1):
            figures = figures_on(reading.example, gpu, rng, vary=draw > 0)
            try:
                sentence = reading(figures)
            except Exception as error:
                pytest.fail(f"reading {name!r} raised on {gpu[0]} (OBSERVATION_SEED={SEED}, draw {draw}): "
                            f"{type(error).__name__}: {error}\nfigures: {figures}")
            assert isinstance(sentence, str) and sentence.strip(), (name, gpu[0], figures)
            text = report(name, figures, gpu[0], stored_run())
            assert "could not be read" not in text and all(len(line) <= 88 for line in text.splitlines()), text


def test_a_report_shows_both_runs_and_never_raises(tmp_path):
    name = sorted(readings())[0]
    example = readings()[name].example
    stored = {"gpu": "NVIDIA H200", "commit": "abc", "date": "2026-11-29", "figures": {name: example}}
    text = report(name, example, "NVIDIA L4", stored)
    assert "On your GPU (NVIDIA L4)" in text and "stored run (NVIDIA H200, commit abc, 2026-11-29)" in text
    # figures a reading cannot use are reported, not raised
    assert "could not be read" in report(name, {"x, µs": 1.0}, "NVIDIA L4", stored)
    recorded = tmp_path / "observations.json"
    observations.record(name, example, recorded)
    assert json.loads(recorded.read_text())["figures"][name] == pytest.approx(example)


def test_figures_are_named_with_a_unit_and_print_their_trailing_zeros():
    assert format_figure("1023 columns, µs", 41.0) == "1023 columns 41.0 µs"
    assert format_figure("forward, of C", 0.4) == "forward 0.40 of C"
    assert format_figure("replay over eager, ×", 2) == "replay over eager 2×"
    with pytest.raises(ValueError, match="unit"):
        unit_of("time in µs")


def observe_calls():
    """{notebook: [observation names]} of every observe(...) call in the chapters."""
    calls = {}
    for path in NOTEBOOKS:
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "code":
                calls.setdefault(path.name, []).extend(
                    re.findall(r"observe\(\s*f?[\"']([^\"']+)[\"']", "".join(cell["source"])))
    return calls


def test_every_observe_call_names_a_reading_and_every_reading_is_used():
    called = {name for names in observe_calls().values() for name in names}
    assert called, "no chapter calls observe"
    assert sorted(called - set(readings())) == []
    assert sorted(set(readings()) - called) == []


def test_the_stored_run_recorded_every_observation_the_chapters_make():
    stored = stored_run()
    if stored is None:
        pytest.skip("no stored run recorded yet (scripts/gpu_run.sh execute records it on a GPU)")
    missing = sorted(set(readings()) - set(stored["figures"]))
    assert not missing, f"the stored run {stored['gpu']} recorded no figures for {missing}"
    for name, figures in stored["figures"].items():
        assert set(figures) == set(readings()[name].example), name


def test_no_claim_checks_what_the_readers_gpu_measures():
    """A claim raises; what a cell times on the reader's GPU is observed instead. A cell
    that times (it is guarded by runtime.ON_GPU) or reads a timing cell's values makes no claim."""
    timed = re.compile(r"runtime\.ON_GPU|median_ms\(|gpu_only_ms\(|do_bench\(|elapsed_time\(|perf_counter\(")
    offenders = []
    for path in NOTEBOOKS:
        for index, cell in enumerate(json.loads(path.read_text())["cells"]):
            source = "".join(cell["source"])
            if cell["cell_type"] == "code" and "claim(" in source and timed.search(source):
                offenders.append(f"{path.name} cell {index}")
    assert not offenders


def test_each_stored_figure_names_the_run_it_comes_from():
    """Chapters are re-executed one at a time: each observation keeps its own GPU, commit and day."""
    from course_lib.teaching.observations import report, stored_run

    stored = stored_run()
    assert set(stored["runs"]) == set(stored["figures"])
    for name, run in stored["runs"].items():
        assert {"gpu", "commit", "date"} <= set(run) and run["gpu"] == stored["gpu"], name
        assert f"commit {run['commit']}" in report(name, stored["figures"][name], "another GPU", stored)
