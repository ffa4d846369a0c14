"""Which student returned what, the table of scores and the grader's files
(course_lib/teaching/grading/gradebook.py)."""

import csv
from pathlib import Path

import pytest

from course_lib.teaching.grading.gradebook import (exercise_column, find_returns, format_table, safe_name,
                                                   student_from_file_name, write_atomically, write_gradebook)
from course_lib.teaching.grading.results import CellError, CheckerResult, NotebookGrade


def touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}")
    return path


def test_nbgrader_layout_gives_student_and_assignment(tmp_path):
    touch(tmp_path / "submitted" / "alice" / "ch1" / "01_weighted_sum.ipynb")
    touch(tmp_path / "submitted" / "bob" / "ch1" / "01_weighted_sum.ipynb")  # same name, no collision
    touch(tmp_path / "submitted" / "bob" / "ch1" / ".ipynb_checkpoints" / "x.ipynb")
    found = find_returns(tmp_path)  # the course folder, or its submitted/ itself
    assert [(r.student, r.assignment, r.path.name) for r in found] == [
        ("alice", "ch1", "01_weighted_sum.ipynb"), ("bob", "ch1", "01_weighted_sum.ipynb")]
    assert find_returns(tmp_path / "submitted") == found


def test_a_flat_folder_names_the_student_before_the_released_notebook(tmp_path):
    touch(tmp_path / "alice_01_weighted_sum.ipynb")
    (found,) = find_returns(tmp_path)
    assert (found.student, found.assignment) == (None, None)  # read once its release is known
    assert student_from_file_name("alice_01_weighted_sum.ipynb", "01_weighted_sum.ipynb") == "alice"
    assert student_from_file_name("homework.ipynb", "01_weighted_sum.ipynb") == "homework"


def test_a_folder_without_notebooks_is_an_error(tmp_path):
    touch(tmp_path / "notes.txt")
    with pytest.raises(FileNotFoundError, match="no \\*.ipynb"):
        find_returns(tmp_path)


def test_names_from_returns_stay_one_file_name():
    assert safe_name("../../etc/passwd") == "_.._etc_passwd"  # no separator: one name in its folder
    assert safe_name("..") == "_"
    assert exercise_column("exercise_1_2_checker") == "1.2" and exercise_column("exercise_3_1_checker_2") == "3.1#2"


def test_an_atomic_write_replaces_a_planted_symlink_without_following_it(tmp_path):
    release = tmp_path / "release.ipynb"
    release.write_text("the release")
    out = tmp_path / "graded" / "gradebook.csv"
    out.parent.mkdir()
    out.symlink_to(release)
    write_atomically(out, "student,score\n")
    assert release.read_text() == "the release"
    assert not out.is_symlink() and out.read_text() == "student,score\n"
    assert [path.name for path in out.parent.iterdir()] == ["gradebook.csv"]  # no temporary file left


EXAMPLE_GRADE = NotebookGrade(
    notebook="example.ipynb",
    release="lesson.ipynb",
    student="alice",
    assignment="lesson",
    checkers=[
        CheckerResult("exercise_1_1_checker", "check_x", True),
        CheckerResult("exercise_1_2_checker", "check_x", False, "ValueError: x is wrong", "edited"),
        CheckerResult("exercise_1_3_checker", "check_y", False, "did not finish: the kernel died", "missing"),
    ],
    errored_cells=[CellError(cell_index=5, error="ZeroDivisionError: division by zero")],
    problem="the kernel died",
)


def test_format_table_lines_up_checkers_by_name_and_leaves_the_returns_own_errors_out():
    other = NotebookGrade(notebook="other.ipynb", student="bob", problem="matches no notebook of the release")
    assert format_table([EXAMPLE_GRADE, other]).splitlines() == [
        "student  assignment   score       check_x  check_x#2  check_y  checker cells changed                problem",
        "-------  -----------  ----------  -------  ---------  -------  -----------------------------------  "
        + "-" * 34,
        "alice    lesson       1/3         ✓        ✗          ✗        edited: check_x#2; missing: check_y  "
        "the kernel died",
        "bob      other.ipynb  not graded                                                                    "
        "matches no notebook of the release",
    ]


def test_the_gradebook_has_a_row_per_student_and_assignment_and_a_feedback_page_each(tmp_path):
    other = NotebookGrade(notebook="other.ipynb", student="bob", problem="matches no notebook of the release")
    out = write_gradebook([EXAMPLE_GRADE, other], tmp_path / "graded", seed=7, commit="abc123")
    with out.open(newline="") as csv_file:
        assert list(csv.reader(csv_file)) == [
            ["student", "assignment", "notebook", "1.1", "1.2", "1.3", "score", "max", "problem", "seed", "commit"],
            ["alice", "lesson", "example.ipynb", "1", "0", "0", "1", "3", "the kernel died", "7", "abc123"],
            ["bob", "", "other.ipynb", "", "", "", "0", "0", "matches no notebook of the release", "7", "abc123"],
        ]
    page = (tmp_path / "graded" / "feedback" / "alice" / "lesson.html").read_text()
    assert "ValueError: x is wrong" in page and "ZeroDivisionError" in page and "seed 7" in page
    assert (tmp_path / "graded" / "feedback" / "bob" / "other.html").exists()
