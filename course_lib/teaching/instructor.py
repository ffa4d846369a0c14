"""Student copies of the course notebooks, and grading of the copies students return.

Both follow the exercise convention of CONTRIBUTING.md: a code cell tagged ``solution``
holds the answer between a line ``# BEGIN SOLUTION`` and a line ``# END SOLUTION``, and
a code cell tagged ``checker`` calls one ``check_...`` function that raises when the
answer is wrong.

Command line::

    python -m course_lib.teaching.instructor student SRC_DIR DEST_DIR
    python -m course_lib.teaching.instructor grade SUBMISSIONS_DIR [--out CSV] [--timeout SECONDS]

``nbformat`` and ``nbclient`` (and ``ipykernel`` to run notebooks) are instructor-only
dependencies, so they are imported inside the functions that need them.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..core.runtime import ON_GPU

SOLUTION_TAG = "solution"
CHECKER_TAG = "checker"
HIDE_INPUT_TAG = "hide-input"
REMOVE_IN_STUDENT_TAG = "remove-in-student"
# Where the student copies are kept (the book's chapter pages and the launch buttons' target)
# and where the book's solutions pages are written, relative to the repository.
STUDENT_DIR = "student"
SOLUTIONS_DIR = "book/solutions"
INTERPRETER_OUTPUT = "interpreter-output"  # a cell whose outputs only the CPU interpreter can make
BEGIN_SOLUTION = "# BEGIN SOLUTION"
END_SOLUTION = "# END SOLUTION"
STUDENT_PLACEHOLDER = ("# YOUR CODE HERE", "pass")
CHECKER_CALL = re.compile(r"(check_\w+)\(")
EXERCISE_HEADING = re.compile(r"###\s+Exercise\s+(\d+)\.(\d+)\b")
TASK_ROLE, SOLUTION_ROLE, CHECKER_ROLE = "task", "solution", "checker"
NBGRADER_KEY = "nbgrader"
NBGRADER_SCHEMA_VERSION = 3
CHECKER_POINTS = 1
KERNEL_NAME = "python3"
DEFAULT_TIMEOUT = 600
DEFAULT_NOTEBOOK_TIMEOUT = 3600
DEFAULT_MEMORY_LIMIT_GIB = 16.0  # host memory of one return's processes (its kernel included)
MEMORY_POLL_SECONDS = 0.2
INSTALL_HINT = "pip install nbformat nbclient ipykernel psutil"
PASSED_MARK = "✓"
FAILED_MARK = "✗"


def _import_instructor_dependency(module_name: str):
    try:
        return importlib.import_module(module_name)
    except ImportError as error:
        raise ImportError(
            f"course_lib.teaching.instructor needs {module_name}, an instructor-only dependency "
            f"that is not installed. Install it with: {INSTALL_HINT}"
        ) from error


def _tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def _notebooks_in(folder: str | Path) -> list[Path]:
    """The ``*.ipynb`` files directly in ``folder``, sorted; an error if there are none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder")
    notebooks = sorted(folder.glob("*.ipynb"))
    if not notebooks:
        raise FileNotFoundError(f"{folder} holds no *.ipynb notebooks")
    return notebooks


# --- exercise cells: stable ids and nbgrader's metadata ------------------------------


@dataclass(frozen=True)
class ExerciseCell:
    """A cell of an exercise: its statement, its solution or its checker."""

    cell_index: int
    role: str  # one of ROLES
    grade_id: str


def exercise_cells(notebook, name: str) -> list[ExerciseCell]:
    """The exercise cells of a notebook, each with its stable id ``exercise_N_M_<role>``.

    An exercise is a markdown cell headed ``### Exercise N.M``, then its solution and
    checker cells; the id follows the exercise's number, so it stays the same when cells
    are added elsewhere. A solution or checker cell before any heading is an error.
    """
    cells: list[ExerciseCell] = []
    exercise: str | None = None
    used: set[str] = set()
    for cell_index, cell in enumerate(notebook.cells):
        heading = EXERCISE_HEADING.match(cell.source) if cell.cell_type == "markdown" else None
        tags = _tags(cell)
        if heading:
            exercise = f"exercise_{heading.group(1)}_{heading.group(2)}"
            role = TASK_ROLE
        elif cell.cell_type == "code" and SOLUTION_TAG in tags:
            role = SOLUTION_ROLE
        elif cell.cell_type == "code" and CHECKER_TAG in tags:
            role = CHECKER_ROLE
        else:
            continue
        if exercise is None:
            raise ValueError(f"{name}, cell {cell_index}: a {role} cell before any '### Exercise N.M' heading")
        grade_id, repeat = f"{exercise}_{role}", 1
        while grade_id in used:
            repeat += 1
            grade_id = f"{exercise}_{role}_{repeat}"
        used.add(grade_id)
        cells.append(ExerciseCell(cell_index, role, grade_id))
    return cells


def nbgrader_metadata(role: str, grade_id: str) -> dict:
    """nbgrader's cell metadata (schema 3): statements read-only, solutions for students
    to write, checkers read-only test cells worth one point each."""
    metadata = {
        "grade": role == CHECKER_ROLE,
        "grade_id": grade_id,
        "locked": role != SOLUTION_ROLE,
        "schema_version": NBGRADER_SCHEMA_VERSION,
        "solution": role == SOLUTION_ROLE,
    }
    if role == CHECKER_ROLE:
        metadata["points"] = CHECKER_POINTS
    return metadata


def _stamp(notebook, name: str) -> bool:
    """Give every exercise cell its nbgrader metadata; whether anything changed."""
    changed = False
    for exercise_cell in exercise_cells(notebook, name):
        cell = notebook.cells[exercise_cell.cell_index]
        metadata = nbgrader_metadata(exercise_cell.role, exercise_cell.grade_id)
        if cell.metadata.get(NBGRADER_KEY) != metadata:
            cell.metadata[NBGRADER_KEY] = metadata
            changed = True
    return changed


def stamp_exercise_metadata(paths) -> list[Path]:
    """Write nbgrader's metadata into the exercise cells of each notebook; the notebooks
    that changed. Sources and outputs are left as they are."""
    nbformat = _import_instructor_dependency("nbformat")
    changed = []
    for path in map(Path, paths):
        notebook = nbformat.read(path, as_version=4)
        if _stamp(notebook, path.name):
            nbformat.write(notebook, path)
            changed.append(path)
    return changed


def _grade_id(cell) -> str | None:
    return cell.get("metadata", {}).get(NBGRADER_KEY, {}).get("grade_id")


# --- student copies -----------------------------------------------------------------


