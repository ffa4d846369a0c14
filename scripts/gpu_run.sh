#!/usr/bin/env bash
# On a GPU host, without network: the unit tests, the benchmarks, the notebooks
# re-executed in place (their stored outputs then come from this GPU), then nbval on them.
#   bash scripts/gpu_run.sh [WHEELS]   (default .whl, made by scripts/gpu_wheels.sh)
# Logs go to $GPU_RUN_LOGS (default gpu-run-logs/).
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=${1:-.whl}
logs=${GPU_RUN_LOGS:-gpu-run-logs}
mkdir -p "$logs"
site=$(mktemp -d)
python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$wheels"/*.whl
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -c "from course_lib import runtime; print(runtime.describe()); assert runtime.ON_GPU, 'no GPU Triton can use'"

step() { echo "== $1"; shift; "$@"; }
step "unit tests" python3 -m pytest tests -q -p no:cacheprovider -m "not notebook_exec" 2>&1 | tee "$logs/unit.log"
step "benchmarks" python3 -m benchmarks 2>&1 | tee "$logs/benchmarks.log"
step "profile of one training step" python3 -m benchmarks.profile_step 2>&1 | tee "$logs/profile_step.log"
step "execute notebooks" python3 -m course_lib.instructor execute notebooks/*.ipynb 2>&1 | tee "$logs/execute.log"
step "nbval" python3 -m pytest notebooks/*.ipynb -q -p no:cacheprovider --nbval --nbval-current-env \
  --nbval-sanitize-with nbval_sanitize.cfg 2>&1 | tee "$logs/nbval.log"
