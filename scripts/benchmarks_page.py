"""Write the book's benchmark tables from the recorded results.

Reads every ``course_lib/results/*.json`` (one file a GPU, written by ``make benchmarks``)
and writes ``book/_generated/benchmarks.md``, which ``book/benchmarks.md`` includes.

    python scripts/benchmarks_page.py [--results DIR] [--out FILE]

Each row is checked against the course's targets (``benchmarks/targets.py``), on the
benchmark's time and on the GPU's own time. Standard library only. The output depends
only on the contents of the results files (files in name order, rows in the order they
were recorded, forward before backward), so running it twice gives the same page.
"""

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.targets import MEMORY, TARGETS, check  # noqa: E402  (needs ROOT on the path)

# course_lib.benchmarking.RESULTS_DIR, where the package ships them (this script imports no torch).
DEFAULT_RESULTS = ROOT / "course_lib" / "results"
DEFAULT_OUT = ROOT / "book" / "_generated" / "benchmarks.md"

NO_RESULTS = "No benchmark results have been recorded yet; run `make benchmarks` on a GPU."
PASS_ORDER = {"fwd": 0, "bwd": 1, "step": 2}
STEP_IMPLS = ["course_lib", "torch", "torch.compile", "course_lib.cudagraphs", "torch.compile.cudagraphs"]
STEP_HEADER = [
    "dtype",
    "shape",
    *(f"{impl} ms" for impl in STEP_IMPLS),
    "course_lib GPU alone ms",
    "speedup vs torch",
    "speedup vs torch.compile",
    "in CUDA graphs: speedup vs torch.compile",
]
HEADER = [
    "pass",
    "dtype",
    "shape",
    "course_lib ms",
    "fraction of C",
    "GPU alone ms",
    "GPU alone fraction of C",
    "a copy of as many bytes, fraction of C",
    "torch ms",
    "torch.compile ms",
    "speedup vs torch",
    "speedup vs torch.compile",
]
MEMORY_HEADER = "peak extra ÷ input"
TARGETS_HEADER = "targets missed: value [GPU alone]"
MISSING = "–"


def fmt_ms(ms):
    """Milliseconds to 4 significant digits, without an exponent."""
    if ms is None:
        return MISSING
    ms = float(ms)
    if ms == 0 or not math.isfinite(ms):
        return f"{ms:g}"
    decimals = max(0, 3 - math.floor(math.log10(abs(ms))))
    return f"{ms:.{decimals}f}"


def fmt_fraction(value):
    return MISSING if value is None else f"{float(value):.2f}"


def fmt_speedup(baseline_ms, ours_ms):
    if baseline_ms is None or ours_ms is None or float(ours_ms) <= 0:
        return MISSING
    return f"{float(baseline_ms) / float(ours_ms):.2f}×"


def fmt_shape(shape):
    return "×".join(str(int(n)) for n in shape)


def escape(text):
    """Keep free text (a GPU's name, a version) from being read as Markdown or a table."""
    text = str(text)
    for char in "\\`*_[]<>|#":
        text = text.replace(char, "\\" + char)
    return text


def fmt_value(value):
    """A checked value to 3 significant digits: 0.746 stays below a bound of 0.75."""
    return MISSING if value is None else f"{float(value):.3g}"


def fmt_misses(checks):
    """'✓' when every check is met, else each miss with its value and its GPU-alone value."""
    misses = [c for c in checks if not c.met]
    if not checks:
        return MISSING
    if not misses:
        return "✓"
    return "; ".join(
        f"{escape(c.target.describe())}: {fmt_value(c.value)} [{fmt_value(c.gpu_value)}]" for c in misses
    )


def _cases(rows):
    """{(pass, dtype, shape): {impl: row}}, forward first, each in the order first recorded."""
    cases = {}
    for row in rows:
        key = (row["pass"], row["dtype"], tuple(row["shape"]))
        cases.setdefault(key, {})[row["impl"]] = row
    order = sorted(
        enumerate(cases), key=lambda item: (PASS_ORDER.get(item[1][0], len(PASS_ORDER)), item[0])
    )
    return [(key, cases[key]) for _, key in order]


def _checks(impls):
    ours = impls.get("course_lib")
    others = ("torch", "torch.compile", "course_lib.cudagraphs", "torch.compile.cudagraphs")
    return check(ours, *(impls.get(name) for name in others), peer=impls.get("colt5_attention"),
                 ours_compiled=impls.get("course_lib.compile"), floor=impls.get("floor")) if ours else []


