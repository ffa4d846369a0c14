# make test  — create/refresh .venv from requirements.txt, run unit tests and nbval on every notebook
# make book  — build the HTML book into _build/html from the notebooks' stored outputs, then test it in a browser
# make lab   — open the notebooks in JupyterLab from .venv (make lab-instructor: with nbgrader's tools)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
LATEST_VENV := .venv-triton-latest
FLOOR_VENV := .venv-floor
SUBMISSIONS ?= submissions
# The seed of the checkers' hidden inputs when grading; empty: a new one, printed.
SEED ?=
# Grading's time limits in seconds: a cell, and a whole returned notebook; empty: the defaults
# (python -m course_lib.teaching.instructor grade --help says them).
CELL_TIMEOUT ?=
NOTEBOOK_TIMEOUT ?=
# Host memory (GiB) one returned notebook's processes may hold; empty: the default.
MEMORY_LIMIT ?=
# Returns graded at once (each in a sandbox of its own); UNSAFE=1 grades without a sandbox when
# there is none (never on a machine you cannot lose).
JOBS ?= 1
UNSAFE ?=
NOTEBOOKS := $(wildcard notebooks/*.ipynb)
# -rs: every skipped test says why (no GPU, no browser, ...).
PYTEST := -p no:cacheprovider -rs
# The suites run on every core (pytest-xdist), a whole file to a worker: a notebook's cells share one kernel.
PARALLEL := -n auto --dist loadfile
PYTEST_NBVAL := --nbval --nbval-current-env --nbval-sanitize-with nbval_sanitize.cfg --nbval-cell-timeout 600
# The package's tests, for other torch and Triton releases: the instructor tools (grading and its
# sandbox too), the book and the repository's own files need no particular Triton and are left to
# `make test`, which installs the sandbox.
PACKAGE_TESTS := tests --ignore=tests/teaching/test_instructor.py --ignore=tests/test_book.py \
	--ignore=tests/test_repository.py --ignore=tests/test_install.py --ignore=tests/teaching/grading

.PHONY: test test-unit test-notebooks test-triton-latest test-floor book lab lab-instructor set-repository student grade benchmarks training \
	gpu-wheels gpu-run clean sandbox

# A virtual environment is rebuilt whenever its pinned requirements change.
$(BIN)/.installed: requirements.txt pyproject.toml
	rm -rf $(VENV)
	@echo "Installing the pinned requirements into $(VENV): about 2.3 GB, five minutes on a 2-core machine."
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check --progress-bar on -r requirements.txt
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

$(LATEST_VENV)/.installed: requirements-triton-latest.txt pyproject.toml
	rm -rf $(LATEST_VENV)
	$(PYTHON) -m venv $(LATEST_VENV)
	$(LATEST_VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements-triton-latest.txt
	$(LATEST_VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

# The lowest torch and Triton that course_lib declares. course_lib is installed with its
# dependencies, constrained to the floor's pins: a declared range that excludes them fails here.
$(FLOOR_VENV)/.installed: requirements-floor.txt pyproject.toml
	rm -rf $(FLOOR_VENV)
	$(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements-floor.txt
	$(FLOOR_VENV)/bin/pip install --quiet --disable-pip-version-check --no-build-isolation -c requirements-floor.txt -e .
	touch $@

# The sandbox returns are graded in (course_lib/teaching/grading/sandbox.py): bubblewrap, from the
# distribution's own signed archive (Debian 12: 0.8.0). make grade and the grading tests need it.
# As root with apt-get (CI, a fresh machine) it is installed, with no question asked; the package
# lists are fetched only when the ones on the machine cannot give it. Elsewhere: how to install it.
APT_INSTALL := DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends
SANDBOX_HINT := Grading needs bubblewrap (bwrap): sudo apt-get install bubblewrap (Debian, Ubuntu), \
	sudo dnf install bubblewrap (Fedora); or make grade UNSAFE=1, on a machine you can lose.
sandbox:
	@command -v bwrap >/dev/null && exit 0; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then echo "$(SANDBOX_HINT)" >&2; exit 1; fi; \
	echo "Installing bubblewrap with apt-get ..."; \
	$(APT_INSTALL) bubblewrap </dev/null || { apt-get update -q </dev/null && $(APT_INSTALL) bubblewrap </dev/null; } \
		|| { echo "apt-get could not install bubblewrap. $(SANDBOX_HINT)" >&2; exit 1; }

# The browser test of the built book runs in make book, after the build it checks.
test: $(BIN)/.installed sandbox
	$(BIN)/python -m pytest $(PYTEST) $(PARALLEL) tests --ignore=tests/test_book.py $(NOTEBOOKS) $(PYTEST_NBVAL)

test-unit: $(BIN)/.installed sandbox
	$(BIN)/python -m pytest $(PYTEST) $(PARALLEL) tests --ignore=tests/test_book.py -m "not notebook_exec"

test-notebooks: $(BIN)/.installed
	$(BIN)/python -m pytest $(PYTEST) $(PARALLEL) $(NOTEBOOKS) $(PYTEST_NBVAL)

# The kernels on the newest Triton (block pointers are gone there); the instructor
# tools need no particular Triton and are left to `make test`.
test-triton-latest: $(LATEST_VENV)/.installed
	$(LATEST_VENV)/bin/python -m pytest $(PYTEST) $(PARALLEL) $(PACKAGE_TESTS)

test-floor: $(FLOOR_VENV)/.installed
	$(FLOOR_VENV)/bin/python -m pytest $(PYTEST) $(PARALLEL) $(PACKAGE_TESTS)

book: $(BIN)/.installed student
	$(BIN)/python -m course_lib.teaching.instructor solutions notebooks book/solutions
	$(BIN)/python -m course_lib.teaching.instructor exercise-table book/_generated/exercises.md
	$(BIN)/python scripts/benchmarks_page.py
	$(BIN)/python scripts/step_plot.py
	$(BIN)/jupyter-book build . --warningiserror --keep-going
	$(BIN)/python -m pytest $(PYTEST) tests/test_book.py

# LAB_ARGS passes options on, e.g. make lab LAB_ARGS="--no-browser --port 8890".
# The students' Lab: nbgrader's instructor tools (formgrader and its server extensions) are
# switched off by scripts/student_lab/; make lab-instructor opens the Lab with them.
lab: $(BIN)/.installed
	JUPYTER_CONFIG_PATH=$(CURDIR)/scripts/student_lab $(BIN)/jupyter lab notebooks \
		$(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

# The formgrader reads nbgrader_config.py at the repository's root.
lab-instructor: $(BIN)/.installed
	$(BIN)/jupyter lab . $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

# make set-repository URL=https://github.com/OWNER/NAME: the one place (_config.yml) and every
# install line (notebooks' first cells, README.md, book/setup.md) at once.
set-repository: $(BIN)/.installed
	$(BIN)/python scripts/repository.py set "$(URL)"

# The student copies in student/ are kept in the repository: the book's chapter pages and the
# launch buttons' target (a test checks they are current: run this after changing a notebook).
student: $(BIN)/.installed
	$(BIN)/python -m course_lib.teaching.instructor student notebooks student

# make grade SUBMISSIONS=course/submitted JOBS=2: graded/gradebook.csv, and graded/feedback/<student>/<assignment>.html
# with the graded notebook (.ipynb) beside it.
grade: $(BIN)/.installed $(if $(filter 1,$(UNSAFE)),,sandbox)
	$(BIN)/python -m course_lib.teaching.instructor grade $(SUBMISSIONS) --release notebooks --out graded \
		--jobs $(JOBS) $(if $(filter 1,$(UNSAFE)),--unsafe) \
		$(if $(SEED),--seed $(SEED)) $(if $(CELL_TIMEOUT),--timeout $(CELL_TIMEOUT)) \
		$(if $(NOTEBOOK_TIMEOUT),--notebook-timeout $(NOTEBOOK_TIMEOUT)) $(if $(MEMORY_LIMIT),--memory-limit $(MEMORY_LIMIT))

benchmarks: $(BIN)/.installed
	$(BIN)/python -m benchmarks

# Chapter 7's training runs (minutes on a GPU: the routed model and its light-only and dense
# baselines, four seeds each), stored for the chapter to plot.
training: $(BIN)/.installed
	$(BIN)/python -m benchmarks.train_recall

# For a GPU host without network: download here, copy the repository with .whl/ there.
gpu-wheels:
	bash scripts/gpu_wheels.sh .whl

# On the GPU host: unit tests, benchmarks, notebooks re-executed in place, then nbval.
gpu-run:
	bash scripts/gpu_run.sh .whl

clean:
	rm -rf _build build book/solutions graded $(VENV) $(LATEST_VENV) $(FLOOR_VENV)
