"""Observations: what a chapter's cell measures on the reader's GPU, set beside the stored
run's figures and read in words chosen from the reader's own values. Never raised.

A chapter states two kinds of things. A claim about stored data (the results files, the
training runs, values computed in float64) is checked by ``notebook.claim`` and raises when
the data turn it over. What a cell times on the reader's GPU depends on that GPU and its
host (an A100, an L4, a fast or a slow host): such a cell calls ``observe(name, figures)``,
which prints the reader's figures, the stored run's (the run the book's outputs come from,
its GPU, commit and day named) and the reading of the reader's figures, chosen by a
function of them registered here with ``@reading``.

Figures are a dict ``{"<what>, <unit>": value}``; the unit after the last comma says how
the value prints and how it changes from GPU to GPU (``tests/teaching/test_observations.py``
replays every reading with an A100's, an L4's, an H100's figures and with hosts twice as fast
and twice as slow, and no reading may raise):

    "µs"         a time as the reader's loop sees it (do_bench): GPU or host, whichever is longer
    "GPU µs"     the GPU's own time (gpu_only_ms, the profiler's kernel times)
    "host µs"    the host's time of a call
    "of C"       a fraction of the copy bandwidth C measured in the same run
    "×"          a ratio
    "GB/s"       a bandwidth
    "TFLOP/s"    a compute-bound kernel's arithmetic rate (2·M·N·K a product over its time)
    "warps per SM", "SMs", "KiB", "registers", "count": the GPU's properties and counts

One module a chapter (``chapter1`` … ``chapter7``) holds its readings. The GPU run that makes
the book's outputs records every observation's figures (``COURSE_RECORD_OBSERVATIONS``, set by
``scripts/gpu_run.sh``) into ``course_lib/results/observations/<gpu>.json``: the stored run.
"""

import importlib
import json
import os
import textwrap
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "results" / "observations"
# The GPU whose run the book's stored outputs come from (course_lib.core.benchmarking's
# REFERENCE_RESULTS names the same run's benchmark file).
STORED_RUN = "nvidia-h200"
CHAPTERS = [f"chapter{n}" for n in range(1, 8)]
UNITS = ("µs", "GPU µs", "host µs", "of C", "×", "GB/s", "TFLOP/s", "warps per SM", "SMs", "KiB", "registers", "count")

READINGS = {}  # name -> Reading


class Reading:
    """A function of the reader's figures giving the sentence that reads them, with an
    example of its figures (the stored run's, for the tests to vary)."""

    def __init__(self, name, function, example):
        for key in example:
            unit_of(key)
        self.name, self.function, self.example = name, function, dict(example)

    def __call__(self, figures):
        missing = sorted(set(self.example) - set(figures))
        if missing:
            raise KeyError(f"observation {self.name!r} needs the figures {missing}")
        return self.function(figures)


def reading(name, example):
    """Register ``function(figures) -> sentence`` as the reading of observation ``name``."""
    def register(function):
        if name in READINGS:
            raise ValueError(f"two readings are named {name!r}")
        READINGS[name] = Reading(name, function, example)
        return function
    return register


def readings():
    """Every registered reading, the chapters' modules imported."""
    for chapter in CHAPTERS:
        importlib.import_module(f"{__name__}.{chapter}")
    return READINGS


def ratio(a, b, otherwise=float("inf")):
    """a / b for two measured figures; ``otherwise`` where b is not positive (a figure of
    zero: nothing was measured there), so that no reading divides by zero."""
    return a / b if b > 0 else otherwise


def unit_of(key):
    what, _, unit = key.rpartition(", ")
    if not what or unit not in UNITS:
        raise ValueError(f"figure {key!r}: name it '<what>, <unit>' with a unit of {', '.join(UNITS)}")
    return unit


def format_figure(key, value):
    what, _, unit = key.rpartition(", ")
    if isinstance(value, int) or unit in ("warps per SM", "SMs", "registers", "count"):
        number = f"{value:.0f}"
    elif unit in ("µs", "GPU µs", "host µs"):
        number = f"{value:.1f}"
    elif unit in ("GB/s", "TFLOP/s", "KiB"):
        number = f"{value:.0f}"
    else:
        number = f"{value:.2f}"
    return f"{what} {number}{'' if unit == '×' else ' '}{unit}"


def stored_run(results_dir=RESULTS, run=STORED_RUN):
    """The stored run's document: {"gpu", "commit", "date", "figures": {name: figures},
    "runs": {name: the gpu, commit and date of its figures}}, or None where none was recorded."""
    path = Path(results_dir) / f"{run}.json"
    return json.loads(path.read_text()) if path.exists() else None


def wrapped(text, indent="  "):
    from ..notebook import COLUMN  # the book's code column (notebook imports this module first)

    return textwrap.fill(text, COLUMN, subsequent_indent=indent, break_on_hyphens=False)


def report(name, figures, gpu, stored=None, recording=False):
    """The lines ``observe`` prints: never raises for figures the reading can be given."""
    lines = [wrapped(f"On your GPU ({gpu}): " + "; ".join(format_figure(k, v) for k, v in figures.items()) + ".")]
    if recording:
        lines.append(wrapped("This is the stored run: the book shows these figures, recorded for readers to "
                             "compare with theirs."))
    elif stored and name in stored.get("figures", {}):
        theirs, run = stored["figures"][name], stored.get("runs", {}).get(name, stored)
        lines.append(wrapped(f"On the stored run ({run['gpu']}, commit {run['commit']}, {run['date']}): "
                             + "; ".join(format_figure(k, v) for k, v in theirs.items()) + "."))
    else:
        lines.append("No stored run recorded this observation.")
    try:
        sentence = READINGS[name](figures) if name in READINGS else readings()[name](figures)
    except Exception as error:  # an observation never stops a chapter: say what went wrong instead
        sentence = f"(these figures could not be read in words: {type(error).__name__}: {error})"
    lines.append(wrapped("What yours show: " + sentence))
    return "\n".join(lines)


def record(name, figures, path):
    """Add ``figures`` under ``name`` to the stored-run file being written at ``path``."""
    from ...core.benchmarking import measured_on

    path = Path(path)
    document = json.loads(path.read_text()) if path.exists() else {"figures": {}}
    run = measured_on()
    document.update(run)  # the run that recorded the latest figures
    document["figures"][name] = {key: float(value) for key, value in figures.items()}
    document.setdefault("runs", {})[name] = run  # and each figure's own: chapters are re-run one at a time
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n")


def observe(name, figures):
    """Print what this GPU measured for observation ``name`` beside the stored run's figures,
    and the registered reading of this GPU's figures. Never raises on the figures' values."""
    from ...core.runtime import gpu_name

    readings()
    if name not in READINGS:
        raise KeyError(f"no reading named {name!r} in course_lib.teaching.observations")
    for key in figures:
        unit_of(key)
    target = os.environ.get("COURSE_RECORD_OBSERVATIONS")
    if target:
        record(name, figures, target)
    print(report(name, figures, gpu_name(), stored_run(), recording=bool(target)))
