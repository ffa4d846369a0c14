"""Which student returned what, and the grader's files (course_lib/teaching/grading/gradebook.py)."""

from pathlib import Path

import pytest

from course_lib.teaching.grading.gradebook import (exercise_column, find_returns, safe_name, student_from_file_name,
                                                   write_atomically)


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
