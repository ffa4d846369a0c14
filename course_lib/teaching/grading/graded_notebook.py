"""The notebook grading runs: the return with the release's checker cells in place of its own,
each calling course_lib/teaching/fresh_checker.py; its run, in a process of its own; and the graded
notebook handed back to the student as feedback."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

from ..exercise_metadata import CHECKER_TAG, cell_grade_id, cell_tags, exercise_cells, import_instructor_dependency
from ..execution import execute_notebook
from .gradebook import exercise_column
from .package_copy import PACKAGE_DIR
from .release import ReleasedChecker, ReleasedNotebook
from .results import AS_RELEASED, EDITED, MISSING, NotebookGrade, error_line


CHECKER_ID_KEY = "course_lib_checker"  # the grade id of a released checker cell, in the graded notebook
GRADED_CHECKER_SOURCE = """\
# The released checker {grade_id}, run by course_lib.teaching.instructor (see course_lib/teaching/fresh_checker.py).
__course_grader = {{"__name__": "course_lib_fresh_checker"}}
exec(compile(open({runner!r}, encoding="utf-8").read(), {runner!r}, "exec"), __course_grader)
__course_grader["run_checker"](globals(), {source!r}, {grade_id!r}, {seed!r}, {results!r}, {package!r})
"""
FRESH_CHECKER_FILE = Path(__file__).resolve().parents[1] / "fresh_checker.py"
FRESH_CHECKER_IN_PACKAGE = FRESH_CHECKER_FILE.relative_to(PACKAGE_DIR)  # where a copy of the package has it


def with_released_checkers(notebook, released: ReleasedNotebook, seed: int | None, results_path: Path,
                     package_dir: Path = PACKAGE_DIR):
    """The return with its checker cells replaced by the release's, each after its
    solution (at the end if the return lost that too). Returns the notebook, the
    return's index of each of its cells (None for a released checker) and what the
    return had done to each checker cell."""
    nbformat_v4 = import_instructor_dependency("nbformat.v4")
    by_id = {checker.grade_id: checker for checker in released.checkers}
    in_return = {grade_id: MISSING for grade_id in by_id}
    to_place: dict[str | None, list[ReleasedChecker]] = {}
    for checker in released.checkers:
        to_place.setdefault(checker.follows, []).append(checker)

    def released_cell(checker):
        source = GRADED_CHECKER_SOURCE.format(
            grade_id=checker.grade_id, runner=str(package_dir / FRESH_CHECKER_IN_PACKAGE),
            source=checker.source, seed=seed, results=str(results_path), package=str(package_dir))
        return nbformat_v4.new_code_cell(source,
                                         metadata={"tags": list(checker.tags), CHECKER_ID_KEY: checker.grade_id})

    try:  # a copy that lost nbgrader's metadata: the ids its headings give
        derived = {cell.cell_index: cell.grade_id for cell in exercise_cells(notebook, "the return")}
    except ValueError:
        derived = {}
    cells, return_index = [], []
    for cell_index, cell in enumerate(notebook.cells):
        grade_id = cell_grade_id(cell) or derived.get(cell_index)
        if grade_id in by_id or (cell.cell_type == "code" and CHECKER_TAG in cell_tags(cell)):
            if in_return.get(grade_id) == MISSING:
                checker = by_id[grade_id]
                same = cell.source.strip() == checker.source.strip() and tuple(cell_tags(cell)) == checker.tags
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


def _cell_error(cell) -> str | None:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return error_line(output.get("ename", ""), output.get("evalue", ""))
    return None


def _processes_left(sandboxed: bool) -> list[str]:
    """In a sandbox (its own process namespace, whose first process is bwrap's): the command
    lines of the processes still running there but this one."""
    if not sandboxed:
        return []
    left = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) not in (1, os.getpid()):
            try:
                left.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip())
            except OSError:  # it ended meanwhile
                pass
    return left


def run_graded(graded_path: Path, folder: Path, timeout: int, summary_path: Path, executed_path: Path,
               sandboxed: bool = False) -> None:
    """Execute a graded notebook from ``folder``, going on past errors, and write each
    cell's error (or None), why execution stopped early if it did, and (``sandboxed``) the
    processes the notebook left running, to ``summary_path``; the notebook with its outputs to
    ``executed_path`` (for the student's feedback). Runs in a process of its own, killed at the
    grader's wall-clock limit."""
    nbformat = import_instructor_dependency("nbformat")
    nbclient = import_instructor_dependency("nbclient")
    notebook = nbformat.read(graded_path, as_version=4)
    aborted = None
    try:
        execute_notebook(notebook, folder, timeout, allow_errors=True)
    except nbclient.exceptions.DeadKernelError:
        aborted = "the kernel died"
    summary = {"errors": [_cell_error(cell) for cell in notebook.cells], "aborted": aborted,
               "checker_ids": [cell.metadata.get(CHECKER_ID_KEY) for cell in notebook.cells],
               "executed": [cell.get("execution_count") is not None for cell in notebook.cells],
               "left_running": _processes_left(sandboxed)}
    Path(summary_path).write_text(json.dumps(summary), encoding="utf-8")
    nbformat.write(notebook, executed_path)


FEEDBACK_NOTEBOOK_LIMIT = 64 * 2**20  # bytes: a return that printed more is handed back without its outputs


def executed_outputs(executed_path: Path, cell_count: int) -> list | None:
    """Each graded cell's outputs from the return's run, read once its sandbox is gone; None when
    the run left no readable notebook of those cells (killed, too large, or replaced by the return)."""
    nbformat = import_instructor_dependency("nbformat")
    if (executed_path.is_symlink() or not executed_path.is_file()
            or executed_path.stat().st_size > FEEDBACK_NOTEBOOK_LIMIT):
        return None
    try:
        executed = nbformat.read(executed_path, as_version=4)
        nbformat.validate(executed)
    except Exception:  # whatever the return left there, it is only feedback
        return None
    if len(executed.cells) != cell_count:
        return None
    return [cell.get("outputs", []) for cell in executed.cells]


def feedback_notebook(graded, outputs: list | None, released: ReleasedNotebook, grade: NotebookGrade) -> str:
    """The graded notebook, as nbgrader hands back its own: the return's cells with this run's
    outputs (``outputs``; None: none), each checker cell showing the release's source rather than
    the grader's call, after a first cell with the score and each checker's verdict. Those are the
    verdicts that count: a cell may have printed a pass that the answer's own process refused."""
    nbformat = import_instructor_dependency("nbformat")
    nbformat_v4 = import_instructor_dependency("nbformat.v4")
    sources = {checker.grade_id: checker.source for checker in released.checkers}
    # Indented lines: text from the return (an error message) stays text, not markdown.
    verdicts = [f"    {exercise_column(checker.grade_id)} {checker.label}: "
                + ("passed" if checker.passed else f"failed: {checker.error}") for checker in grade.checkers]
    problem = [f"**Problem:** {grade.problem}", ""] if grade.problem else []
    summary = nbformat_v4.new_markdown_cell("\n".join([f"# Graded: {grade.score}", "", *problem, *verdicts]))
    cells = [summary]
    for cell, cell_outputs in zip(graded.cells, outputs or [[]] * len(graded.cells)):
        cell = copy.deepcopy(cell)
        grade_id = cell.metadata.pop(CHECKER_ID_KEY, None)
        if grade_id in sources:
            cell.source = sources[grade_id]
        if cell.cell_type == "code":
            cell.outputs = cell_outputs
        cells.append(cell)
    return nbformat.writes(nbformat_v4.new_notebook(cells=cells, metadata=graded.metadata))
