"""Grading of the notebooks students return: each return run in a sandbox of its own with the
release's checkers, its answers judged apart, and what it did checked against what the
checkers recorded."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Callable

from ..exercise_metadata import import_instructor_dependency
from ..execution import DEFAULT_TIMEOUT
from .gradebook import Return, find_returns, student_from_file_name
from .graded_notebook import executed_outputs, feedback_notebook, with_released_checkers
from .package_copy import PACKAGE_DIR, fresh_package, package_snapshot
from .release import ReleasedNotebook, load_release, match_release
from .results import MISSING, CellError, CheckerResult, NotebookGrade, error_line
from .sandbox import Sandbox, find_sandbox, run_limited
from .verdicts import out_of_process_checkers, out_of_process_verdicts


DEFAULT_NOTEBOOK_TIMEOUT = 3600
DEFAULT_MEMORY_LIMIT_GIB = 16.0  # host memory of one return's processes (its kernel included)


def _read_return(path: Path):
    """(notebook, None) or (None, why it cannot be graded)."""
    nbformat = import_instructor_dependency("nbformat")
    try:
        notebook = nbformat.read(path, as_version=4)
        nbformat.validate(notebook)
    except Exception as error:  # truncated JSON, another kind of file, an invalid notebook
        return None, f"not a readable notebook: {error_line(type(error).__name__, str(error))}"
    return notebook, None


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


# Errors a return's cell gets when it reaches for what the sandbox keeps from it: the package,
# the system, a folder it may not write. A return that meets one is marked and scores nothing.
SANDBOX_REFUSALS = ("[Errno 30] Read-only file system", "[Errno 13] Permission denied",
                    "[Errno 1] Operation not permitted")


def _run_return(graded, scratch: Path, package_copy: Path, sandbox: Sandbox, timeout: int,
                notebook_timeout: float, memory_limit: float | None) -> tuple[int | None, str | None]:
    """Execute the graded notebook in the sandbox: it sees its package copy and itself read-only,
    its working folder and the folder its checkers write to; nothing else of the grader's."""
    nbformat = import_instructor_dependency("nbformat")
    graded_path = scratch / "graded.ipynb"
    nbformat.write(graded, graded_path)
    work, out = scratch / "work", scratch / "out"  # the kernel's folder; the checkers' results
    command, environment = sandbox.command(
        [sys.executable, "-m", "course_lib.teaching.instructor", "run-graded", str(graded_path), str(work),
         str(out / SUMMARY_FILE), str(out / EXECUTED_FILE), "--timeout", str(timeout),
         *(["--sandboxed"] if sandbox.executable else [])],
        read_only=[package_copy.parent, graded_path], writable=[work, out], cwd=work,
        environment={"PYTHONPATH": str(package_copy.parent)})
    return run_limited(command, notebook_timeout, scratch / "log.txt", environment=environment,
                       memory_limit=memory_limit, limit_name="the limit for one notebook")


RESULTS_FILE, SUMMARY_FILE, EXECUTED_FILE = "checkers.jsonl", "summary.json", "executed.ipynb"


def grade_notebook(
    path: str | Path,
    release: list[ReleasedNotebook],
    *,
    seed: int | None = None,
    timeout: int = DEFAULT_TIMEOUT,
    notebook_timeout: float = DEFAULT_NOTEBOOK_TIMEOUT,
    package: dict[str, bytes] | None = None,
    memory_limit_gib: float | None = DEFAULT_MEMORY_LIMIT_GIB,
    sandbox: Sandbox | None = None,
    student: str | None = None,
    assignment: str | None = None,
    grader_paths=(),
) -> NotebookGrade:
    """Grade the returned notebook at ``path`` against the released notebook it comes from.

    The return runs as the student left it, but for its checker cells: every checker of
    the release runs, from the release's source, against ``course_lib.teaching.exercises``
    imported afresh, on hidden inputs drawn from ``seed`` (None: the checkers' own random
    inputs). A checker passes only when it returned. ``timeout`` bounds each cell (the cell
    is interrupted) and each answer judged by its own process; ``notebook_timeout`` the whole
    run, past which the sandbox and everything in it are killed, as they are once they hold
    more than ``memory_limit_gib`` GiB of host memory together (None: no limit).

    The return runs in ``sandbox`` (:func:`find_sandbox` when None), in a scratch folder of its
    own, with a read-only copy of the package made from ``package`` (a :func:`package_snapshot` of it,
    taken once for a whole class; now, if None). ``student`` and ``assignment`` (None: from the
    file name, as :func:`student_from_file_name` reads it, and the released notebook) label it.
    A cell that meets the sandbox's walls (SANDBOX_REFUSALS), or names one of ``grader_paths``
    (the release, the other returns) in its error, marks the return tampered: it scores nothing.
    """
    path = Path(path)
    sandbox = sandbox or find_sandbox()
    notebook, problem = _read_return(path)
    released = match_release(notebook, path.name, release)
    grade = NotebookGrade(notebook=path.name, release=released.name if released else None, problem=problem,
                          student=student or student_from_file_name(path.name, released.name if released else None),
                          assignment=assignment or (Path(released.name).stem if released else None))
    if released is None:
        grade.problem = problem or "matches no notebook of the release"
        return grade
    if notebook is None:
        grade.checkers = [CheckerResult(checker.grade_id, checker.label, False, problem, MISSING)
                          for checker in released.checkers]
        return grade

    package = package if package is not None else package_snapshot(PACKAGE_DIR)
    return_sources = [cell.source for cell in notebook.cells if cell.cell_type == "code"]
    kernels = out_of_process_checkers(released)
    memory_limit = None if memory_limit_gib is None else memory_limit_gib * 2**30
    # The scratch folder is the grader's: the sandbox sees only the parts of it named below.
    with tempfile.TemporaryDirectory(prefix="course_lib_grading_") as scratch:
        scratch = Path(scratch)
        package_copy = fresh_package(package, scratch)
        (scratch / "work").mkdir()
        (scratch / "out").mkdir()
        results_path, summary_path = scratch / "out" / RESULTS_FILE, scratch / "out" / SUMMARY_FILE
        executed_path = scratch / "out" / EXECUTED_FILE
        graded, return_index, in_return = with_released_checkers(notebook, released, seed, results_path, package_copy)
        exit_code, killed = _run_return(graded, scratch, package_copy, sandbox, timeout, notebook_timeout,
                                        memory_limit)
        # The return's sandbox, and every process in it, is gone: what it left is only read now.
        results, repeated = _read_results(results_path)
        verdicts = out_of_process_verdicts(return_sources, kernels, seed, scratch, package, sandbox, timeout,
                                           memory_limit)
        if killed:
            grade.problem = killed
        elif not summary_path.is_file() or summary_path.is_symlink():
            last_line = (scratch / "log.txt").read_text(errors="replace").strip().splitlines()[-1:]
            grade.problem = f"the grading process failed (exit code {exit_code}): {' '.join(last_line)[:200]}"
        else:
            _read_summary(grade, json.loads(summary_path.read_text(encoding="utf-8")), return_index, results, repeated)
        results.update(verdicts)  # a kernel's or PyTorch answer's verdict comes from its own process, whatever
        # the notebook wrote
        outputs = executed_outputs(executed_path, len(graded.cells))
    refused = [f"cell {cell.cell_index}: {cell.error}" for cell in grade.errored_cells
               if any(refusal in cell.error for refusal in (*SANDBOX_REFUSALS, *map(str, grader_paths)))]
    if refused and not grade.problem:
        grade.problem = "tampered: it reached for what the sandbox keeps from returns (" + "; ".join(refused[:3]) + ")"
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
        message = result.get("message") if result is not None and not in_return[checker.grade_id] == MISSING else None
        grade.checkers.append(CheckerResult(checker.grade_id, checker.label, passed, error,
                                            in_return[checker.grade_id], message or error))
    grade.feedback_notebook = feedback_notebook(graded, outputs, released, grade)
    return grade


