"""Each way out of a return's sandbox, tried by a return graded with a class: each attacker is
stopped and marked, and scores nothing; no other return's score or file changes; the honest
returns graded after the attackers score full marks. One class is graded once for all (a return
takes seconds even on a lesson this small), two at a time."""

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from course_lib.teaching.exercise_metadata import stamp_exercise_metadata
from course_lib.teaching.grading.gradebook import format_table, write_gradebook
from course_lib.teaching.grading.grader import grade_folder
from course_lib.teaching.grading.package_copy import PACKAGE_DIR, package_snapshot

nbformat = pytest.importorskip("nbformat")
new_code_cell = pytest.importorskip("nbformat.v4").new_code_cell
new_markdown_cell = pytest.importorskip("nbformat.v4").new_markdown_cell

REPO_ROOT = Path(__file__).resolve().parents[3]
CHECKER_DEFINITION = "def check_x(v):\n    if v != 2:\n        raise ValueError('x is wrong')"
ANSWER = "def answer():\n    # BEGIN SOLUTION\n    return 2\n    # END SOLUTION"
TOKEN = f"course_lib_escape_{os.getpid()}_{time.monotonic_ns()}"
CLASSMATE_SECRET = "the classmate's own answer, 31337"


def lesson(path, attack=None):
    """The one-exercise lesson, solved; with ``attack`` in a cell before the answer."""
    cells = [new_code_cell(CHECKER_DEFINITION), new_markdown_cell("### Exercise 1.1"),
             new_code_cell(ANSWER, metadata={"tags": ["solution"]}),
             new_code_cell("check_x(answer())", metadata={"tags": ["checker"]})]
    if attack is not None:
        cells.insert(1, new_code_cell(attack))
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    stamp_exercise_metadata([path])
    return path


def attacks(release, submissions, out):
    """{student: the cell of their attack}."""
    package_file = "pathlib.Path(__import__('course_lib').__file__)"
    return {
        "a_writes_its_package": f"import pathlib\n({package_file}.parent / 'teaching' / 'exercises' / '__init__.py')"
                                ".write_text('def check_x(v): pass')",
        "b_plants_json": f"import pathlib\n({package_file}.parent / 'teaching' / 'json.py').write_text('raise SystemExit')",
        "c_symlinks_the_output": f"import os\nos.symlink({str(release)!r}, {str(out / 'gradebook.csv')!r})",
        "d_leaves_a_daemon": (
            "import subprocess\n"
            f"subprocess.Popen(['setsid', 'sh', '-c', 'while true; do sleep 1; done # {TOKEN}'], start_new_session=True)"),
        "e_writes_outside": (
            "import pathlib\n"
            f"pathlib.Path('/tmp/{TOKEN}').write_text('x')\n"
            f"(pathlib.Path.home() / '{TOKEN}').write_text('x')\n"
            f"pathlib.Path({str(REPO_ROOT / TOKEN)!r}).write_text('x')"),
        "f_reads_a_classmate": f"raise ValueError(open({str(submissions / 'z_honest' / 'lesson' / 'lesson.ipynb')!r}).read())",
    }


@pytest.mark.notebook_exec
def test_every_escape_is_stopped_and_marked_and_honest_returns_keep_full_marks(tmp_path):
    release = lesson(tmp_path / "release" / "lesson.ipynb")
    release_bytes = release.read_bytes()
    submissions, out = tmp_path / "course" / "submitted", tmp_path / "graded"
    out.mkdir()
    for student, attack in attacks(release, submissions, out).items():
        lesson(submissions / student / "lesson" / "lesson.ipynb", attack)
    for student in ("m_honest", "z_honest"):
        lesson(submissions / student / "lesson" / "lesson.ipynb", f"secret = {CLASSMATE_SECRET!r}")
    returned = {path: path.read_bytes() for path in submissions.rglob("*.ipynb")}
    package_before = package_snapshot(PACKAGE_DIR)

    start = time.monotonic()
    grades = grade_folder(tmp_path / "course", release.parent, seed=7, timeout=60, jobs=2)
    seconds = time.monotonic() - start
    write_gradebook(grades, out, seed=7, commit="test")
    table = format_table(grades)
    print(table, f"\n{len(grades)} returns in {seconds:.0f} s")

    by_student = {grade.student: grade for grade in grades}
    for student in attacks(release, submissions, out):
        grade = by_student[student]
        if student == "e_writes_outside" and grade.problem is None:
            # A checkout under /tmp lies inside the return's own /tmp: its write there lands in that
            # private folder, gone with it, like its writes to /tmp and home (checked below). A
            # checkout the sandbox shows no folder of is not there at all: the write finds no folder.
            assert REPO_ROOT.is_relative_to("/tmp") or any(
                "No such file or directory" in cell.error for cell in grade.errored_cells), (student, table)
            continue
        assert grade.score == "0/1" and grade.problem.startswith("tampered"), (student, grade.problem, table)
    for student in ("m_honest", "z_honest"):
        assert (by_student[student].score, by_student[student].problem) == ("1/1", None), table
    # Nothing outside the sandboxes changed, and nothing was left running.
    assert {path: path.read_bytes() for path in submissions.rglob("*.ipynb")} == returned
    assert release.read_bytes() == release_bytes
    assert package_snapshot(PACKAGE_DIR) == package_before
    assert not Path(f"/tmp/{TOKEN}").exists() and not (Path.home() / TOKEN).exists()
    assert not (REPO_ROOT / TOKEN).exists()
    time.sleep(0.5)
    assert subprocess.run(["pgrep", "-f", TOKEN], capture_output=True, text=True).stdout == ""
    assert not (out / "gradebook.csv").is_symlink()
    # A classmate's answer reaches no one else's row, feedback or table.
    assert CLASSMATE_SECRET not in table
    for page in (out / "feedback").rglob("*.html"):
        assert CLASSMATE_SECRET not in page.read_text(), page