def _is_marker(line: str, marker: str) -> bool:
    return line.strip() == marker


def _replace_solution_blocks(source: str, where: str) -> str:
    """Replace each marked block, markers included, by the placeholder at its indentation.

    ``where`` names the notebook and cell in error messages. A cell with no block, an
    ``# END SOLUTION`` without its ``# BEGIN SOLUTION``, a nested or an unclosed block is
    an error, so that a solution can never slip through into a student copy.
    """
    student_lines: list[str] = []
    block_indent: str | None = None
    blocks_found = 0
    for line_number, line in enumerate(source.split("\n"), start=1):
        if _is_marker(line, BEGIN_SOLUTION):
            if block_indent is not None:
                raise ValueError(f"{where}: nested {BEGIN_SOLUTION!r} at line {line_number}")
            block_indent = line[: len(line) - len(line.lstrip())]
        elif _is_marker(line, END_SOLUTION):
            if block_indent is None:
                raise ValueError(
                    f"{where}: {END_SOLUTION!r} at line {line_number} "
                    f"has no {BEGIN_SOLUTION!r} before it"
                )
            student_lines.extend(block_indent + text for text in STUDENT_PLACEHOLDER)
            block_indent = None
            blocks_found += 1
        elif block_indent is None:
            student_lines.append(line)
    if block_indent is not None:
        raise ValueError(f"{where}: {BEGIN_SOLUTION!r} is never closed by {END_SOLUTION!r}")
    if blocks_found == 0:
        raise ValueError(
            f"{where}: tagged {SOLUTION_TAG!r} but has no "
            f"{BEGIN_SOLUTION!r} ... {END_SOLUTION!r} block"
        )
    return "\n".join(student_lines)


def _without_run_metadata(cell) -> None:
    """Drop what the instructors' run left on a cell: its execution count and timings."""
    cell.metadata.pop("execution", None)
    if cell.cell_type == "code":
        cell.execution_count = None


def solutions_page_link(notebook_stem: str) -> str:
    """The line a student copy adds under each exercise statement: where its solution is."""
    return (f"Stuck after the hints? The solution is on [this chapter's solutions page]"
            f"(../{SOLUTIONS_DIR}/{notebook_stem}.md).")


def make_student_copy(src_path: str | Path, dest_path: str | Path) -> Path:
    """Write the student version of the notebook ``src_path`` to ``dest_path``.

    Solutions are replaced by ``# YOUR CODE HERE`` / ``pass`` and their cells lose the
    ``hide-input`` tag; cells tagged ``remove-in-student`` are dropped; the outputs of
    solution and checker cells (which came from the solution) are cleared, the others
    kept (the book's chapter pages are these copies, with the course's GPU outputs); execution
    counts and timings are dropped; each exercise statement ends with a link to the chapter's
    solutions page. Raises ValueError, naming the notebook and cell index, for a solution
    cell whose markers are missing or malformed, and for any ``# BEGIN SOLUTION`` line left
    outside a solution cell.
    """
    nbformat = _import_instructor_dependency("nbformat")
    src_path, dest_path = Path(src_path), Path(dest_path)
    notebook = nbformat.read(src_path, as_version=4)
    _stamp(notebook, src_path.name)  # the ids by which grading finds the checker cells
    roles = {cell.cell_index: cell.role for cell in exercise_cells(notebook, src_path.name)}

    kept_cells = []
    for cell_index, cell in enumerate(notebook.cells):
        tags = _tags(cell)
        if REMOVE_IN_STUDENT_TAG in tags:
            continue
        _without_run_metadata(cell)
        if roles.get(cell_index) == TASK_ROLE:
            cell.source = cell.source.rstrip() + "\n\n" + solutions_page_link(src_path.stem)
        if cell.cell_type == "code":
            if SOLUTION_TAG in tags:
                where = f"{src_path.name}, cell {cell_index}"
                cell.source = _replace_solution_blocks(cell.source, where)
                cell.metadata["tags"] = [tag for tag in tags if tag != HIDE_INPUT_TAG]
            if SOLUTION_TAG in tags or CHECKER_TAG in tags:
                cell.outputs = []
        kept_cells.append((cell_index, cell))

    # A marked solution in a cell not tagged `solution` would otherwise reach students.
    for cell_index, cell in kept_cells:
        if any(_is_marker(line, BEGIN_SOLUTION) for line in cell.source.split("\n")):
            raise ValueError(
                f"{src_path.name}, cell {cell_index}: contains {BEGIN_SOLUTION!r} but is "
                f"not tagged {SOLUTION_TAG!r}; tag it, or tag it {REMOVE_IN_STUDENT_TAG!r}"
            )

    notebook.cells = [cell for _, cell in kept_cells]
    dest_path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, dest_path)
    return dest_path


def make_student_copies(src_dir: str | Path, dest_dir: str | Path) -> list[Path]:
    """Write a student copy of each ``*.ipynb`` in ``src_dir`` (not recursive) to ``dest_dir``."""
    notebooks = _notebooks_in(src_dir)
    dest_dir = Path(dest_dir)
    if dest_dir.resolve() == Path(src_dir).resolve():
        raise ValueError(f"{dest_dir} is the source folder; student copies would overwrite it")
    return [make_student_copy(notebook, dest_dir / notebook.name) for notebook in notebooks]


def _solution_code(source: str) -> str:
    """A solution cell's code as the solutions page shows it: the markers left out."""
    return "\n".join(line for line in source.split("\n")
                     if not (_is_marker(line, BEGIN_SOLUTION) or _is_marker(line, END_SOLUTION))).strip()


