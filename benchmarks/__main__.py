"""Run the benchmarks on the GPU and write course_lib/results/<gpu>.json.

    python -m benchmarks                          # every kernel, writes the results file
    python -m benchmarks --only softmax,layernorm # some kernels; printed, written only with --out
    python -m benchmarks --merge a.json b.json    # results of several runs (--only ... --out) into one file
    python -m benchmarks --steps-only --out s.json # the training-step rows alone, at their shapes

A GPU host that allows a few minutes a command runs the kernels in parts and merges them;
each row keeps the copy bandwidth of its own run.
"""

import argparse
import importlib
import json
import statistics
from pathlib import Path

from course_lib.core.benchmarking import (RESULTS_DIR, add_copy_ceilings, copy_bandwidth_gbps, gpu_slug, require_gpu,
                                          write_document, write_results)
from course_lib.registry import BY_NAME, KERNELS

NAMES = [kernel.name for kernel in KERNELS]  # from course_lib.registry, each with benchmarks/bench_<name>.py


# Each course_lib row is compared with these, where the results have them.
COMPARED_WITH = {
    "course_lib": ("torch", "torch.compile"),
    "course_lib.cudagraphs": ("torch.compile.cudagraphs",),
}


def print_rows(rows):
    """Each course_lib row with its speed-ups over torch and torch.compile."""
    by_key = {(r["kernel"], r["pass"], r["dtype"], tuple(r["shape"]), r["impl"]): r for r in rows}
    for (kernel, pass_, dtype, shape, impl), r in by_key.items():
        if impl not in COMPARED_WITH:
            continue
        others = " ".join(
            f"| {other} {by_key[kernel, pass_, dtype, shape, other]['frac_of_copy']:.2f} C "
            f"x{by_key[kernel, pass_, dtype, shape, other]['ms'] / r['ms']:.2f}"
            for other in COMPARED_WITH[impl]
        )
        memory = f" | peak extra {r['peak_extra_bytes'] / 2**20:.0f} MiB" if "peak_extra_bytes" in r else ""
        memory += f" | peak {r['peak_bytes'] / 2**20:.0f} MiB" if "peak_bytes" in r else ""
        print(f"{kernel:>14} {pass_:>4} {impl:>21} {dtype:>8} {str(list(shape)):>18} {r['ms'] * 1e3:9.1f} us "
              f"(GPU alone {r['gpu_ms'] * 1e3:7.1f}) {r['frac_of_copy']:.2f} C "
              f"(a copy of as many bytes {r['copy_same_bytes_frac']:.2f} C) {others}{memory}", flush=True)


def row_key(row):
    return row["kernel"], row["pass"], row["impl"], row["dtype"], tuple(row["shape"])


def merge(paths, out=None):
    """One results file from the files of several runs on one GPU; each row records its
    run's copy bandwidth, and the file the median of them. A row of a later file
    replaces the row of an earlier one with the same kernel, pass, impl, dtype and shape."""
    documents = [json.loads(Path(path).read_text()) for path in paths]
    gpus = {(d["gpu"], d["torch"], d["triton"]) for d in documents}
    if len(gpus) != 1:
        raise SystemExit(f"--merge needs results of one GPU and one torch and triton, got {sorted(gpus)}")
    rows = {}
    for document in documents:
        for row in document["rows"]:
            rows[row_key(row)] = dict(row, copy_gbps=row.get("copy_gbps", document["copy_gbps"]),
                                      commit=row.get("commit", document.get("commit", "unknown")),
                                      date=row.get("date", document.get("date", "unknown")))
    rows = list(rows.values())
    # The file names every commit and the last day its rows were measured on: a file whose
    # rows come from one commit can be quoted as that commit's results.
    merged = dict(documents[0], copy_gbps=statistics.median(row["copy_gbps"] for row in rows),
                  commit=", ".join(sorted({row["commit"] for row in rows})),
                  date=max(row["date"] for row in rows), rows=rows)
    return write_document(merged, out or RESULTS_DIR / f"{gpu_slug(merged['gpu'])}.json")


def main():
    parser = argparse.ArgumentParser(description="Benchmark course_lib against torch and torch.compile.")
    parser.add_argument("--only", help=f"comma-separated subset of {','.join(NAMES)}")
    parser.add_argument("--out", help="results file (default: course_lib/results/<gpu>.json when all run)")
    parser.add_argument("--steps-only", action="store_true",
                        help="only the training-step rows (no forward or backward rows): a fraction of the time")
    parser.add_argument("--merge", nargs="+", metavar="RESULTS", help="merge these results files instead of running")
    arguments = parser.parse_args()
    if arguments.merge:
        print("wrote", merge(arguments.merge, arguments.out))
        return
    if arguments.steps_only and not arguments.out:
        raise SystemExit("--steps-only writes its rows only to --out, so that the results file keeps the others; "
                         "then --merge course_lib/results/<gpu>.json OUT")
    require_gpu("the benchmarks")
    names = arguments.only.split(",") if arguments.only else NAMES
    unknown = sorted(set(names) - set(NAMES))
    if unknown:
        raise SystemExit(f"--only: no kernel named {', '.join(unknown)} in course_lib.registry; known: {', '.join(NAMES)}")
    copy_gbps = copy_bandwidth_gbps()
    print(f"copy bandwidth C = {copy_gbps:.0f} GB/s")
    rows = []
    for name in names:
        module_rows = add_copy_ceilings(importlib.import_module(BY_NAME[name].benchmark).run(
            copy_gbps, steps_only=arguments.steps_only), copy_gbps)
        print_rows(module_rows)
        rows += module_rows
    if arguments.out or not arguments.only:
        print("wrote", write_results(rows, copy_gbps, arguments.out))


if __name__ == "__main__":
    main()
