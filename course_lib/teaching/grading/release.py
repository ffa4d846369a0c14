"""The release a return is graded against: the checker cells of the instructor's notebooks, by
stable id, and which released notebook a return comes from."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..exercise_metadata import (CHECKER_ROLE, cell_grade_id, cell_tags, exercise_cells, import_instructor_dependency,
                                 notebooks_in)


CHECKER_CALL = re.compile(r"(check_\w+)\(")


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


def _checker_label(source: str, grade_id: str) -> str:
    call = CHECKER_CALL.search(source)
    return call.group(1) if call else grade_id


def load_release(folder: str | Path) -> list[ReleasedNotebook]:
    """The checker cells of every notebook in the instructor's ``folder``, by stable id."""
    nbformat = import_instructor_dependency("nbformat")
    release = []
    for path in notebooks_in(folder):
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
                    tags=tuple(cell_tags(cell)),
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


def match_release(notebook, file_name: str, release: list[ReleasedNotebook]) -> ReleasedNotebook | None:
    """The released notebook a return comes from: the one sharing most exercise ids with
    it (from nbgrader's metadata, or from its ``### Exercise N.M`` headings when a copy lost
    the metadata), else the one whose name ends the return's file name (``alice_01_x.ipynb``)."""
    ids = {cell_grade_id(cell) for cell in notebook.cells} if notebook is not None else set()
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