def _read_summary(grade: NotebookGrade, summary: dict, return_index: list, results: dict, repeated: list) -> None:
    """What the grading process saw of the run (each cell's error, what ran), checked against
    the checkers' own records: a record no checker could have written marks the return tampered."""
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
    if summary.get("left_running"):  # killed with the sandbox; a return has no business leaving them
        grade.problem = f"tampered: it left processes running after its notebook ended: {summary['left_running'][:3]}"
    if repeated or unexpected or contradicted:
        grade.problem = ("tampered: the checkers' results were written by something else than the checkers "
                         f"(repeated: {sorted(set(repeated))[:5]}; of checkers that did not run: "
                         f"{sorted(unexpected)[:5]}; passes of checkers whose cell raised: "
                         f"{sorted(contradicted)[:5]})")


def grade_folder(
    folder: str | Path,
    release_dir: str | Path,
    *,
    seed: int | None = None,
    timeout: int = DEFAULT_TIMEOUT,
    notebook_timeout: float = DEFAULT_NOTEBOOK_TIMEOUT,
    on_start: Callable[[Path], None] | None = None,
    on_graded: Callable[[list[NotebookGrade]], None] | None = None,
    memory_limit_gib: float | None = DEFAULT_MEMORY_LIMIT_GIB,
    sandbox: Sandbox | None = None,
    jobs: int = 1,
) -> list[NotebookGrade]:
    """Grade every return in ``folder`` (nbgrader's ``submitted/<student>/<assignment>/`` or flat:
    :func:`find_returns`) against the notebooks of ``release_dir``, ``jobs`` at a time, each in
    ``sandbox`` (:func:`find_sandbox` when None). ``on_start`` sees each path as it starts,
    ``on_graded`` the grades so far, in the returns' order, after each. Other files (but hidden
    ones) get a row saying they were not graded, and a notebook whose grading fails for any
    reason gets a row saying why: the rest of the folder is graded all the same."""
    from concurrent.futures import ThreadPoolExecutor

    sandbox = sandbox or find_sandbox()
    release = load_release(release_dir)
    returns = find_returns(folder)
    package = package_snapshot(PACKAGE_DIR)  # before any return runs: every copy is of the package as it is now
    grader_paths = (Path(folder).resolve(), Path(release_dir).resolve())  # which no return sees

    def grade_return(found: Return) -> NotebookGrade:
        if on_start is not None:
            on_start(found.path)
        if found.path.suffix != ".ipynb":
            return NotebookGrade(notebook=found.path.name, student=found.student or found.path.name,
                                 assignment=found.assignment, problem="not graded: only *.ipynb notebooks are")
        try:
            return grade_notebook(found.path, release, seed=seed, timeout=timeout, notebook_timeout=notebook_timeout,
                                  package=package, memory_limit_gib=memory_limit_gib, sandbox=sandbox,
                                  student=found.student, assignment=found.assignment, grader_paths=grader_paths)
        except Exception as error:  # a fault of the grader's, not the student's: say it, go on
            return NotebookGrade(notebook=found.path.name, student=found.student, assignment=found.assignment,
                                 problem=f"grading failed: {error_line(type(error).__name__, str(error))}")

    grades = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:  # each return's work is in processes of its own
        for grade in pool.map(grade_return, returns):
            grades.append(grade)
            if on_graded is not None:
                on_graded(grades)
    return grades