def step_table(rows):
    """The training steps of one kernel: a line per (dtype, shape), every implementation's
    time, course_lib's speed-ups eager and, inside CUDA graphs, over torch.compile's."""
    header = STEP_HEADER + [TARGETS_HEADER]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join([":--"] * 2 + ["--:"] * (len(header) - 3) + [":--"]) + "|",
    ]
    for key, impls in _cases(rows):
        times = {impl: impls[impl]["ms"] if impl in impls else None for impl in STEP_IMPLS}
        ours = impls.get("course_lib")
        cells = [
            escape(key[1]),
            fmt_shape(key[2]),
            *(fmt_ms(times[impl]) for impl in STEP_IMPLS),
            fmt_ms(ours.get("gpu_ms") if ours else None),
            fmt_speedup(times["torch"], times["course_lib"]),
            fmt_speedup(times["torch.compile"], times["course_lib"]),
            fmt_speedup(times["torch.compile.cudagraphs"], times["course_lib.cudagraphs"]),
            fmt_misses(_checks(impls)),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


TABLES_OF_THEIR_OWN = ("step", "host")  # passes listed in step_table and host_table, not kernel_table


def kernel_table(rows):
    """One Markdown table for one kernel: a line per (pass, dtype, shape) of the
    kernels' own passes (the steps have step_table)."""
    cases = _cases([row for row in rows if row["pass"] not in TABLES_OF_THEIR_OWN])
    with_memory = any("peak_extra_bytes" in row for row in rows)
    header = HEADER + ([MEMORY_HEADER] if with_memory else []) + [TARGETS_HEADER]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join([":--"] * 3 + ["--:"] * (len(header) - 4) + [":--"]) + "|",
    ]
    for key, impls in cases:
        ours, torch_eager, compiled = (impls.get(name) for name in ("course_lib", "torch", "torch.compile"))
        ours_ms = ours["ms"] if ours else None
        torch_ms = torch_eager["ms"] if torch_eager else None
        compiled_ms = compiled["ms"] if compiled else None
        checks = _checks(impls)
        cells = [
            escape(key[0]),
            escape(key[1]),
            fmt_shape(key[2]),
            fmt_ms(ours_ms),
            fmt_fraction(ours.get("frac_of_copy") if ours else None),
            fmt_ms(ours.get("gpu_ms") if ours else None),
            fmt_fraction(ours.get("gpu_frac_of_copy") if ours else None),
            fmt_fraction(next((r["copy_same_bytes_frac"] for r in impls.values() if "copy_same_bytes_frac" in r), None)),
            fmt_ms(torch_ms),
            fmt_ms(compiled_ms),
            fmt_speedup(torch_ms, ours_ms),
            fmt_speedup(compiled_ms, ours_ms),
        ]
        if with_memory:
            memory = next((c.value for c in checks if c.target.measure == MEMORY), None)
            cells.append(fmt_value(memory))
        cells.append(fmt_misses(checks))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def host_table(rows):
    """The host's time for the eager training step: a line per (dtype, shape), course_lib's
    and torch's with the GPU's own time of each step beside it, the floor's (the same kernels
    in a bare autograd.Function, benchmarks/floor.py), and course_lib's against both."""
    lines = ["| dtype | shape | course_lib host | its GPU time | torch host | its GPU time | floor host | "
             "course_lib ÷ torch | course_lib ÷ floor | targets |", "|:--|:--|--:|--:|--:|--:|--:|--:|--:|:--|"]
    for key, impls in _cases(rows):
        ours, theirs, floor = impls.get("course_lib"), impls.get("torch"), impls.get("floor")
        lines.append("| " + " | ".join([
            escape(key[1]), fmt_shape(key[2]),
            *(fmt_ms(row.get(field) if row else None) for row in (ours, theirs) for field in ("ms", "gpu_ms")),
            fmt_ms(floor["ms"] if floor else None),
            *(fmt_value(ours["ms"] / other["ms"] if ours and other else None) for other in (theirs, floor)),
            fmt_misses(_checks(impls)),
        ]) + " |")
    return lines