def solutions_page(src_path: str | Path) -> str:
    """The markdown of one chapter's solutions page: each exercise's heading and the code of
    its solution cells, from the instructors' notebook ``src_path``."""
    nbformat = _import_instructor_dependency("nbformat")
    src_path = Path(src_path)
    notebook = nbformat.read(src_path, as_version=4)
    title = next((cell.source.split("\n", 1)[0].lstrip("# ").strip() for cell in notebook.cells
                  if cell.cell_type == "markdown" and cell.source.startswith("# ")), src_path.stem)
    lines = [f"# Solutions: {title}", "",
             f"The answers to the exercises of [the chapter](../../{STUDENT_DIR}/{src_path.stem}.ipynb). "
             "Try the hints under each exercise first: a kernel you wrote yourself teaches more than one you read.",
             ""]
    for exercise_cell in exercise_cells(notebook, src_path.name):
        cell = notebook.cells[exercise_cell.cell_index]
        if exercise_cell.role == TASK_ROLE:
            lines += ["", cell.source.split("\n", 1)[0].replace("###", "##", 1), ""]
        elif exercise_cell.role == SOLUTION_ROLE:
            lines += ["```python", _solution_code(cell.source), "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def make_solutions_pages(src_dir: str | Path, dest_dir: str | Path) -> list[Path]:
    """Write one solutions page (markdown) for each ``*.ipynb`` of ``src_dir`` into ``dest_dir``."""
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for notebook in _notebooks_in(src_dir):
        path = dest_dir / f"{notebook.stem}.md"
        path.write_text(solutions_page(notebook), encoding="utf-8")
        written.append(path)
    return written


def exercise_table() -> str:
    """The instructors' table of every exercise (``exercises.EXERCISES``), as markdown."""
    from .exercises import EXERCISES

    rows = ["| Exercise | Title | Answer | Skills | Difficulty (1–5) | Minutes |", "|---|---|---|---|---|---|"]
    for exercise in EXERCISES:
        answer = "a `@triton.jit` kernel" if exercise.kernel else "PyTorch"
        rows.append(f"| {exercise.number} | {exercise.title} | {answer} | {exercise.skills} | "
                    f"{exercise.difficulty} | {exercise.minutes} |")
    kernels = sum(exercise.kernel for exercise in EXERCISES)
    minutes = sum(exercise.minutes for exercise in EXERCISES)
    rows += ["", f"{len(EXERCISES)} exercises, {kernels} of them kernels; about {minutes / 60:.0f} hours in all."]
    return "\n".join(rows) + "\n"


# --- grading ------------------------------------------------------------------------

AS_RELEASED, EDITED, MISSING = "as released", "edited", "missing"
CHECKER_ID_KEY = "course_lib_checker"  # the grade id of a released checker cell, in the graded notebook
GRADED_CHECKER_SOURCE = """\
# The released checker {grade_id}, run by course_lib.teaching.instructor (see course_lib/teaching/fresh_checker.py).
__course_grader = {{"__name__": "course_lib_fresh_checker"}}
exec(compile(open({runner!r}, encoding="utf-8").read(), {runner!r}, "exec"), __course_grader)
__course_grader["run_checker"](globals(), {source!r}, {grade_id!r}, {seed!r}, {results!r}, {package!r})
"""
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # course_lib itself
FRESH_CHECKER_FILE = Path(__file__).resolve().parent / "fresh_checker.py"
FRESH_CHECKER_IN_PACKAGE = FRESH_CHECKER_FILE.relative_to(PACKAGE_DIR)  # where a copy of the package has it


@dataclass(frozen=True)
class ReleasedChecker:
    """A checker cell as the instructor released it."""

    grade_id: str
    label: str  # the check_... function it calls
    source: str
    tags: tuple[str, ...]
    follows: str | None  # grade_id of the exercise cell it comes after: its solution, or its statement


@dataclass(frozen=True)
class ReleasedNotebook:
    name: str  # file name in the release folder
    checkers: tuple[ReleasedChecker, ...]
    grade_ids: frozenset[str]  # of all its exercise cells


@dataclass
class CheckerResult:
    """One checker of the release, in one returned notebook."""

    grade_id: str
    label: str
    passed: bool
    error: str | None = None  # why it failed
    in_return: str = AS_RELEASED  # the return's copy of the cell: as released, edited or missing


@dataclass
class CellError:
    """A code cell of the return, outside the checkers, that raised."""

    cell_index: int  # in the returned notebook
    error: str  # first line of "ename: evalue"


@dataclass
class NotebookGrade:
    """The result of grading one returned notebook against the release."""

    notebook: str  # file name
    release: str | None = None  # the released notebook it was graded against
    checkers: list[CheckerResult] = field(default_factory=list)
    errored_cells: list[CellError] = field(default_factory=list)
    problem: str | None = None  # why grading could not run it all: unreadable, killed, kernel died

    @property
    def passed(self) -> int:
        return sum(checker.passed for checker in self.checkers)

    @property
    def total(self) -> int:
        return len(self.checkers)

    @property
    def score(self) -> str:
        # A return matched to no notebook was not graded: "0/0" would read like a pass.
        return f"{self.passed}/{self.total}" if self.release is not None else "not graded"


def _error_line(ename: str, evalue: str) -> str:
    text = f"{ename}: {evalue}" if evalue else ename
    return text.split("\n", 1)[0]


def _cell_error(cell) -> str | None:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return _error_line(output.get("ename", ""), output.get("evalue", ""))
    return None


def _checker_label(source: str, grade_id: str) -> str:
    call = CHECKER_CALL.search(source)
    return call.group(1) if call else grade_id


def load_release(folder: str | Path) -> list[ReleasedNotebook]:
    """The checker cells of every notebook in the instructor's ``folder``, by stable id."""
    nbformat = _import_instructor_dependency("nbformat")
    release = []
    for path in _notebooks_in(folder):
        notebook = nbformat.read(path, as_version=4)
        checkers, follows = [], None
        cells = exercise_cells(notebook, path.name)
        for exercise_cell in cells:
            cell = notebook.cells[exercise_cell.cell_index]
            if exercise_cell.role == CHECKER_ROLE:
                checkers.append(ReleasedChecker(
                    grade_id=exercise_cell.grade_id,
                    label=_checker_label(cell.source, exercise_cell.grade_id),
                    source=cell.source,
                    tags=tuple(_tags(cell)),
                    follows=follows,
                ))
            else:
                follows = exercise_cell.grade_id
        release.append(ReleasedNotebook(
            name=path.name,
            checkers=tuple(checkers),
            grade_ids=frozenset(exercise_cell.grade_id for exercise_cell in cells),
        ))
    return release


def _match_release(notebook, file_name: str, release: list[ReleasedNotebook]) -> ReleasedNotebook | None:
    """The released notebook a return comes from: the one sharing most exercise ids with
    it (from nbgrader's metadata, or from its ``### Exercise N.M`` headings when a copy lost
    the metadata), else the one whose name ends the return's file name (``alice_01_x.ipynb``)."""
    ids = {_grade_id(cell) for cell in notebook.cells} if notebook is not None else set()
    if notebook is not None:  # a copy that lost its metadata still has the exercises' headings
        try:
            ids |= {cell.grade_id for cell in exercise_cells(notebook, file_name)}
        except ValueError:  # cells out of order: the metadata and the name are left to match
            pass
    overlap, best = max(((len(ids & released.grade_ids), released) for released in release),
                        key=lambda pair: pair[0], default=(0, None))
    if overlap:
        return best
    by_name = [released for released in release if file_name.endswith(released.name)]
    return max(by_name, key=lambda released: len(released.name), default=None)


def _read_return(path: Path):
    """(notebook, None) or (None, why it cannot be graded)."""
    nbformat = _import_instructor_dependency("nbformat")
    try:
        notebook = nbformat.read(path, as_version=4)
        nbformat.validate(notebook)
    except Exception as error:  # truncated JSON, another kind of file, an invalid notebook
        return None, f"not a readable notebook: {_error_line(type(error).__name__, str(error))}"
    return notebook, None


def _graded_notebook(notebook, released: ReleasedNotebook, seed: int | None, results_path: Path,
                     package_dir: Path = PACKAGE_DIR):
    """The return with its checker cells replaced by the release's, each after its
    solution (at the end if the return lost that too). Returns the notebook, the
    return's index of each of its cells (None for a released checker) and what the
    return had done to each checker cell."""
    nbformat_v4 = _import_instructor_dependency("nbformat.v4")
    by_id = {checker.grade_id: checker for checker in released.checkers}
    in_return = {grade_id: MISSING for grade_id in by_id}
    to_place: dict[str | None, list[ReleasedChecker]] = {}
    for checker in released.checkers:
        to_place.setdefault(checker.follows, []).append(checker)

    def released_cell(checker):
        source = GRADED_CHECKER_SOURCE.format(
            grade_id=checker.grade_id, runner=str(package_dir / FRESH_CHECKER_IN_PACKAGE),
            source=checker.source, seed=seed, results=str(results_path), package=str(package_dir))
        return nbformat_v4.new_code_cell(source, metadata={"tags": list(checker.tags), CHECKER_ID_KEY: checker.grade_id})

    try:  # a copy that lost nbgrader's metadata: the ids its headings give
        derived = {cell.cell_index: cell.grade_id for cell in exercise_cells(notebook, "the return")}
    except ValueError:
        derived = {}
    cells, return_index = [], []
    for cell_index, cell in enumerate(notebook.cells):
        grade_id = _grade_id(cell) or derived.get(cell_index)
        if grade_id in by_id or (cell.cell_type == "code" and CHECKER_TAG in _tags(cell)):
            if in_return.get(grade_id) == MISSING:
                checker = by_id[grade_id]
                same = cell.source.strip() == checker.source.strip() and tuple(_tags(cell)) == checker.tags
                in_return[grade_id] = AS_RELEASED if same else EDITED
            continue  # checkers come from the release
        if cell.cell_type == "code":
            cell.outputs = []  # only this run's outputs count
            cell.execution_count = None
        cells.append(cell)
        return_index.append(cell_index)
        for checker in to_place.pop(grade_id, []) if grade_id else []:
            cells.append(released_cell(checker))
            return_index.append(None)
    for checker in (checker for group in to_place.values() for checker in group):
        cells.append(released_cell(checker))
        return_index.append(None)
    notebook.cells = cells
    return notebook, return_index, in_return


def _execute(notebook, folder: Path, timeout: int, allow_errors: bool) -> None:
    """Run ``notebook`` in a fresh ``python3`` kernel from ``folder``, outputs in place."""
    nbclient = _import_instructor_dependency("nbclient")
    kernelspec = _import_instructor_dependency("jupyter_client.kernelspec")
    client = nbclient.NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name=KERNEL_NAME,
        allow_errors=allow_errors,
        interrupt_on_timeout=allow_errors,
        resources={"metadata": {"path": str(Path(folder).resolve())}},
    )
    try:
        client.execute()
    except kernelspec.NoSuchKernel as error:
        raise RuntimeError(f"no {KERNEL_NAME!r} Jupyter kernel. Install one with: {INSTALL_HINT}") from error


