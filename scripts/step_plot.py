"""Draw the book's plot of training-step times from the recorded results.

Reads every ``course_lib/results/*.json`` and writes ``book/_generated/step_times.svg``,
which ``book/benchmarks.md`` shows under the tables: for each GPU, a panel a kernel, and
in it, for each (dtype, shape), a marker at the step time of every implementation that
``scripts/benchmarks_page.py`` tabulates. Times span microseconds to milliseconds, so the
axis is logarithmic (and markers, not bars, whose length would mean nothing there).

    python scripts/step_plot.py [--results DIR] [--out FILE]

The same results give the same file (no date in it, fixed element ids).
"""

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on the machines that build the book
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib.lines import Line2D  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from benchmarks_page import DEFAULT_RESULTS, STEP_IMPLS  # noqa: E402  (needs the scripts folder on the path)

DEFAULT_OUT = ROOT / "book" / "_generated" / "step_times.svg"
plt.rcParams["axes.formatter.min_exponent"] = 3  # log axes label 0.3 ms, not 3×10⁻¹


def step_cases(rows):
    """{kernel: {(dtype, shape): {impl: ms}}} of the step rows, in the order recorded."""
    kernels = {}
    for row in rows:
        if row["pass"] == "step" and row["impl"] in STEP_IMPLS:
            case = (row["dtype"], tuple(row["shape"]))
            kernels.setdefault(row["kernel"], {}).setdefault(case, {})[row["impl"]] = row["ms"]
    return kernels


def draw(documents):
    """A figure of the step times of ``documents`` ([results file contents]); one row of
    panels a GPU with step rows, or a figure that says there are none."""
    gpus = [(document["gpu"], step_cases(document["rows"])) for document in documents]
    gpus = [(gpu, kernels) for gpu, kernels in gpus if kernels]
    if not gpus:
        fig, ax = plt.subplots(figsize=(6, 1))
        ax.axis("off")
        ax.text(0.5, 0.5, "No training-step results recorded yet: run make benchmarks on a GPU.", ha="center")
        return fig
    columns = max(len(kernels) for _, kernels in gpus)
    fig, axes = plt.subplots(len(gpus), columns, figsize=(3.2 * columns, 3.6 * len(gpus)), squeeze=False)
    offset = 0.5 / len(STEP_IMPLS)  # side by side within a case, so equal times stay visible
    markers = "oDs^v"
    for (gpu, kernels), panels in zip(gpus, axes):
        for ax, (kernel, cases) in zip(panels, kernels.items()):
            for i, impl in enumerate(STEP_IMPLS):
                positions = [j + (i - (len(STEP_IMPLS) - 1) / 2) * offset for j, times in enumerate(cases.values())
                             if impl in times]
                times = [times[impl] for times in cases.values() if impl in times]
                if times:
                    ax.plot(positions, times, markers[i], color=plt.cm.tab10.colors[i], label=impl)
            ax.set_yscale("log")
            ax.set_xlim(-0.5, len(cases) - 0.5)
            ax.set_xticks(range(len(cases)), [f"{dtype.split()[0]} {'×'.join(map(str, shape))}" for dtype, shape in cases],
                          fontsize=6, rotation=90)
            ax.set_title(f"{kernel} ({gpu})", fontsize=9)
            ax.grid(alpha=0.3, axis="y")
        panels[0].set_ylabel("step time (ms)")
        for ax in panels[len(kernels):]:
            ax.axis("off")
    handles = [Line2D([], [], ls="", marker=marker, color=color)
               for marker, color in zip(markers, plt.cm.tab10.colors)]
    fig.legend(handles, STEP_IMPLS, loc="upper right", fontsize=8)
    fig.tight_layout(rect=(0, 0, 0.88, 1))
    return fig


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS, help="folder of <gpu>.json files")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the SVG file to write")
    args = parser.parse_args(argv)
    documents = [json.loads(path.read_text(encoding="utf-8")) for path in sorted(args.results.glob("*.json"))]
    plt.rcParams["svg.hashsalt"] = "step_times"  # fixed element ids: the same results, the same file
    fig = draw(documents)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, metadata={"Date": None})
    plt.close(fig)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
