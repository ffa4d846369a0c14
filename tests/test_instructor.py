import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.instructor import (
    CellError,
    CheckerResult,
    NotebookGrade,
    format_table,
    grade_folder,
    grade_notebook,
    make_student_copies,
    make_student_copy,
    write_csv,
)

nbformat = pytest.importorskip("nbformat")
notebook_v4 = pytest.importorskip("nbformat.v4")
pytest.importorskip("nbclient")
new_code_cell = notebook_v4.new_code_cell
new_markdown_cell = notebook_v4.new_markdown_cell
new_output = notebook_v4.new_output

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

STUDENT_SOURCE = '''\
@triton.jit
def scale_kernel(x_ptr, n, BLOCK: tl.constexpr):
    """Scale x in place."""
    offsets = tl.arange(0, BLOCK)
    # YOUR CODE HERE
    pass


def scale(x):
# YOUR CODE HERE
pass
    return x'''


def solution_cell(source=SOLUTION_SOURCE, tags=("solution", "hide-input")):
    return new_code_cell(source, metadata={"tags": list(tags)})


def write_notebook(path, cells):
    nbformat.write(notebook_v4.new_notebook(cells=cells), path)
    return path


def read_cells(path):
    return nbformat.read(path, as_version=4).cells


def student_copy_of(tmp_path, cells):
    source = write_notebook(tmp_path / "lesson.ipynb", cells)
    return read_cells(make_student_copy(source, tmp_path / "student" / "lesson.ipynb"))


# --- student copies -----------------------------------------------------------------


def test_solution_blocks_become_placeholders_at_the_marker_indentation(tmp_path):
    (cell,) = student_copy_of(tmp_path, [solution_cell()])
    assert cell.source == STUDENT_SOURCE


def test_solution_cell_keeps_its_tags_but_hide_input(tmp_path):
    (cell,) = student_copy_of(
        tmp_path, [solution_cell(tags=("solution", "hide-input", "nbval-ignore-output"))]
    )
    assert cell.metadata["tags"] == ["solution", "nbval-ignore-output"]


def test_outputs_and_execution_counts_are_cleared(tmp_path):
    executed = new_code_cell(
        "print(1)",
        execution_count=3,
        outputs=[new_output("stream", name="stdout", text="1\n")],
    )
    (cell,) = student_copy_of(tmp_path, [executed])
    assert cell.outputs == []
    assert cell.execution_count is None


def test_cells_tagged_remove_in_student_are_dropped(tmp_path):
    cells = student_copy_of(
        tmp_path,
        [
            new_markdown_cell("Intro"),
            new_markdown_cell("Grading notes", metadata={"tags": ["remove-in-student"]}),
            new_code_cell("answer = 42", metadata={"tags": ["remove-in-student"]}),
            new_code_cell("x = 1"),
        ],
    )
    assert [cell.source for cell in cells] == ["Intro", "x = 1"]


@pytest.mark.parametrize(
    "source, problem",
    [
        ("x = 1", "has no"),
        ("# BEGIN SOLUTION\nx = 1", "never closed"),
        ("x = 1\n# END SOLUTION", "has no '# BEGIN SOLUTION' before it"),
        ("# BEGIN SOLUTION\n# BEGIN SOLUTION\nx = 1\n# END SOLUTION", "nested"),
    ],
    ids=["no markers", "unclosed", "end without begin", "nested"],
)
def test_malformed_markers_raise_naming_notebook_and_cell(tmp_path, source, problem):
    cells = [new_markdown_cell("Intro"), solution_cell(source)]
    with pytest.raises(ValueError, match="lesson.ipynb, cell 1") as raised:
        student_copy_of(tmp_path, cells)
    assert problem in str(raised.value)
    assert not (tmp_path / "student" / "lesson.ipynb").exists()


def test_markers_in_a_cell_not_tagged_solution_raise(tmp_path):
    forgot_the_tag = new_code_cell("# BEGIN SOLUTION\nanswer = 42\n# END SOLUTION")
    with pytest.raises(ValueError, match="lesson.ipynb, cell 0: .* not tagged 'solution'"):
        student_copy_of(tmp_path, [forgot_the_tag])


def test_student_copies_cover_the_notebooks_of_the_folder_only(tmp_path):
    source_dir = tmp_path / "notebooks"
    (source_dir / "nested").mkdir(parents=True)
    for path in [source_dir / "01_a.ipynb", source_dir / "02_b.ipynb"]:
        write_notebook(path, [solution_cell()])
    write_notebook(source_dir / "nested" / "03_c.ipynb", [solution_cell()])
    (source_dir / "notes.txt").write_text("not a notebook")

    written = make_student_copies(source_dir, tmp_path / "student")

    assert written == [tmp_path / "student" / "01_a.ipynb", tmp_path / "student" / "02_b.ipynb"]
    assert sorted(path.name for path in (tmp_path / "student").iterdir()) == [
        "01_a.ipynb",
        "02_b.ipynb",
    ]


