"""The instructor's side of grading: which student returned what, the table of scores, the
gradebook CSV and a feedback page per student and assignment.

Returns are read in nbgrader's layout, ``SUBMISSIONS/<student>/<assignment>/*.ipynb`` (or the
``submitted/`` folder of an nbgrader course holding it), or from one flat folder whose files
are named ``<student>_<released notebook>`` (``alice_01_weighted_sum.ipynb``: student
``alice``); a flat file named otherwise is its own student (its name without ``.ipynb``).

Everything written here is written atomically (a new file, then renamed over the old one, so that a
reader never sees half a file and a symbolic link planted at the path is replaced, not
followed) into the grader's output folder, which no sandbox sees.
"""

from __future__ import annotations

import csv
import html
import io
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ...core.benchmarking import code_commit
from .results import AS_RELEASED, CheckerResult, NotebookGrade

NBGRADER_SUBMITTED = "submitted"
UNSAFE_NAME_CHARACTERS = re.compile(r"[^A-Za-z0-9._-]+")
CHECKER_ID = re.compile(r"exercise_(\d+)_(\d+)_checker(?:_(\d+))?$")
FEEDBACK_DIR = "feedback"


@dataclass(frozen=True)
class Return:
    """One file a student returned."""

    path: Path
    student: str | None  # None: to be read from a flat folder's file name once its release is known
    assignment: str | None  # nbgrader's assignment folder; None in a flat folder (the released notebook's name)


