"""Small notebooks for the instructor tools' tests (tests/teaching/): exercise cells, a release
with one exercise, and returns made from it. Needs nbformat."""

import os
import shutil
from pathlib import Path

import nbformat
import nbformat.v4 as notebook_v4

from course_lib.teaching.exercise_metadata import stamp_exercise_metadata
from course_lib.teaching.grading.grader import grade_folder
from course_lib.teaching.student_copies import make_student_copy

new_code_cell = notebook_v4.new_code_cell
new_markdown_cell = notebook_v4.new_markdown_cell

REPO_ROOT = Path(__file__).resolve().parents[1]
COURSE_NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))


SOLUTION_SOURCE = '''\
@triton.jit
def scale_kernel(x_ptr, n, BLOCK: tl.constexpr):
    """Scale x in place."""
    offsets = tl.arange(0, BLOCK)
    # BEGIN SOLUTION
    x = tl.load(x_ptr + offsets, mask=offsets < n)
    tl.store(x_ptr + offsets, 2 * x, mask=offsets < n)
    # END SOLUTION


def scale(x):
# BEGIN SOLUTION
    scale_kernel[(1,)](x, x.numel(), BLOCK=1024)
# END SOLUTION
    return x'''


def solution_cell(source=SOLUTION_SOURCE, tags=("solution", "hide-input")):
    return new_code_cell(source, metadata={"tags": list(tags)})


def write_notebook(path, cells):
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook_v4.new_notebook(cells=cells), path)
    return path


def read_cells(path):
    return nbformat.read(path, as_version=4).cells


def exercise(number, solution_source, checker_source):
    """An exercise's three cells: statement, solution, checker."""
    return [
        new_markdown_cell(f"### Exercise {number}: a task"),
        solution_cell(solution_source),
        checker_cell(checker_source),
    ]


def checker_cell(source):
    return new_code_cell(source, metadata={"tags": ["checker"]})


CHECKER_DEFINITION = "def check_x(v):\n    if v != 2:\n        raise ValueError('x is wrong')"


ANSWER = "def answer():\n    # BEGIN SOLUTION\n    return 2\n    # END SOLUTION"


def write_release(folder, *extra_exercises):
    """A released notebook with one exercise (and any more given), and its student copy."""
    folder.mkdir(parents=True, exist_ok=True)
    cells = [new_code_cell(CHECKER_DEFINITION), *exercise("1.1", ANSWER, "check_x(answer())")]
    for cells_of_exercise in extra_exercises:
        cells += cells_of_exercise
    path = write_notebook(folder / "lesson.ipynb", cells)
    stamp_exercise_metadata([path])  # as the course's notebooks are
    return path


def returned(release_path, folder, name, edit=None, solved=False):
    """A return made from the release (solved) or from its student copy, then edited."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if solved:
        shutil.copy(release_path, path)
    else:
        make_student_copy(release_path, path)
    if edit is not None:
        notebook = nbformat.read(path, as_version=4)
        edit(notebook)
        nbformat.write(notebook, path)
    return path


def grade_one(tmp_path, path, **options):
    (grade,) = grade_folder(path.parent, tmp_path / "release", **options)
    return grade


def python_path_with_repo_root():
    return os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