def summary(kernels):
    """How many checks the rows of ``kernels`` ({kernel: rows}) meet, and every miss,
    split by whether the GPU alone meets it."""
    checks = []
    for kernel, kernel_rows in kernels.items():
        for key, impls in _cases(kernel_rows):
            checks += [(kernel, key, c) for c in _checks(impls)]
    if not checks:
        return []
    host = [item for item in checks if not item[2].met and item[2].met_on_gpu]
    kernel_misses = [item for item in checks if not item[2].met and not item[2].met_on_gpu]
    met = len(checks) - len(host) - len(kernel_misses)
    lines = [
        f"Targets: {met} of {len(checks)} checks met on the benchmark's time. "
        f"{len(host)} more are met on the GPU's own time (the host set the pace there); "
        f"{len(kernel_misses)} are missed on both.",
    ]
    for title, items in (("Missed on both times", kernel_misses), ("Met on the GPU's own time only", host)):
        if items:
            lines += ["", f"{title}:", ""]
            lines += [
                f"- {escape(kernel)} {escape(key[0])} {escape(key[1])} {fmt_shape(key[2])}: "
                f"{escape(c.target.describe())}, {fmt_value(c.value)} [{fmt_value(c.gpu_value)}]"
                for kernel, key, c in items
            ]
    return lines


def targets_table():
    """The targets, a line per kernel, pass and set of shapes."""
    grouped = {}
    for target in TARGETS:
        grouped.setdefault((target.kernel, target.pass_, target.where), []).append(target.describe())
    lines = ["| kernel | pass | shapes | targets |", "|:--|:--|:--|:--|"]
    for (kernel, pass_, where), bounds in grouped.items():
        lines.append(f"| {escape(kernel)} | {escape(pass_)} | {escape(where)} | {escape('; '.join(bounds))} |")
    return lines


def results_section(path, data):
    lines = [
        f"## {escape(data['gpu'])}",
        "",
        f"torch {escape(data['torch'])}, triton {escape(data['triton'])}; "
        f"copy bandwidth C = {float(data['copy_gbps']):,.0f} GB/s "
        f"(from `{DEFAULT_RESULTS.relative_to(ROOT).as_posix()}/{path.name}`); "
        f"code of commit {escape(data.get('commit', 'unknown'))}, measured {escape(data.get('date', 'on an unknown day'))}.",
    ]
    if data.get("superseded_by"):
        lines += ["", f"Superseded by the `{escape(data['superseded_by'])}` results, which the chapters quote: "
                      f"{escape(data.get('note', 'kept for comparison'))}."]
    kernels = {}
    for row in data.get("rows", []):
        kernels.setdefault(row["kernel"], []).append(row)
    targets = summary(kernels)
    if targets:
        lines += [""] + targets
    if not kernels:
        lines += ["", "This file holds no measurements."]
    for kernel, rows in kernels.items():
        lines += ["", f"### `{kernel}`"]
        if any(row["pass"] not in TABLES_OF_THEIR_OWN for row in rows):  # a step-only kernel has no empty table
            lines += [""] + kernel_table(rows)
        steps = [row for row in rows if row["pass"] == "step"]
        if steps:
            lines += ["", f"Training steps of `{kernel}` (forward and backward as a user's loop calls them):", ""]
            lines += step_table(steps)
        hosts = [row for row in rows if row["pass"] == "host"]
        if hosts:
            lines += ["", f"Host time of `{kernel}`'s eager training step, the GPU kept busy "
                          "(`benchmarks/host.py`):", ""]
            lines += host_table(hosts)
    return lines


def render(results_dir):
    lines = [
        f"% Generated by scripts/benchmarks_page.py from {DEFAULT_RESULTS.relative_to(ROOT).as_posix()}/*.json; do not edit.",
        "",
        "## Targets",
        "",
        *targets_table(),
        "",
    ]
    paths = sorted(Path(results_dir).glob("*.json"))
    if not paths:
        lines.append(NO_RESULTS)
    for index, path in enumerate(paths):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            section = results_section(path, data)
        except (ValueError, KeyError, TypeError) as error:
            raise SystemExit(f"{path}: not a benchmark results file ({type(error).__name__}: {error})")
        if index:
            lines.append("")
        lines += section
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS,
                        help=f"folder of results JSON files (default: {DEFAULT_RESULTS.relative_to(ROOT)})")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"Markdown file to write (default: {DEFAULT_OUT.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    text = render(args.results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
