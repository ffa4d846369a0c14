"""Student copies of the course notebooks, and grading of the copies students return.

Both follow the exercise convention of CONTRIBUTING.md: a code cell tagged ``solution``
holds the answer between a line ``# BEGIN SOLUTION`` and a line ``# END SOLUTION``, and
a code cell tagged ``checker`` calls one ``check_...`` function that raises when the
answer is wrong.

Command line::

    python -m course_lib.instructor student SRC_DIR DEST_DIR
    python -m course_lib.instructor grade SUBMISSIONS_DIR [--out CSV] [--timeout SECONDS]

``nbformat`` and ``nbclient`` (and ``ipykernel`` to run notebooks) are instructor-only
dependencies, so they are imported inside the functions that need them.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

SOLUTION_TAG = "solution"
CHECKER_TAG = "checker"
HIDE_INPUT_TAG = "hide-input"
REMOVE_IN_STUDENT_TAG = "remove-in-student"
BEGIN_SOLUTION = "# BEGIN SOLUTION"
END_SOLUTION = "# END SOLUTION"
STUDENT_PLACEHOLDER = ("# YOUR CODE HERE", "pass")
CHECKER_CALL = re.compile(r"(check_\w+)\(")
KERNEL_NAME = "python3"
DEFAULT_TIMEOUT = 600
INSTALL_HINT = "pip install nbformat nbclient ipykernel"
PASSED_MARK = "✓"
FAILED_MARK = "✗"


def _import_instructor_dependency(module_name: str):
    try:
        return importlib.import_module(module_name)
    except ImportError as error:
        raise ImportError(
            f"course_lib.instructor needs {module_name}, an instructor-only dependency "
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


def make_student_copy(src_path: str | Path, dest_path: str | Path) -> Path:
    """Write the student version of the notebook ``src_path`` to ``dest_path``.

    Solutions are replaced by ``# YOUR CODE HERE`` / ``pass``, solution cells lose their
    ``hide-input`` tag, cells tagged ``remove-in-student`` are dropped and code outputs
    and execution counts are cleared. Raises ValueError, naming the notebook and cell
    index, for a solution cell whose markers are missing or malformed, and for any
    ``# BEGIN SOLUTION`` line left outside a solution cell.
    """
    nbformat = _import_instructor_dependency("nbformat")
    src_path, dest_path = Path(src_path), Path(dest_path)
    notebook = nbformat.read(src_path, as_version=4)

    kept_cells = []
    for cell_index, cell in enumerate(notebook.cells):
        tags = _tags(cell)
        if REMOVE_IN_STUDENT_TAG in tags:
            continue
        if cell.cell_type == "code":
            if SOLUTION_TAG in tags:
                where = f"{src_path.name}, cell {cell_index}"
                cell.source = _replace_solution_blocks(cell.source, where)
                cell.metadata["tags"] = [tag for tag in tags if tag != HIDE_INPUT_TAG]
            cell.outputs = []
            cell.execution_count = None
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


# --- grading ------------------------------------------------------------------------


@dataclass
class CheckerResult:
    """One checker cell of a graded notebook."""

    cell_index: int
    label: str  # the check_... function the cell calls
    passed: bool
    error: str | None = None  # first line of "ename: evalue" when it failed


@dataclass
class CellError:
    """A code cell outside the checkers that raised."""

    cell_index: int
    error: str  # first line of "ename: evalue"


@dataclass
class NotebookGrade:
    """The result of executing one notebook."""

    notebook: str  # file name
    checkers: list[CheckerResult] = field(default_factory=list)
    errored_cells: list[CellError] = field(default_factory=list)
    aborted: str | None = None  # why execution stopped early: the kernel died

    @property
    def passed(self) -> int:
        return sum(checker.passed for checker in self.checkers)

    @property
    def total(self) -> int:
        return len(self.checkers)

    @property
    def score(self) -> str:
        return f"{self.passed}/{self.total}"


def _error_line(ename: str, evalue: str) -> str:
    text = f"{ename}: {evalue}" if evalue else ename
    return text.split("\n", 1)[0]


def _cell_error(cell) -> str | None:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return _error_line(output.get("ename", ""), output.get("evalue", ""))
    return None


def _checker_label(source: str, cell_index: int) -> str:
    call = CHECKER_CALL.search(source)
    return call.group(1) if call else f"cell {cell_index}"


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
    that raises stops it, so a broken notebook is never saved.
    """
    nbformat = _import_instructor_dependency("nbformat")
    for path in map(Path, paths):
        notebook = nbformat.read(path, as_version=4)
        _execute(notebook, path.parent, timeout, allow_errors=False)
        nbformat.write(notebook, path)