def execute_in_place(paths, timeout: int = DEFAULT_TIMEOUT) -> None:
    """Re-execute notebooks top to bottom and save them with the new outputs.

    This is how the stored outputs are made (on a GPU, by ``make gpu-run``); any cell
    that raises stops it, so a broken notebook is never saved. Cells tagged
    INTERPRETER_OUTPUT draw what only Triton's CPU interpreter can (course_lib.teaching.accesses):
    run on a GPU, they keep the outputs the interpreter made.
    """
    nbformat = _import_instructor_dependency("nbformat")
    for path in map(Path, paths):
        notebook = nbformat.read(path, as_version=4)
        kept = {cell.id: cell.outputs for cell in notebook.cells
                if INTERPRETER_OUTPUT in cell.metadata.get("tags", [])} if ON_GPU else {}
        _execute(notebook, path.parent, timeout, allow_errors=False)
        for cell in notebook.cells:
            if cell.get("id") in kept:
                cell.outputs = kept[cell.id]
        nbformat.write(notebook, path)


def run_graded(graded_path: Path, folder: Path, timeout: int, summary_path: Path) -> None:
    """Execute a graded notebook from ``folder``, going on past errors, and write each
    cell's error (or None), and why execution stopped early if it did, to
    ``summary_path``. Runs in a process of its own, killed at the grader's wall-clock limit."""
    nbformat = _import_instructor_dependency("nbformat")
    nbclient = _import_instructor_dependency("nbclient")
    notebook = nbformat.read(graded_path, as_version=4)
    aborted = None
    try:
        _execute(notebook, folder, timeout, allow_errors=True)
    except nbclient.exceptions.DeadKernelError:
        aborted = "the kernel died"
    summary = {"errors": [_cell_error(cell) for cell in notebook.cells], "aborted": aborted,
               "checker_ids": [cell.metadata.get(CHECKER_ID_KEY) for cell in notebook.cells],
               "executed": [cell.get("execution_count") is not None for cell in notebook.cells]}
    Path(summary_path).write_text(json.dumps(summary), encoding="utf-8")


def _grading_environment(package_parent: Path = PACKAGE_DIR.parent) -> dict:
    """The grader's copy of course_lib comes first, for the notebook's kernel too."""
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        part for part in [str(package_parent), environment.get("PYTHONPATH", "")] if part)
    return environment


