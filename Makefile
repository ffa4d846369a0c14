# make test  — create/refresh .venv from requirements.txt, run unit tests and nbval on every notebook
# make book  — build the HTML book into _build/html from the notebooks' stored outputs
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
LATEST_VENV := .venv-triton-latest
SUBMISSIONS ?= submissions
# The seed of the checkers' hidden inputs when grading; empty: a new one, printed.
SEED ?=
NOTEBOOKS := $(wildcard notebooks/*.ipynb)
PYTEST := -p no:cacheprovider
PYTEST_NBVAL := --nbval --nbval-current-env --nbval-sanitize-with nbval_sanitize.cfg --nbval-cell-timeout 600

.PHONY: test test-unit test-notebooks test-triton-latest book student grade benchmarks gpu-wheels gpu-run clean

# A virtual environment is rebuilt whenever its pinned requirements change.
$(BIN)/.installed: requirements.txt pyproject.toml
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.txt
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

$(LATEST_VENV)/.installed: requirements-triton-latest.txt pyproject.toml
	rm -rf $(LATEST_VENV)
	$(PYTHON) -m venv $(LATEST_VENV)
	$(LATEST_VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements-triton-latest.txt
	$(LATEST_VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

test: $(BIN)/.installed
	$(BIN)/python -m pytest $(PYTEST) tests $(NOTEBOOKS) $(PYTEST_NBVAL)

test-unit: $(BIN)/.installed
	$(BIN)/python -m pytest $(PYTEST) tests -m "not notebook_exec"

test-notebooks: $(BIN)/.installed
	$(BIN)/python -m pytest $(PYTEST) $(NOTEBOOKS) $(PYTEST_NBVAL)

# The kernels on the newest Triton (block pointers are gone there); the instructor
# tools need no particular Triton and are left to `make test`.
test-triton-latest: $(LATEST_VENV)/.installed
	$(LATEST_VENV)/bin/python -m pytest $(PYTEST) tests --ignore=tests/test_instructor.py

book: $(BIN)/.installed
	$(BIN)/python scripts/benchmarks_page.py
	$(BIN)/jupyter-book build . --warningiserror --keep-going

student: $(BIN)/.installed
	$(BIN)/python -m course_lib.instructor student notebooks student

grade: $(BIN)/.installed
	mkdir -p graded
	$(BIN)/python -m course_lib.instructor grade $(SUBMISSIONS) --release notebooks --out graded/scores.csv $(if $(SEED),--seed $(SEED))

benchmarks: $(BIN)/.installed
	$(BIN)/python -m benchmarks

# For a GPU host without network: download here, copy the repository with .whl/ there.
gpu-wheels:
	bash scripts/gpu_wheels.sh .whl

# On the GPU host: unit tests, benchmarks, notebooks re-executed in place, then nbval.
gpu-run:
	bash scripts/gpu_run.sh .whl

clean:
	rm -rf _build student graded $(VENV) $(LATEST_VENV)
