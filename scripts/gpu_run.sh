#!/usr/bin/env bash
# On a GPU host, without network: the unit tests, the benchmarks, the notebooks
# re-executed in place (their stored outputs then come from this GPU), then nbval on them.
#   bash scripts/gpu_run.sh [WHEELS] [STEP...]   (WHEELS default .whl, made by scripts/gpu_wheels.sh)
# STEPs, in this order by default: unit benchmarks host training profile execute nbval. A
# host that limits the minutes of one command runs them a few at a time; "benchmarks" writes
# one results file per kernel under the logs folder and merges them into course_lib/results/
# (this GPU's file, whose other rows it keeps; $KERNELS narrows it to some kernels,
# $BENCH_ARGS passes arguments on, --steps-only for the training steps alone), "host" the
# host rows (benchmarks/host.py),
# "training" one file per part of chapter 7's runs, merged into course_lib/results/training/.
# Logs go to $GPU_RUN_LOGS (default gpu-run-logs/). $UNIT_TESTS narrows the unit step to
# some test paths (default: tests). "execute" runs each notebook on its own, so that one that
# fails does not keep the others from running; the step then fails at its end. $NOTEBOOKS
# narrows "execute" and "nbval" to some notebooks (default: notebooks/*.ipynb).
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=${1:-.whl}
shift || true
steps=${*:-unit benchmarks host training profile execute nbval}
logs=${GPU_RUN_LOGS:-gpu-run-logs}
mkdir -p "$logs"
site=$(mktemp -d)
python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$wheels"/*.whl
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# The commit measured, recorded in the results files: a copy of the tree without its
# history (an offline host) is told it by the caller.
export COURSE_COMMIT=${COURSE_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
python3 -c "from course_lib import runtime; print(runtime.describe()); assert runtime.ON_GPU, 'no GPU Triton can use'"

run_step() {
  echo "== $1"
  case $1 in
    # Several processes share the GPU (correctness only: the benchmarks time alone).
    unit) python3 -m pytest ${UNIT_TESTS:-tests} -q -p no:cacheprovider -m "not notebook_exec" -n 4 --dist loadfile 2>&1 |
            tee "$logs/unit.log" ;;
    benchmarks)
      results=$(python3 -c "from course_lib.core.benchmarking import RESULTS_DIR, gpu_slug; print(RESULTS_DIR / f'{gpu_slug()}.json')")
      for kernel in ${KERNELS:-$(python3 -m course_lib.registry)}; do  # default: every kernel course_lib.registry lists
        python3 -m benchmarks --only "$kernel" ${BENCH_ARGS:-} --out "$logs/bench_$kernel.json" 2>&1 |
          tee "$logs/bench_$kernel.log"
      done
      python3 -m benchmarks --merge $([ -f "$results" ] && echo "$results") "$logs"/bench_*.json ;;
    host) python3 -m benchmarks.host 2>&1 | tee "$logs/host.log" ;;
    training)  # the models are small: one process a seed shares the GPU, four times faster than in turn
      for seed in $(python3 -c "from course_lib.models.recall_task import CHAPTER_SEEDS; print(*CHAPTER_SEEDS)"); do
        python3 -m benchmarks.train_recall --seed "$seed" --out "$logs/training_seed$seed.json" \
          > "$logs/training_seed$seed.log" 2>&1 &
      done
      wait
      cat "$logs"/training_seed*.log
      python3 -m benchmarks.train_recall --merge "$logs"/training_seed*.json ;;
    profile) python3 -m benchmarks.profile_step 2>&1 | tee "$logs/profile_step.log" ;;
    execute)
      # Every observation the chapters make records this GPU's figures: the stored run readers
      # compare theirs with (course_lib/results/observations/<gpu>.json). All chapters: a new file.
      export COURSE_RECORD_OBSERVATIONS=$(python3 -c "from course_lib.core.benchmarking import gpu_slug; \
from course_lib.teaching.observations import RESULTS; print(RESULTS / f'{gpu_slug()}.json')")
      [ -n "${NOTEBOOKS:-}" ] || rm -f "$COURSE_RECORD_OBSERVATIONS"
      failed=0
      for notebook in ${NOTEBOOKS:-notebooks/*.ipynb}; do
        python3 -m course_lib.teaching.instructor execute "$notebook" 2>&1 | tee -a "$logs/execute.log" || failed=1
      done
      unset COURSE_RECORD_OBSERVATIONS
      return $failed ;;
    nbval) python3 -m pytest ${NOTEBOOKS:-notebooks/*.ipynb} -q -p no:cacheprovider --nbval --nbval-current-env \
             --nbval-sanitize-with nbval_sanitize.cfg 2>&1 | tee "$logs/nbval.log" ;;
    *) echo "unknown step $1: expected unit, benchmarks, host, training, profile, execute or nbval" >&2; exit 2 ;;
  esac
}
status=0
for step in $steps; do run_step "$step" || status=1; done
# What the run produced in one archive, for a host that hands back only a few files:
# its logs, the results files and the notebooks with their new outputs.
# Written outside the logs folder, then moved in: tar fails on a folder that changes as it reads it.
archive=$(mktemp)
tar czf "$archive" --exclude=gpu-run.tgz "$logs" course_lib/results notebooks/*.ipynb
mv "$archive" "$logs/gpu-run.tgz"
echo "wrote $logs/gpu-run.tgz"
exit $status