def _snapshot(folder: Path, exclude=frozenset()) -> dict[str, bytes]:
    """Every file under ``folder`` (caches and ``exclude``, resolved paths, aside), by relative
    path, as bytes: what grading restores, and what each return gets a fresh copy of."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*"))
            if path.is_file() and "__pycache__" not in path.parts and path.resolve() not in exclude}


def _write_snapshot(snapshot: dict[str, bytes], folder: Path) -> None:
    for relative, content in snapshot.items():
        target = folder / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)


def _restore(folder: Path, snapshot: dict[str, bytes], exclude=frozenset()) -> list[str]:
    """Put ``folder`` back as ``snapshot`` holds it; the relative paths that had changed."""
    changed = sorted(set(_snapshot(folder, exclude).items()) ^ set(snapshot.items()))
    names = sorted({relative for relative, _ in changed})
    for relative in names:
        path = folder / relative
        if relative in snapshot:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(snapshot[relative])
        elif path.is_file():
            path.unlink()
    return names


def _kill_family(process, psutil) -> None:
    """Kill ``process`` and every process it started (a kernel, whatever its code catches)."""
    try:
        parent = psutil.Process(process.pid)
        family = [*parent.children(recursive=True), parent]
    except psutil.NoSuchProcess:
        family = []
    for member in family:
        try:
            member.kill()
        except psutil.NoSuchProcess:
            pass
    process.wait()


def _family_memory(process, psutil) -> int:
    """Resident host memory of ``process`` and every process it started, in bytes."""
    try:
        parent = psutil.Process(process.pid)
        family = [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for member in family:
        try:
            total += member.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def _run_with_wall_clock_limit(command: list[str], limit: float, log_path: Path,
                               package_parent: Path = PACKAGE_DIR.parent, stdin_text: str = "",
                               memory_limit: float | None = None) -> tuple[int | None, str | None]:
    """Run ``command`` (``stdin_text`` on its stdin); past ``limit`` seconds, or once it and
    the processes it started hold more than ``memory_limit`` bytes of host memory, kill them
    all. Returns (exit code, None) or (None, why it was killed)."""
    import time

    psutil = _import_instructor_dependency("psutil")
    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.PIPE, text=True,
                                   env=_grading_environment(package_parent), cwd=log_path.parent)
        try:
            process.stdin.write(stdin_text)
            process.stdin.close()
        except BrokenPipeError:  # it ended before reading
            pass
        deadline = time.monotonic() + limit
        while True:
            try:
                return process.wait(timeout=max(0.0, min(MEMORY_POLL_SECONDS, deadline - time.monotonic()))), None
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() >= deadline:
                _kill_family(process, psutil)
                return None, f"stopped after {limit:g} s, the limit for one notebook"
            if memory_limit is not None and _family_memory(process, psutil) > memory_limit:
                _kill_family(process, psutil)
                return None, (f"stopped when it held more than {memory_limit / 2**30:g} GiB of host memory, "
                              "the limit for one notebook")


def _read_results(results_path: Path) -> tuple[dict[str, dict], list[str]]:
    """The checkers' records, first by grade id, and every grade id recorded more than once
    (each released checker writes one record when it runs: a second is a forgery)."""
    results: dict[str, dict] = {}
    repeated = []
    if results_path.exists():
        for line in results_path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
                grade_id = str(record["grade_id"])
            except (ValueError, KeyError, TypeError):
                repeated.append("an unreadable record")
                continue
            if grade_id in results:
                repeated.append(grade_id)
            results.setdefault(grade_id, record)
    return results, repeated


# A checker cell that hands one name to a kernel exercise's or a PyTorch exercise's checker, or
# exercise 5.3's three (two kernels and their torch.library operator): its verdict comes from
# course_lib/teaching/kernel_verdicts.py, run on the answers' source in a process of its own.
KERNEL_CHECKER_CALL = re.compile(r"^\s*exercises\.(check_\w+)\((\w+)\)\s*$")
OPERATOR_CHECKER_CALL = re.compile(r"^\s*exercises\.(check_\w+)\(\s*(\w+)\s*,\s*(\w+)\s*,\s*(\w+)\s*,?\s*\)\s*$")
KERNEL_VERDICTS_IN_PACKAGE = Path("teaching") / "kernel_verdicts.py"
KERNEL_ANSWER, TORCH_ANSWER, OPERATOR_ANSWER = "kernel", "torch", "operator"


def _kernel_checkers(released: ReleasedNotebook) -> dict[str, tuple[str, str | tuple[str, ...], str]]:
    """{grade_id: (check function, answer name, KERNEL_ANSWER, TORCH_ANSWER or OPERATOR_ANSWER)} of
    the release's checkers judged out of the notebook's process: those of the kernel exercises and
    of the PyTorch exercises (``kernel=False``) whose checker cell hands the checker one name, and
    those of kernel_verdicts.OPERATOR_CHECKERS handed three (their answer name: the three names,
    two kernels and the operator)."""
    from .exercises import EXERCISES
    from .kernel_verdicts import OPERATOR_CHECKERS

    kinds = {exercise.checker: KERNEL_ANSWER if exercise.kernel else TORCH_ANSWER for exercise in EXERCISES}
    found = {}
    for checker in released.checkers:
        call = KERNEL_CHECKER_CALL.match(checker.source)
        operator_call = OPERATOR_CHECKER_CALL.match(checker.source)
        if call and call.group(1) in kinds and call.group(1) not in OPERATOR_CHECKERS:
            found[checker.grade_id] = (call.group(1), call.group(2), kinds[call.group(1)])
        elif operator_call and operator_call.group(1) in OPERATOR_CHECKERS and operator_call.group(1) in kinds:
            found[checker.grade_id] = (operator_call.group(1), operator_call.groups()[1:], OPERATOR_ANSWER)
    return found


def _kernel_verdicts(return_sources: list[str], kernels: dict[str, tuple[str, str, str]], seed: int | None,
                     scratch: Path, package_copy: Path, limit: float,
                     memory_limit: float | None = None) -> dict[str, dict]:
    """{grade_id: record} for each checker of ``kernels`` (:func:`_kernel_checkers`), from its
    answer's source alone, checked (a kernel in Triton's language, a PyTorch answer in the
    grader's PyTorch language, an operator's cell in that language extended by what building
    the operator needs) and run in a fresh process that never runs the return's other code
    (kernel_verdicts.py)."""
    from .kernel_verdicts import NotAKernel, NotPyTorch, kernel_definition, operator_definition, torch_definition

    verdicts, entries = {}, []
    for grade_id, (checker, name, kind) in kernels.items():
        entry = {"grade_id": grade_id, "checker": checker, "kind": kind}
        try:
            if kind == OPERATOR_ANSWER:  # two kernels, and the cell that makes them an operator
                entry.update(name=name[-1], names=list(name),
                             sources=[kernel_definition(return_sources, kernel) for kernel in name[:-1]]
                             + [operator_definition(return_sources, name[:-1], name[-1])])
            else:
                definition = torch_definition if kind == TORCH_ANSWER else kernel_definition
                entry.update(name=name, source=definition(return_sources, name))
            entries.append(entry)
        except (NotAKernel, NotPyTorch) as error:
            verdicts[grade_id] = {"grade_id": grade_id, "passed": False, "error": f"{type(error).__name__}: {error}"}
    if not entries:
        return verdicts
    folder = scratch / "kernel_verdicts"  # its working directory, empty
    folder.mkdir()
    spec = scratch / "kernels.json"
    spec.write_text(json.dumps({"seed": seed, "kernels": entries}), encoding="utf-8")
    secret = secrets.token_hex(16)
    log = folder / "log.txt"
    command = [sys.executable, str(package_copy / KERNEL_VERDICTS_IN_PACKAGE), str(package_copy), str(spec)]
    exit_code, killed = _run_with_wall_clock_limit(command, limit, log, package_copy.parent, stdin_text=secret + "\n",
                                                   memory_limit=memory_limit)
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith(secret):
            record = json.loads(line[len(secret):])
            verdicts.setdefault(record["grade_id"], record)
    why = killed or f"ended with exit code {exit_code}"
    for entry in entries:
        answer = "kernel" if entry["kind"] == KERNEL_ANSWER else "answer"
        verdicts.setdefault(entry["grade_id"], {"grade_id": entry["grade_id"], "passed": False,
                                                "error": f"the {answer}'s own checking process {why} before its verdict"})
    return verdicts


def grade_notebook(
    path: str | Path,
    release: list[ReleasedNotebook],
    *,
    seed: int | None = None,
    timeout: int = DEFAULT_TIMEOUT,
    notebook_timeout: float = DEFAULT_NOTEBOOK_TIMEOUT,
    package: dict[str, bytes] | None = None,
    memory_limit_gib: float | None = DEFAULT_MEMORY_LIMIT_GIB,
) -> NotebookGrade:
    """Grade the returned notebook at ``path`` against the released notebook it comes from.

    The return runs as the student left it, but for its checker cells: every checker of
    the release runs, from the release's source, against ``course_lib.teaching.exercises``
    imported afresh, on hidden inputs drawn from ``seed`` (None: the checkers' own random
    inputs). A checker passes only when it returned. ``timeout`` bounds each cell (the cell
    is interrupted); ``notebook_timeout`` the whole run, past which the process running it
    and its kernel are killed, as they are once they hold more than ``memory_limit_gib``
    GiB of host memory together (None: no limit).

    The return runs in a scratch folder of its own, with a copy of the package made from
    ``package`` (a :func:`_snapshot` of it, taken once for a whole class; now, if None):
    what it writes there is thrown away with the folder.
    """
    path = Path(path)
    notebook, problem = _read_return(path)
    released = _match_release(notebook, path.name, release)
    grade = NotebookGrade(notebook=path.name, release=released.name if released else None, problem=problem)
    if released is None:
        grade.problem = problem or "matches no notebook of the release"
        return grade
    if notebook is None:
        grade.checkers = [CheckerResult(checker.grade_id, checker.label, False, problem, MISSING)
                          for checker in released.checkers]
        return grade

    nbformat = _import_instructor_dependency("nbformat")
    return_sources = [cell.source for cell in notebook.cells if cell.cell_type == "code"]
    kernels = _kernel_checkers(released)
    with tempfile.TemporaryDirectory(prefix="course_lib_grading_") as scratch:
        scratch = Path(scratch)
        package_copy = scratch / "package" / "course_lib"
        _write_snapshot(package if package is not None else _snapshot(PACKAGE_DIR), package_copy)
        work = scratch / "work"  # the kernel's folder: the return's relative writes land here
        work.mkdir()
        results_path, summary_path = scratch / "checkers.jsonl", scratch / "summary.json"
        graded, return_index, in_return = _graded_notebook(notebook, released, seed, results_path, package_copy)
        nbformat.write(graded, scratch / "graded.ipynb")
        command = [sys.executable, "-m", "course_lib.teaching.instructor", "run-graded", str(scratch / "graded.ipynb"),
                   str(work), str(summary_path), "--timeout", str(timeout)]
        memory_limit = None if memory_limit_gib is None else memory_limit_gib * 2**30
        exit_code, killed = _run_with_wall_clock_limit(command, notebook_timeout, scratch / "log.txt",
                                                       package_copy.parent, memory_limit=memory_limit)
        results, repeated = _read_results(results_path)
        verdicts = _kernel_verdicts(return_sources, kernels, seed, scratch, package_copy, notebook_timeout,
                                    memory_limit)
        if killed:
            grade.problem = killed
        elif not summary_path.exists():
            last_line = (scratch / "log.txt").read_text(errors="replace").strip().splitlines()[-1:]
            grade.problem = f"the grading process failed (exit code {exit_code}): {' '.join(last_line)}"
        else:
            summary = json.loads(summary_path.read_text(encoding="utf-8"))
            grade.problem = summary["aborted"]
            for error, index in zip(summary["errors"], return_index):
                if error is not None and index is not None:
                    grade.errored_cells.append(CellError(cell_index=index, error=error))
            checker_errors = {cell_id: error for cell_id, error in zip(summary["checker_ids"], summary["errors"])
                              if cell_id is not None}
            ran = {cell_id for cell_id, executed in zip(summary["checker_ids"], summary["executed"])
                   if cell_id is not None and executed}
            unexpected = [grade_id for grade_id in results if grade_id not in ran]
            # A checker records a pass only once it has returned, and its cell then ends without
            # error, as the grading process, outside the kernel, sees it: a pass recorded for a
            # cell that raised was written by something else.
            contradicted = [grade_id for grade_id, record in results.items()
                            if record.get("passed") is not False and checker_errors.get(grade_id)]
            if repeated or unexpected or contradicted:
                grade.problem = ("tampered: the checkers' results were written by something else than the checkers "
                                 f"(repeated: {sorted(set(repeated))[:5]}; of checkers that did not run: "
                                 f"{sorted(unexpected)[:5]}; passes of checkers whose cell raised: "
                                 f"{sorted(contradicted)[:5]})")
        results.update(verdicts)  # a kernel's or PyTorch answer's verdict comes from its own process, whatever
        # the notebook wrote
        tampered = bool(grade.problem and grade.problem.startswith("tampered"))

    for checker in released.checkers:
        result = results.get(checker.grade_id)
        if result is None:
            error = f"did not finish: {grade.problem}" if grade.problem else "did not run"
        else:
            error = result["error"]
        passed = result is not None and result["passed"] is True and not tampered
        if in_return[checker.grade_id] == MISSING:
            # Counted as failed whatever the answer: the release's copy still ran, for the report.
            ran = "it passed" if passed else error
            passed, error = False, f"checker cell missing from the return (run from the release: {ran})"
        grade.checkers.append(CheckerResult(checker.grade_id, checker.label, passed, error,
                                            in_return[checker.grade_id]))
    return grade


def grade_folder(
    folder: str | Path,
    release_dir: str | Path,
    *,
    seed: int | None = None,
    timeout: int = DEFAULT_TIMEOUT,
    notebook_timeout: float = DEFAULT_NOTEBOOK_TIMEOUT,
    on_start: Callable[[Path], None] | None = None,
    on_graded: Callable[[list[NotebookGrade]], None] | None = None,
    grader_files=(),
    memory_limit_gib: float | None = DEFAULT_MEMORY_LIMIT_GIB,
) -> list[NotebookGrade]:
    """Grade every ``*.ipynb`` in ``folder``, sorted by name, against the notebooks of
    ``release_dir``; ``on_start`` sees each path first, ``on_graded`` the grades so far
    after each notebook. Other files of the folder (but hidden ones) get a row saying
    they were not graded, and a notebook whose grading fails for any reason gets a row
    saying why: the rest of the folder is graded all the same. ``grader_files`` are files
    the caller writes as grading goes (the scores), which may lie in the guarded folders."""
    release = load_release(release_dir)
    notebooks = _notebooks_in(folder)
    others = [path for path in Path(folder).iterdir()
              if path.is_file() and path.suffix != ".ipynb" and not path.name.startswith(".")]
    # Taken before any return runs: each return gets a fresh copy of the package, and whatever
    # a return writes to the package, the release or the returns is put back before the next.
    guarded = {Path(folder).resolve(): None, Path(release_dir).resolve(): None, PACKAGE_DIR: None}
    exclude = frozenset(Path(file).resolve() for file in grader_files)
    guarded = {place: _snapshot(place, exclude) for place in guarded}
    grades = []
    for path in sorted(notebooks + others):
        if on_start is not None:
            on_start(path)
        if path.suffix != ".ipynb":
            grade = NotebookGrade(notebook=path.name, problem="not graded: only *.ipynb notebooks are")
        else:
            try:
                grade = grade_notebook(path, release, seed=seed, timeout=timeout, notebook_timeout=notebook_timeout,
                                       package=guarded[PACKAGE_DIR], memory_limit_gib=memory_limit_gib)
            except Exception as error:  # a fault of the grader's, not the student's: say it, go on
                grade = NotebookGrade(notebook=path.name, problem=f"grading failed: {_error_line(type(error).__name__, str(error))}")
            written = [f"{place.name}/{name}" for place, snapshot in guarded.items()
                       for name in _restore(place, snapshot, exclude)]
            if written:  # put back already; the return scores nothing
                for checker in grade.checkers:
                    checker.passed = False
                grade.problem = "tampered: it wrote to " + ", ".join(written[:5]) + " (put back)"
        grades.append(grade)
        if on_graded is not None:
            on_graded(grades)
    return grades


def _checker_columns(grade: NotebookGrade) -> list[tuple[str, CheckerResult]]:
    """(column name, result) for each checker; a label called twice gets ``#2``, ``#3``..."""
    seen: dict[str, int] = {}
    columns = []
    for checker in grade.checkers:
        seen[checker.label] = seen.get(checker.label, 0) + 1
        count = seen[checker.label]
        columns.append((checker.label if count == 1 else f"{checker.label}#{count}", checker))
    return columns


