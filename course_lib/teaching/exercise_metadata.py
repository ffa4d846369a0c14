"""The exercise convention of CONTRIBUTING.md, as the instructor tools read it, and the ids and
nbgrader metadata it gives each exercise cell.

A code cell tagged ``solution`` holds the answer between a line ``# BEGIN SOLUTION`` and a line
``# END SOLUTION``, and a code cell tagged ``checker`` calls one ``check_...`` function that raises
when the answer is wrong.

``nbformat`` and ``nbclient`` (and ``ipykernel`` to run notebooks) are instructor-only
dependencies, so the instructor tools import them inside the functions that need them
(:func:`import_instructor_dependency`).
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path


SOLUTION_TAG = "solution"
CHECKER_TAG = "checker"
BEGIN_SOLUTION = "# BEGIN SOLUTION"
END_SOLUTION = "# END SOLUTION"
EXERCISE_HEADING = re.compile(r"###\s+Exercise\s+(\d+)\.(\d+)\b")
TASK_ROLE, SOLUTION_ROLE, CHECKER_ROLE = "task", "solution", "checker"
NBGRADER_KEY = "nbgrader"
NBGRADER_SCHEMA_VERSION = 3
CHECKER_POINTS = 1
INSTALL_HINT = "pip install nbformat nbclient ipykernel psutil"


def import_instructor_dependency(module_name: str):
    try:
        return importlib.import_module(module_name)
    except ImportError as error:
        raise ImportError(
            f"course_lib.teaching.instructor needs {module_name}, an instructor-only dependency "
            f"that is not installed. Install it with: {INSTALL_HINT}"
        ) from error


def cell_tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def notebooks_in(folder: str | Path) -> list[Path]:
    """The ``*.ipynb`` files directly in ``folder``, sorted; an error if there are none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder")
    notebooks = sorted(folder.glob("*.ipynb"))
    if not notebooks:
        raise FileNotFoundError(f"{folder} holds no *.ipynb notebooks")
    return notebooks


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
        tags = cell_tags(cell)
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


def stamp(notebook, name: str) -> bool:
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
    nbformat = import_instructor_dependency("nbformat")
    changed = []
    for path in map(Path, paths):
        notebook = nbformat.read(path, as_version=4)
        if stamp(notebook, path.name):
            nbformat.write(notebook, path)
            changed.append(path)
    return changed


def cell_grade_id(cell) -> str | None:
    return cell.get("metadata", {}).get(NBGRADER_KEY, {}).get("grade_id")