def test_student_copies_refuse_to_overwrite_the_source(tmp_path):
    write_notebook(tmp_path / "lesson.ipynb", [solution_cell()])
    with pytest.raises(ValueError, match="overwrite"):
        make_student_copies(tmp_path, tmp_path)


def test_missing_instructor_dependency_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "nbformat", None)
    with pytest.raises(ImportError, match="pip install nbformat nbclient ipykernel"):
        make_student_copy(tmp_path / "lesson.ipynb", tmp_path / "student.ipynb")


def test_module_imports_without_instructor_dependencies():
    blocked = "import sys; sys.modules.update(nbformat=None, nbclient=None); "
    subprocess.run(
        [sys.executable, "-c", blocked + "import course_lib.instructor"],
        cwd=REPO_ROOT,
        check=True,
    )


# --- grading ------------------------------------------------------------------------

CHECKER_DEFINITION = "def check_x(v):\n    if v != 2:\n        raise ValueError('x is wrong')"


def checker_cell(source):
    return new_code_cell(source, metadata={"tags": ["checker"]})


def write_graded_example(folder):
    """A notebook with one passing and one failing checker and one other cell raising."""
    (folder / "data.txt").write_text("2")
    return write_notebook(
        folder / "example.ipynb",
        [
            new_code_cell(CHECKER_DEFINITION),  # 0
            new_code_cell("x = int(open('data.txt').read())"),  # 1: relative to the notebook
            new_markdown_cell("### Exercise 1.1: x"),  # 2
            checker_cell("check_x(x)"),  # 3
            checker_cell("check_x(x + 1)"),  # 4
            new_code_cell("1 / 0"),  # 5
            checker_cell("print('after the error')\ncheck_x(x)"),  # 6
        ],
    )


EXAMPLE_GRADE = NotebookGrade(
    notebook="example.ipynb",
    checkers=[
        CheckerResult(cell_index=3, label="check_x", passed=True, error=None),
        CheckerResult(cell_index=4, label="check_x", passed=False, error="ValueError: x is wrong"),
        CheckerResult(cell_index=6, label="check_x", passed=True, error=None),
    ],
    errored_cells=[CellError(cell_index=5, error="ZeroDivisionError: division by zero")],
)


def test_grade_notebook_reports_each_checker_and_other_errors(tmp_path, monkeypatch):
    notebook = write_graded_example(tmp_path)
    monkeypatch.chdir(tmp_path.parent)
    grade = grade_notebook(notebook, timeout=60)
    assert grade == EXAMPLE_GRADE
    assert grade.score == "2/3"


def test_checkers_the_kernel_never_reached_fail_despite_old_outputs(tmp_path):
    stale_pass = checker_cell("check_x(2)")
    stale_pass.execution_count = 2
    stale_pass.outputs = [new_output("stream", name="stdout", text="Exercise 1.1 passed\n")]
    notebook = write_notebook(
        tmp_path / "crash.ipynb",
        [new_code_cell(CHECKER_DEFINITION), new_code_cell("import os\nos._exit(1)"), stale_pass],
    )

    grade = grade_notebook(notebook, timeout=60)

    (checker,) = grade.checkers
    assert grade.aborted.startswith("DeadKernelError")
    assert not checker.passed
    assert checker.error.startswith("not run (DeadKernelError")


def test_grade_folder_grades_every_notebook_in_name_order(tmp_path):
    write_graded_example(tmp_path)
    write_notebook(tmp_path / "a_first.ipynb", [checker_cell("assert True")])
    grades = grade_folder(tmp_path, timeout=60)
    assert [grade.notebook for grade in grades] == ["a_first.ipynb", "example.ipynb"]
    assert grades[0].checkers == [
        CheckerResult(cell_index=0, label="cell 0", passed=True, error=None)
    ]


def test_format_table_lines_up_checkers_by_name():
    other = NotebookGrade(
        notebook="other.ipynb",
        checkers=[CheckerResult(cell_index=1, label="check_y", passed=False, error="E: e")],
        aborted="DeadKernelError: Kernel died",
    )
    assert format_table([EXAMPLE_GRADE, other]).splitlines() == [
        "notebook       score  check_x  check_x#2  check_x#3  check_y  errors outside checkers",
        "-------------  -----  -------  ---------  ---------  -------  " + "-" * 43,
        "example.ipynb  2/3    ✓        ✗          ✓                   "
        "cell 5: ZeroDivisionError: division by zero",
        "other.ipynb    0/1                                   ✗        "
        "aborted: DeadKernelError: Kernel died",
    ]