def _changed_checkers(grade: NotebookGrade) -> str:
    changed: dict[str, list[str]] = {}
    for name, checker in _checker_columns(grade):
        if checker.in_return != AS_RELEASED:
            changed.setdefault(checker.in_return, []).append(name)
    return "; ".join(f"{state}: {', '.join(names)}" for state, names in changed.items())


def _errors_outside_checkers(grade: NotebookGrade) -> str:
    errors = [f"cell {cell.cell_index}: {cell.error}" for cell in grade.errored_cells]
    if grade.problem:
        errors.append(grade.problem)
    return "; ".join(errors)


def format_table(grades: list[NotebookGrade]) -> str:
    """A plain-text table: one row per notebook with its score, ✓/✗ per checker, the
    checker cells the return had edited or lost, and the cells outside the checkers
    that raised. Checkers are columns, in order of first appearance, so copies of one
    notebook line up; a notebook without a column's checker leaves it blank."""
    checker_names: list[str] = []
    for grade in grades:
        for name, _ in _checker_columns(grade):
            if name not in checker_names:
                checker_names.append(name)

    header = ["notebook", "score", *checker_names, "checker cells changed", "errors outside checkers"]
    rows = [header]
    for grade in grades:
        marks = {
            name: PASSED_MARK if checker.passed else FAILED_MARK
            for name, checker in _checker_columns(grade)
        }
        rows.append(
            [
                grade.notebook,
                grade.score,
                *(marks.get(name, "") for name in checker_names),
                _changed_checkers(grade),
                _errors_outside_checkers(grade),
            ]
        )

    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = [
        "  ".join(text.ljust(width) for text, width in zip(row, widths)).rstrip() for row in rows
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


CSV_COLUMNS = ["notebook", "checker", "passed", "error", "checker_cell", "release"]


def write_csv(grades: list[NotebookGrade], out_path: str | Path) -> Path:
    """One row per notebook and checker of the release: notebook, checker, passed (1 or
    0), error, checker_cell (as released, edited or missing in the return) and release.
    A notebook that matches no released notebook gets one row saying why."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    partial_path = out_path.with_name(out_path.name + ".partial")
    with partial_path.open("w", newline="", encoding="utf-8") as out_file:
        writer = csv.writer(out_file)
        writer.writerow(CSV_COLUMNS)
        for grade in grades:
            if not grade.checkers:
                writer.writerow([grade.notebook, "", 0, grade.problem or "", "", grade.release or ""])
            for name, checker in _checker_columns(grade):
                writer.writerow([grade.notebook, name, int(checker.passed), checker.error or "",
                                 checker.in_return, grade.release])
    partial_path.replace(out_path)  # a reader never sees half a file
    return out_path


# --- command line -------------------------------------------------------------------


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.teaching.instructor",
        description=(
            "Instructor tools for the course notebooks: make student copies with the "
            "solutions removed, and grade the notebooks students return. "
            f"Needs the instructor-only packages: {INSTALL_HINT}"
        ),
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    student = commands.add_parser(
        "student",
        help="write student copies of the notebooks in a folder",
        description=(
            "Copy every *.ipynb in SRC_DIR (not recursive) into DEST_DIR, replacing each "
            f"'{BEGIN_SOLUTION}' ... '{END_SOLUTION}' block of a cell tagged "
            f"'{SOLUTION_TAG}' with '# YOUR CODE HERE' and 'pass', dropping cells tagged "
            f"'{REMOVE_IN_STUDENT_TAG}', clearing the outputs of solution and checker cells and linking each "
            "exercise to its chapter's solutions page."
        ),
    )
    student.add_argument("src_dir", metavar="SRC_DIR", help="folder of instructor notebooks")
    student.add_argument("dest_dir", metavar="DEST_DIR", help="folder to write the copies to")

    solutions = commands.add_parser(
        "solutions", help="write one solutions page (markdown) a notebook, for the book",
        description="Write DEST_DIR/<notebook>.md for every *.ipynb in SRC_DIR: the code of its solution cells.")
    solutions.add_argument("src_dir", metavar="SRC_DIR", help="folder of instructor notebooks")
    solutions.add_argument("dest_dir", metavar="DEST_DIR", help="folder to write the pages to")
    table = commands.add_parser("exercise-table", help="write the instructors' table of every exercise (markdown)")
    table.add_argument("out", metavar="FILE", help="file to write")

    grade = commands.add_parser(
        "grade",
        help="grade returned notebooks against the release and print a score table",
        description=(
            "Run every *.ipynb in SUBMISSIONS_DIR, each in a process of its own, with the "
            "checker cells of the released notebook it comes from (found by their ids) in "
            "place of its own, against course_lib.teaching.exercises imported afresh, on hidden inputs "
            "drawn from --seed. Print per notebook the checkers passed, the checker cells it "
            "had edited or lost and the other cells that raised. This runs the students' "
            "code: do it in a sandbox or container. The exit code is 0 whatever the scores; "
            "it is non-zero only when grading itself fails."
        ),
    )
    grade.add_argument(
        "submissions_dir", metavar="SUBMISSIONS_DIR", help="folder of returned notebooks"
    )
    grade.add_argument(
        "--release", metavar="DIR", default="notebooks",
        help="folder of the instructor's notebooks the returns come from (default notebooks)",
    )
    grade.add_argument(
        "--out", metavar="CSV",
        help="also write one row per checker to this CSV file, rewritten as each notebook is graded",
    )
    grade.add_argument(
        "--seed", metavar="N", type=int,
        help="seed of the checkers' hidden inputs (default: a new one, printed, to grade the same way again)",
    )
    grade.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=int,
        default=DEFAULT_TIMEOUT,
        help=f"longest a single cell may run before it is interrupted (default {DEFAULT_TIMEOUT})",
    )
    grade.add_argument(
        "--notebook-timeout", metavar="SECONDS", type=float, default=DEFAULT_NOTEBOOK_TIMEOUT,
        help=f"longest one notebook may run before its process and kernel are killed (default {DEFAULT_NOTEBOOK_TIMEOUT})",
    )
    grade.add_argument(
        "--memory-limit", metavar="GIB", type=float, default=DEFAULT_MEMORY_LIMIT_GIB,
        help="host memory one notebook's processes may hold together before they are killed "
             f"(default {DEFAULT_MEMORY_LIMIT_GIB:g})",
    )
    stamp = commands.add_parser(
        "stamp",
        help="give the exercise cells of notebooks their ids and nbgrader metadata",
        description="Write nbgrader's metadata (grade_id, solution, grade, locked, points) into the "
                    "exercise cells of each notebook, in place; sources and outputs stay as they are.",
    )
    stamp.add_argument("notebooks", metavar="NOTEBOOK", nargs="+", help="notebooks to stamp")
    run_graded_command = commands.add_parser("run-graded", help=argparse.SUPPRESS)
    run_graded_command.add_argument("graded_path", type=Path)
    run_graded_command.add_argument("folder", type=Path)
    run_graded_command.add_argument("summary_path", type=Path)
    run_graded_command.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT)
    execute = commands.add_parser(
        "execute",
        help="re-execute notebooks in place, saving their new outputs",
        description="Run each notebook top to bottom in a fresh kernel and save it; stop at the first error.",
    )
    execute.add_argument("notebooks", metavar="NOTEBOOK", nargs="+", help="notebooks to execute")
    execute.add_argument("--timeout", metavar="SECONDS", type=int, default=DEFAULT_TIMEOUT,
                         help=f"longest a single cell may run (default {DEFAULT_TIMEOUT})")
    return parser


def _grade_command(arguments) -> None:
    seed = arguments.seed if arguments.seed is not None else secrets.randbelow(2**31)
    print(f"hidden inputs from seed {seed} (--seed {seed} grades the same way again)", file=sys.stderr)

    def save(grades):
        latest = grades[-1]
        print(f"  {latest.notebook}: {latest.score}", file=sys.stderr)
        if arguments.out:
            write_csv(grades, arguments.out)

    grades = grade_folder(
        arguments.submissions_dir,
        arguments.release,
        seed=seed,
        timeout=arguments.timeout,
        notebook_timeout=arguments.notebook_timeout,
        memory_limit_gib=arguments.memory_limit,
        on_start=lambda path: print(f"grading {path.name} ...", file=sys.stderr),
        on_graded=save,
        grader_files=[arguments.out] if arguments.out else [],
    )
    print(format_table(grades))
    if arguments.out:
        print(f"wrote {arguments.out}")


def main(argv: list[str] | None = None) -> int:
    arguments = _build_parser().parse_args(argv)
    try:
        if arguments.command == "student":
            for path in make_student_copies(arguments.src_dir, arguments.dest_dir):
                print(f"wrote {path}")
        elif arguments.command == "solutions":
            for path in make_solutions_pages(arguments.src_dir, arguments.dest_dir):
                print(f"wrote {path}")
        elif arguments.command == "exercise-table":
            Path(arguments.out).parent.mkdir(parents=True, exist_ok=True)
            Path(arguments.out).write_text(exercise_table(), encoding="utf-8")
            print(f"wrote {arguments.out}")
        elif arguments.command == "execute":
            for path in arguments.notebooks:
                print(f"executing {path} ...", file=sys.stderr)
                execute_in_place([path], timeout=arguments.timeout)
        elif arguments.command == "stamp":
            for path in stamp_exercise_metadata(arguments.notebooks):
                print(f"stamped {path}")
        elif arguments.command == "run-graded":
            run_graded(arguments.graded_path, arguments.folder, arguments.timeout, arguments.summary_path)
        else:
            _grade_command(arguments)
    except (ImportError, OSError, ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