def find_returns(folder: str | Path) -> list[Return]:
    """Every file returned in ``folder`` (hidden files aside), in nbgrader's layout or flat,
    sorted by student, assignment and name; an error if there is none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder")
    if (folder / NBGRADER_SUBMITTED).is_dir():
        folder = folder / NBGRADER_SUBMITTED
    visible = [path for path in sorted(folder.iterdir()) if not path.name.startswith(".")]
    returns = [Return(path, None, None) for path in visible if path.is_file()]
    for student in (path for path in visible if path.is_dir()):
        for assignment in (path for path in sorted(student.iterdir()) if path.is_dir() and not path.name.startswith(".")):
            returns += [Return(path, student.name, assignment.name) for path in sorted(assignment.iterdir())
                        if path.is_file() and not path.name.startswith(".")]
    if not any(found.path.suffix == ".ipynb" for found in returns):
        raise FileNotFoundError(f"{folder} holds no *.ipynb notebooks, flat or as submitted/<student>/<assignment>/")
    return returns


def student_from_file_name(file_name: str, released_name: str | None) -> str:
    """A flat folder's student: what comes before ``_<released notebook>`` in the file name,
    else the file name without ``.ipynb``."""
    suffix = f"_{released_name}" if released_name else None
    if suffix and file_name.endswith(suffix) and len(file_name) > len(suffix):
        return file_name[: -len(suffix)]
    return file_name.removesuffix(".ipynb")


def safe_name(name: str) -> str:
    """``name`` as one file name: letters, digits, ``.``, ``_`` and ``-`` (never ``..``)."""
    cleaned = UNSAFE_NAME_CHARACTERS.sub("_", name).strip(".")
    return cleaned or "_"


def exercise_column(grade_id: str) -> str:
    """``exercise_1_2_checker`` -> ``1.2`` (a second checker of it: ``1.2#2``)."""
    match = CHECKER_ID.match(grade_id)
    if not match:
        return grade_id
    return f"{match.group(1)}.{match.group(2)}" + (f"#{match.group(3)}" if match.group(3) else "")


def write_atomically(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a new file renamed over it: a symbolic link at ``path``
    is replaced, never followed, and no reader sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8", newline="") as out:
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
    return path


def gradebook_csv(grades, seed: int | None, commit: str) -> str:
    """The gradebook: a row per student and assignment (or file that could not be graded), a
    column per exercise (1 passed, 0 not, empty: not in that assignment), the score, the most
    it could be, the problem or tampering found, the seed and the course's commit."""
    columns: list[str] = []
    for grade in grades:
        for checker in grade.checkers:
            if exercise_column(checker.grade_id) not in columns:
                columns.append(exercise_column(checker.grade_id))
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["student", "assignment", "notebook", *columns, "score", "max", "problem", "seed", "commit"])
    for grade in grades:
        marks = {exercise_column(checker.grade_id): int(checker.passed) for checker in grade.checkers}
        writer.writerow([grade.student, grade.assignment, grade.notebook, *(marks.get(column, "") for column in columns),
                         grade.passed, grade.total, grade.problem or "", "" if seed is None else seed, commit])
    return out.getvalue()


FEEDBACK_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}pre{{white-space:pre-wrap;background:#f6f6f6;
padding:.5em}}.passed{{color:#1a7f37}}.failed{{color:#b42318}}</style></head>
<body><h1>{title}</h1>
<p><strong>Score: {score}</strong>{problem}</p>
{checkers}
{cells}
<p><small>Graded from the course's commit {commit}, hidden inputs from seed {seed}.</small></p>
</body></html>
"""


def feedback_page(grade, seed: int | None, commit: str) -> str:
    """One return's feedback as HTML: each checker's verdict with its whole message (the
    checkers' hints included), the cells outside the checkers that raised, and any problem."""
    escape = html.escape
    checkers = []
    for checker in grade.checkers:
        verdict = "passed" if checker.passed else "failed"
        note = "" if checker.in_return == "as released" else f" (your checker cell: {escape(checker.in_return)})"
        message = checker.message or checker.error
        checkers.append(f"<h2>Exercise {escape(exercise_column(checker.grade_id))}: <code>{escape(checker.label)}</code> "
                        f"<span class=\"{verdict}\">{verdict}</span>{note}</h2>"
                        + (f"<pre>{escape(message)}</pre>" if message else ""))
    cells = "".join(f"<li>cell {cell.cell_index}: <code>{escape(cell.error)}</code></li>" for cell in grade.errored_cells)
    return FEEDBACK_PAGE.format(
        title=escape(f"{grade.assignment or grade.notebook} — {grade.student}"),
        score=escape(grade.score),
        problem=f"</p><p><strong>Problem:</strong> {escape(grade.problem)}" if grade.problem else "",
        checkers="\n".join(checkers),
        cells=f"<h2>Other cells that raised</h2><ul>{cells}</ul>" if cells else "",
        commit=escape(commit), seed=escape(str(seed)))


def feedback_path(out_folder: Path, grade) -> Path:
    """``<out_folder>/feedback/<student>/<assignment>.html``."""
    assignment = grade.assignment or Path(grade.notebook).stem
    return Path(out_folder) / FEEDBACK_DIR / safe_name(grade.student or "unknown") / f"{safe_name(assignment)}.html"


PASSED_MARK = "✓"
FAILED_MARK = "✗"


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


def format_table(grades: list[NotebookGrade]) -> str:
    """A plain-text table for the instructor: one row per return with its student, assignment,
    score, ✓/✗ per checker, the checker cells the return had edited or lost, and any problem.
    Checkers are columns, in order of first appearance, so copies of one notebook line up; a
    notebook without a column's checker leaves it blank. What the return's own cells printed or
    raised is left to its feedback page, seen by its student alone."""
    checker_names: list[str] = []
    for grade in grades:
        for name, _ in _checker_columns(grade):
            if name not in checker_names:
                checker_names.append(name)

    header = ["student", "assignment", "score", *checker_names, "checker cells changed", "problem"]
    rows = [header]
    for grade in grades:
        marks = {name: PASSED_MARK if checker.passed else FAILED_MARK for name, checker in _checker_columns(grade)}
        rows.append([grade.student or "", grade.assignment or grade.notebook, grade.score,
                     *(marks.get(name, "") for name in checker_names), _changed_checkers(grade), grade.problem or ""])

    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = [
        "  ".join(text.ljust(width) for text, width in zip(row, widths)).rstrip() for row in rows
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


GRADEBOOK_FILE = "gradebook.csv"


def write_gradebook(grades: list[NotebookGrade], out_dir: str | Path, seed: int | None,
                    commit: str | None = None) -> Path:
    """``out_dir/gradebook.csv`` (:func:`gradebook_csv`) and, per student and assignment, a feedback
    page (``out_dir/feedback/<student>/<assignment>.html``) and the graded notebook beside it
    (``.ipynb``, where the return was run), each written atomically."""
    out_dir = Path(out_dir)
    commit = commit or code_commit()
    for grade in grades:
        page = feedback_path(out_dir, grade)
        write_atomically(page, feedback_page(grade, seed, commit))
        if grade.feedback_notebook is not None:
            write_atomically(page.with_suffix(".ipynb"), grade.feedback_notebook)
    return write_atomically(out_dir / GRADEBOOK_FILE, gradebook_csv(grades, seed, commit))