def test_write_csv_has_one_row_per_checker(tmp_path):
    out = write_csv([EXAMPLE_GRADE], tmp_path / "graded" / "scores.csv")
    with out.open(newline="") as csv_file:
        assert list(csv.reader(csv_file)) == [
            ["notebook", "checker", "passed", "error"],
            ["example.ipynb", "check_x", "1", ""],
            ["example.ipynb", "check_x#2", "0", "ValueError: x is wrong"],
            ["example.ipynb", "check_x#3", "1", ""],
        ]


# --- command line -------------------------------------------------------------------


def python_path_with_repo_root():
    return os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])


def run_cli(*arguments, cwd):
    environment = {**os.environ, "PYTHONPATH": python_path_with_repo_root()}
    return subprocess.run(
        [sys.executable, "-m", "course_lib.instructor", *map(str, arguments)],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_makes_student_copies_and_grades_them(tmp_path):
    source_dir = tmp_path / "notebooks"
    source_dir.mkdir()
    write_notebook(
        source_dir / "lesson.ipynb",
        [
            new_code_cell(CHECKER_DEFINITION),
            solution_cell("def answer():\n    # BEGIN SOLUTION\n    return 2\n    # END SOLUTION"),
            checker_cell("check_x(answer())"),
        ],
    )

    student = run_cli("student", source_dir, tmp_path / "student", cwd=tmp_path)
    assert student.returncode == 0, student.stderr
    assert "lesson.ipynb" in student.stdout

    submissions = tmp_path / "student"
    shutil.copy(source_dir / "lesson.ipynb", submissions / "instructor.ipynb")
    graded = run_cli("grade", submissions, "--out", tmp_path / "graded/scores.csv", cwd=tmp_path)

    assert graded.returncode == 0, graded.stderr
    table = graded.stdout.splitlines()
    assert table[0].split() == ["notebook", "score", "check_x", "errors", "outside", "checkers"]
    assert table[2].split() == ["instructor.ipynb", "1/1", "✓"]
    assert table[3].split() == ["lesson.ipynb", "0/1", "✗"]
    with (tmp_path / "graded" / "scores.csv").open(newline="") as csv_file:
        rows = list(csv.reader(csv_file))
    assert rows[1:] == [
        ["instructor.ipynb", "check_x", "1", ""],
        ["lesson.ipynb", "check_x", "0", "ValueError: x is wrong"],
    ]


@pytest.mark.parametrize("make_folder", [False, True], ids=["missing folder", "no notebooks"])
def test_cli_fails_only_for_tool_errors(tmp_path, make_folder):
    folder = tmp_path / "returned"
    if make_folder:
        folder.mkdir()
    graded = run_cli("grade", folder, cwd=tmp_path)
    assert graded.returncode != 0
    assert str(folder) in graded.stderr


# --- the course notebooks -----------------------------------------------------------


@pytest.mark.notebook_exec
@pytest.mark.parametrize(
    "notebook",
    COURSE_NOTEBOOKS
    or [pytest.param(None, marks=pytest.mark.skip(reason="notebooks/ holds no *.ipynb yet"))],
    ids=lambda path: path.name if path else "none",
)
def test_student_copy_fails_at_its_checkers_only(notebook, tmp_path, monkeypatch):
    # The kernel inherits the environment and must import this checkout's course_lib.
    monkeypatch.setenv("PYTHONPATH", python_path_with_repo_root())
    # Graded copies sit in notebooks/ beside the repository's other folders, so paths
    # relative to the notebook resolve as in the repository.
    graded_dir = tmp_path / "notebooks"
    for sibling in REPO_ROOT.iterdir():
        if sibling.is_dir() and sibling.name not in {"notebooks", ".git"}:
            (tmp_path / sibling.name).symlink_to(sibling, target_is_directory=True)
    make_student_copy(notebook, graded_dir / f"student_{notebook.name}")
    shutil.copy(notebook, graded_dir / f"instructor_{notebook.name}")

    instructor_grade, student_grade = grade_folder(graded_dir, timeout=600)

    assert instructor_grade.notebook.startswith("instructor_")
    assert instructor_grade.errored_cells == [] and instructor_grade.aborted is None
    assert all(checker.passed for checker in instructor_grade.checkers), instructor_grade
    assert student_grade.total >= 3, student_grade
    assert not any(checker.passed for checker in student_grade.checkers), student_grade
    assert student_grade.errored_cells == [] and student_grade.aborted is None, student_grade
