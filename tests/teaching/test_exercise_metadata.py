import sys

import pytest

from course_lib.teaching.exercise_metadata import exercise_cells, nbgrader_metadata
from course_lib.teaching.student_copies import make_student_copy

nbformat = pytest.importorskip("nbformat")
notebook_v4 = pytest.importorskip("nbformat.v4")
pytest.importorskip("nbclient")
from instructor_notebooks import COURSE_NOTEBOOKS, checker_cell, exercise, new_code_cell  # noqa: E402


def test_missing_instructor_dependency_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "nbformat", None)
    with pytest.raises(ImportError, match="pip install nbformat nbclient ipykernel"):
        make_student_copy(tmp_path / "lesson.ipynb", tmp_path / "student.ipynb")


def test_exercise_cells_get_ids_from_their_exercise_number(tmp_path):
    notebook = notebook_v4.new_notebook(cells=[
        new_code_cell("x = 1"),
        *exercise("2.3", "def f():\n    # BEGIN SOLUTION\n    return 1\n    # END SOLUTION", "check(f)"),
    ])
    assert [(cell.cell_index, cell.grade_id) for cell in exercise_cells(notebook, "lesson.ipynb")] == [
        (1, "exercise_2_3_task"), (2, "exercise_2_3_solution"), (3, "exercise_2_3_checker")]


def test_a_checker_before_any_exercise_heading_is_an_error(tmp_path):
    notebook = notebook_v4.new_notebook(cells=[checker_cell("check(f)")])
    with pytest.raises(ValueError, match="lesson.ipynb, cell 0: a checker cell before any"):
        exercise_cells(notebook, "lesson.ipynb")


@pytest.mark.parametrize("notebook", COURSE_NOTEBOOKS, ids=lambda path: path.name)
def test_course_exercise_cells_carry_nbgrader_metadata(notebook):
    # After a new exercise: python -m course_lib.teaching.instructor stamp notebooks/*.ipynb
    read = nbformat.read(notebook, as_version=4)
    cells = exercise_cells(read, notebook.name)
    assert sum(cell.role == "checker" for cell in cells) >= 2  # the ramp: two kernel exercises a chapter at least
    for cell in cells:
        assert read.cells[cell.cell_index].metadata.get("nbgrader") == nbgrader_metadata(cell.role, cell.grade_id)
