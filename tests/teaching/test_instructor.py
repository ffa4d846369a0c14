"""The instructor tools' command line (course_lib/teaching/instructor.py)."""

import csv
import os
import shutil
import subprocess
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
notebook_v4 = pytest.importorskip("nbformat.v4")
pytest.importorskip("nbclient")
from instructor_notebooks import REPO_ROOT, python_path_with_repo_root, write_release  # noqa: E402


def test_module_imports_without_instructor_dependencies():
    blocked = "import sys; sys.modules.update(nbformat=None, nbclient=None); "
    subprocess.run(
        [sys.executable, "-c", blocked + "import course_lib.teaching.instructor"],
        cwd=REPO_ROOT,
        check=True,
    )


def run_cli(*arguments, cwd):
    environment = {**os.environ, "PYTHONPATH": python_path_with_repo_root()}
    return subprocess.run(
        [sys.executable, "-m", "course_lib.teaching.instructor", *map(str, arguments)],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_makes_student_copies_and_grades_them(tmp_path):
    source_dir = tmp_path / "notebooks"
    write_release(source_dir)

    student = run_cli("student", source_dir, tmp_path / "student", cwd=tmp_path)
    assert student.returncode == 0, student.stderr
    assert "lesson.ipynb" in student.stdout

    submissions = tmp_path / "student"
    shutil.copy(source_dir / "lesson.ipynb", submissions / "instructor.ipynb")
    shutil.move(submissions / "lesson.ipynb", submissions / "bob_lesson.ipynb")  # a flat folder: <student>_<notebook>
    graded = run_cli("grade", submissions, "--release", source_dir, "--seed", "7", "--jobs", "2",
                     "--out", tmp_path / "graded", cwd=tmp_path)

    assert graded.returncode == 0, graded.stderr
    assert "seed 7" in graded.stderr and "sandbox: bubblewrap" in graded.stderr
    table = graded.stdout.splitlines()
    assert table[0].split()[:4] == ["student", "assignment", "score", "check_x"]
    assert table[2].split() == ["bob", "lesson", "0/1", "✗"]
    assert table[3].split() == ["instructor", "lesson", "1/1", "✓"]
    with (tmp_path / "graded" / "gradebook.csv").open(newline="") as csv_file:
        rows = list(csv.reader(csv_file))
    assert [row[:8] for row in rows[1:]] == [["bob", "lesson", "bob_lesson.ipynb", "0", "0", "1", "", "7"],
                                            ["instructor", "lesson", "instructor.ipynb", "1", "1", "1", "", "7"]]
    assert "ValueError: x is wrong" in (tmp_path / "graded" / "feedback" / "bob" / "lesson.html").read_text()
    # Beside the page, the graded notebook: this run's outputs, the release's checker source.
    kept = nbformat.read(tmp_path / "graded" / "feedback" / "bob" / "lesson.ipynb", as_version=4)
    assert kept.cells[0].source.splitlines()[0] == "# Graded: 0/1"
    (checker,) = [cell for cell in kept.cells if "checker" in cell.metadata.get("tags", [])]
    assert checker.source == "check_x(answer())"
    assert [output.get("evalue") for output in checker.outputs] == ["x is wrong"], checker.outputs


@pytest.mark.parametrize("make_folder", [False, True], ids=["missing folder", "no notebooks"])
def test_cli_fails_only_for_tool_errors(tmp_path, make_folder):
    folder = tmp_path / "returned"
    if make_folder:
        folder.mkdir()
    write_release(tmp_path / "release")
    graded = run_cli("grade", folder, "--release", tmp_path / "release", cwd=tmp_path)
    assert graded.returncode != 0
    assert str(folder) in graded.stderr
