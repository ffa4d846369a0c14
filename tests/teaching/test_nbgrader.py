"""nbgrader 0.9 runs on the course's notebooks as they are: generate_assignment makes the
student version from their metadata, and autograde restores the checker cells a student
changed or deleted before scoring. The assignment is chapter 1's exercises alone: nbval
runs the whole chapter."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbgrader")
from exercise_notebook import exercises_only  # noqa: E402  (needs nbformat)

REPO_ROOT = Path(__file__).resolve().parents[2]
CHAPTER_1 = REPO_ROOT / "notebooks" / "01_weighted_sum.ipynb"
ASSIGNMENT = "chapter1"


def nbgrader(course, *arguments):
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
        # nbgrader runs the `alembic` command of its environment
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    completed = subprocess.run(
        [sys.executable, "-m", "nbgrader", *arguments, f"--CourseDirectory.root={course}",
         "--ExecutePreprocessor.timeout=600"],
        cwd=course, env=environment, capture_output=True, text=True, timeout=900,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr


def submit(course, student, notebook):
    folder = course / "submitted" / student / ASSIGNMENT
    folder.mkdir(parents=True)
    nbformat.write(notebook, folder / CHAPTER_1.name)


@pytest.mark.notebook_exec
def test_generate_assignment_and_autograde_on_chapter_1(tmp_path):
    course = tmp_path / "course"
    (course / "source" / ASSIGNMENT).mkdir(parents=True)
    chapter = exercises_only(CHAPTER_1, course / "source" / ASSIGNMENT / CHAPTER_1.name)
    nbgrader(course, "generate_assignment", ASSIGNMENT)

    released = nbformat.read(course / "release" / ASSIGNMENT / CHAPTER_1.name, as_version=4)
    solutions = [cell for cell in released.cells if cell.metadata.get("nbgrader", {}).get("solution")]
    assert len(solutions) == 3 and all("raise NotImplementedError()" in cell.source for cell in solutions)

    submit(course, "instructor", nbformat.read(chapter, as_version=4))
    submit(course, "untouched", released)
    tampered = nbformat.read(course / "release" / ASSIGNMENT / CHAPTER_1.name, as_version=4)
    for cell in tampered.cells:
        if cell.metadata.get("nbgrader", {}).get("grade"):
            cell.source = "pass"
    submit(course, "tampered", tampered)
    nbgrader(course, "autograde", ASSIGNMENT, "--create")

    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        scores = {student: gradebook.find_submission_notebook(CHAPTER_1.stem, ASSIGNMENT, student).score
                  for student in ("instructor", "untouched", "tampered")}
    assert scores == {"instructor": 3, "untouched": 0, "tampered": 0}


def test_the_students_lab_switches_off_every_nbgrader_tool():
    """make lab points JUPYTER_CONFIG_PATH at scripts/student_lab: every server extension the
    installed nbgrader enables, and its JupyterLab extension, are off there (a student's Lab
    opens without the formgrader and its warning about nbgrader_config.py)."""
    import importlib.metadata
    import json
    import pkgutil

    import nbgrader.server_extensions

    config = REPO_ROOT / "scripts" / "student_lab"
    server = json.loads((config / "jupyter_server_config.json").read_text())["ServerApp"]["jpserver_extensions"]
    declared = {f"nbgrader.server_extensions.{module.name}" for module in pkgutil.iter_modules(nbgrader.server_extensions.__path__)}
    assert declared and {name for name, on in server.items() if on is False} == declared
    page = json.loads((config / "labconfig" / "page_config.json").read_text())["disabledExtensions"]
    lab_extensions = [path.parent.name for path in importlib.metadata.distribution("nbgrader").files
                      if path.name == "package.json" and "labextensions" in str(path)]
    assert lab_extensions and all(page.get(f"@jupyter/{name}") is True for name in lab_extensions), lab_extensions
    assert "JUPYTER_CONFIG_PATH=$(CURDIR)/scripts/student_lab" in (REPO_ROOT / "Makefile").read_text()