def grade_notebook(path: str | Path, timeout: int = DEFAULT_TIMEOUT) -> NotebookGrade:
    """Execute the notebook at ``path`` and report on its checker cells.

    The notebook runs in a ``python3`` kernel from its own folder, so relative paths work,
    and keeps going after errors. ``timeout`` is in seconds per cell: a cell that runs
    longer is interrupted and counts as raising. A checker passes when it ran without
    raising. If the kernel dies, the cells it did not reach count as not run.
    """
    nbformat = _import_instructor_dependency("nbformat")
    nbclient = _import_instructor_dependency("nbclient")
    path = Path(path)
    notebook = nbformat.read(path, as_version=4)
    # A returned notebook carries the student's own outputs; only this run's may count.
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None

    grade = NotebookGrade(notebook=path.name)
    try:
        _execute(notebook, path.parent, timeout, allow_errors=True)
    except nbclient.exceptions.DeadKernelError as error:
        grade.aborted = _error_line(type(error).__name__, str(error))

    for cell_index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        error = _cell_error(cell)
        if CHECKER_TAG in _tags(cell):
            ran = cell.execution_count is not None
            if not ran and error is None:
                error = f"not run ({grade.aborted})" if grade.aborted else "not run"
            grade.checkers.append(
                CheckerResult(
                    cell_index=cell_index,
                    label=_checker_label(cell.source, cell_index),
                    passed=ran and error is None,
                    error=error,
                )
            )
        elif error is not None:
            grade.errored_cells.append(CellError(cell_index=cell_index, error=error))
    return grade


def grade_folder(
    folder: str | Path,
    timeout: int = DEFAULT_TIMEOUT,
    on_start: Callable[[Path], None] | None = None,
) -> list[NotebookGrade]:
    """Grade every ``*.ipynb`` in ``folder``, sorted by name; ``on_start`` sees each path first."""
    grades = []
    for notebook in _notebooks_in(folder):
        if on_start is not None:
            on_start(notebook)
        grades.append(grade_notebook(notebook, timeout=timeout))
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


def _errors_outside_checkers(grade: NotebookGrade) -> str:
    errors = [f"cell {cell.cell_index}: {cell.error}" for cell in grade.errored_cells]
    if grade.aborted:
        errors.append(f"aborted: {grade.aborted}")
    return "; ".join(errors)


def format_table(grades: list[NotebookGrade]) -> str:
    """A plain-text table: one row per notebook with its score, ✓/✗ per checker and the
    cells outside the checkers that raised. Checkers are columns, in order of first
    appearance, so copies of one notebook line up; a notebook without a column's
    checker leaves it blank."""
    checker_names: list[str] = []
    for grade in grades:
        for name, _ in _checker_columns(grade):
            if name not in checker_names:
                checker_names.append(name)

    header = ["notebook", "score", *checker_names, "errors outside checkers"]
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
                _errors_outside_checkers(grade),
            ]
        )

    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = [
        "  ".join(text.ljust(width) for text, width in zip(row, widths)).rstrip() for row in rows
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def write_csv(grades: list[NotebookGrade], out_path: str | Path) -> Path:
    """One row per checker: notebook, checker, passed (1 or 0), error."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with out_path.open("w", newline="", encoding="utf-8") as out_file:
        writer = csv.writer(out_file)
        writer.writerow(["notebook", "checker", "passed", "error"])
        for grade in grades:
            for name, checker in _checker_columns(grade):
                writer.writerow([grade.notebook, name, int(checker.passed), checker.error or ""])
    return out_path


# --- command line -------------------------------------------------------------------


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.instructor",
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
            f"'{REMOVE_IN_STUDENT_TAG}' and clearing outputs."
        ),
    )
    student.add_argument("src_dir", metavar="SRC_DIR", help="folder of instructor notebooks")
    student.add_argument("dest_dir", metavar="DEST_DIR", help="folder to write the copies to")

    grade = commands.add_parser(
        "grade",
        help="run returned notebooks and print a score table",
        description=(
            "Execute every *.ipynb in SUBMISSIONS_DIR and print, per notebook, how many "
            f"cells tagged '{CHECKER_TAG}' passed and which other cells raised. This runs "
            "the students' code: do it in a sandbox or container. The exit code is 0 "
            "whatever the scores; it is non-zero only when grading itself fails."
        ),
    )
    grade.add_argument(
        "submissions_dir", metavar="SUBMISSIONS_DIR", help="folder of returned notebooks"
    )
    grade.add_argument(
        "--out", metavar="CSV", help="also write one row per checker to this CSV file"
    )
    grade.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=int,
        default=DEFAULT_TIMEOUT,
        help=f"longest a single cell may run before it is interrupted (default {DEFAULT_TIMEOUT})",
    )
    execute = commands.add_parser(
        "execute",
        help="re-execute notebooks in place, saving their new outputs",
        description="Run each notebook top to bottom in a fresh kernel and save it; stop at the first error.",
    )
    execute.add_argument("notebooks", metavar="NOTEBOOK", nargs="+", help="notebooks to execute")
    execute.add_argument("--timeout", metavar="SECONDS", type=int, default=DEFAULT_TIMEOUT,
                         help=f"longest a single cell may run (default {DEFAULT_TIMEOUT})")
    return parser


def main(argv: list[str] | None = None) -> int:
    arguments = _build_parser().parse_args(argv)
    try:
        if arguments.command == "student":
            for path in make_student_copies(arguments.src_dir, arguments.dest_dir):
                print(f"wrote {path}")
        elif arguments.command == "execute":
            for path in arguments.notebooks:
                print(f"executing {path} ...", file=sys.stderr)
                execute_in_place([path], timeout=arguments.timeout)
        else:
            grades = grade_folder(
                arguments.submissions_dir,
                timeout=arguments.timeout,
                on_start=lambda path: print(f"grading {path.name} ...", file=sys.stderr),
            )
            print(format_table(grades))
            if arguments.out:
                print(f"wrote {write_csv(grades, arguments.out)}")
    except (ImportError, OSError, ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
