"""Train chapter 7's models and store their curves: course_lib/results/training/<gpu>.json.

    python -m benchmarks.train_recall                              # every run of CHAPTER_RUNS
    python -m benchmarks.train_recall --only "dense, seed 0; dense, seed 1" --out part.json
    python -m benchmarks.train_recall --seed 2 --out seed2.json    # every model at one seed
    python -m benchmarks.train_recall --merge part1.json part2.json

Each run is recall_task.train_recall at CHAPTER_SETTINGS on CHAPTER_TASK; runs at the same
seed see the same data. The models are small, so one GPU trains several processes at once
faster than one after another (each process a seed, ``--seed``), and ``--merge`` joins
their files. Runs of a later file replace runs of the same name.
"""

import argparse
import json
import time
from pathlib import Path

from course_lib.core.benchmarking import gpu_slug, measured_on, require_gpu, write_document
from course_lib.models.recall_task import (CHAPTER_MODELS, CHAPTER_RUNS, CHAPTER_SEEDS, CHAPTER_SETTINGS, CHAPTER_TASK,
                                           TRAINING_RESULTS_DIR, light_branch_reach, train_recall)
from course_lib.core.runtime import DEVICE


def train_runs(names, task=CHAPTER_TASK, settings=CHAPTER_SETTINGS, device=DEVICE):
    """The document of the runs ``names`` (keys of CHAPTER_RUNS), trained one after another."""
    runs = {}
    for name in names:
        arguments = CHAPTER_RUNS[name]
        started = time.perf_counter()
        run = train_recall(task=task, device=device, **arguments, **settings)  # ends waiting for the GPU
        runs[name] = {"arguments": arguments, "losses": run.losses, "accuracy": run.accuracy,
                      "seconds": time.perf_counter() - started}
        print(f"{name:>26}: loss {run.losses[0]:.3f} -> {run.losses[-1]:.3f}, accuracy {run.accuracy:.3f}, "
              f"{runs[name]['seconds']:.0f} s", flush=True)
    return {
        **measured_on(),
        "task": task._asdict(), "settings": settings,
        "light_branch_reach": light_branch_reach(task, settings["light_window_size"]),
        "runs": runs,
    }


def merge(paths):
    """One document from several of one GPU, task and settings; runs in CHAPTER_RUNS order."""
    documents = [json.loads(Path(path).read_text()) for path in paths]
    setups = {json.dumps([d["gpu"], d["torch"], d["triton"], d["task"], d["settings"]]) for d in documents}
    if len(setups) != 1:
        raise SystemExit(f"--merge needs runs of one GPU, torch, triton, task and settings; got {sorted(setups)}")
    runs = {name: run for document in documents for name, run in document["runs"].items()}
    order = list(CHAPTER_RUNS) + sorted(set(runs) - set(CHAPTER_RUNS))
    return dict(documents[0], runs={name: runs[name] for name in order if name in runs})


def write(document, out=None):
    return write_document(document, out or TRAINING_RESULTS_DIR / f"{gpu_slug(document['gpu'])}.json")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help=f"runs separated by ';', of: {'; '.join(CHAPTER_RUNS)}")
    parser.add_argument("--out", help=f"the file to write (default {TRAINING_RESULTS_DIR}/<gpu>.json)")
    parser.add_argument("--seed", type=int, choices=CHAPTER_SEEDS, help="every model's run at this seed")
    parser.add_argument("--merge", nargs="+", metavar="RUNS", help="merge these files instead of training")
    arguments = parser.parse_args(argv)
    if arguments.merge:
        print("wrote", write(merge(arguments.merge), arguments.out))
        return
    if arguments.seed is not None:
        names = [f"{model}, seed {arguments.seed}" for model in CHAPTER_MODELS]
    elif arguments.only:
        names = [name.strip() for name in arguments.only.split(";")]
    else:
        names = list(CHAPTER_RUNS)
    unknown = [name for name in names if name not in CHAPTER_RUNS]
    if unknown:
        raise SystemExit(f"unknown runs {unknown}; choose from {list(CHAPTER_RUNS)}")
    require_gpu("chapter 7's training runs")
    print("wrote", write(train_runs(names), arguments.out))


if __name__ == "__main__":
    main()
