import ast
import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.teaching import instructor
from course_lib.teaching.instructor import (
    CellError,
    CheckerResult,
    NotebookGrade,
    exercise_cells,
    format_table,
    grade_folder,
    load_release,
    make_student_copies,
    make_student_copy,
    nbgrader_metadata,
    execute_in_place,
    stamp_exercise_metadata,
    write_gradebook,
)

nbformat = pytest.importorskip("nbformat")
notebook_v4 = pytest.importorskip("nbformat.v4")
pytest.importorskip("nbclient")
from exercise_notebook import exercises_only  # noqa: E402  (needs nbformat)
new_code_cell = notebook_v4.new_code_cell
new_markdown_cell = notebook_v4.new_markdown_cell
new_output = notebook_v4.new_output

REPO_ROOT = Path(__file__).resolve().parents[2]
COURSE_NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))

@pytest.fixture(autouse=True)
def package_to_guard(tmp_path_factory, monkeypatch):
    """Grading guards the package it grades with (puts back what a return wrote there): here a
    copy, so that a test's attack, or grading while someone edits the package, cannot touch the
    real one."""
    copy = tmp_path_factory.getbasetemp() / "guarded_package" / "course_lib"
    if not copy.exists():
        shutil.copytree(instructor.PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(instructor, "PACKAGE_DIR", copy)
    return copy


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
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook_v4.new_notebook(cells=cells), path)
    return path


def read_cells(path):
    return nbformat.read(path, as_version=4).cells


def student_copy_of(tmp_path, cells):
    """The student copy's cells after the exercise heading, which comes first as cell 0."""
    source = write_notebook(tmp_path / "lesson.ipynb", [new_markdown_cell("### Exercise 1.1: a task"), *cells])
    return read_cells(make_student_copy(source, tmp_path / "student" / "lesson.ipynb"))[1:]


# --- student copies -----------------------------------------------------------------


def test_solution_blocks_become_placeholders_at_the_marker_indentation(tmp_path):
    (cell,) = student_copy_of(tmp_path, [solution_cell()])
    assert cell.source == STUDENT_SOURCE


def test_solution_cell_keeps_its_tags_but_hide_input(tmp_path):
    (cell,) = student_copy_of(
        tmp_path, [solution_cell(tags=("solution", "hide-input", "nbval-ignore-output"))]
    )
    assert cell.metadata["tags"] == ["solution", "nbval-ignore-output"]


def test_outputs_of_solutions_and_checkers_are_cleared_and_run_metadata_dropped(tmp_path):
    def executed(source, tags=()):
        return new_code_cell(source, execution_count=3, outputs=[new_output("stream", name="stdout", text="1\n")],
                             metadata={"tags": list(tags), "execution": {"iopub.execute_input": "2026-11-26"}})

    lesson, answer, checker = student_copy_of(
        tmp_path, [executed("print(1)"), executed(ANSWER, ["solution"]), executed("check_x(answer())", ["checker"])])
    assert [output["text"] for output in lesson.outputs] == ["1\n"]  # the book's page shows the course's outputs
    assert answer.outputs == [] and checker.outputs == []  # they came from the solution
    assert all(cell.execution_count is None and "execution" not in cell.metadata for cell in (lesson, answer, checker))


def test_each_exercise_links_its_chapters_solutions_page(tmp_path):
    source = write_notebook(tmp_path / "lesson.ipynb", [new_markdown_cell("### Exercise 1.1: a task\n\nDo it.")])
    (task,) = read_cells(make_student_copy(source, tmp_path / "student" / "lesson.ipynb"))
    assert task.source.startswith("### Exercise 1.1: a task\n\nDo it.\n\n")
    assert task.source.endswith("[this chapter's solutions page](../book/solutions/lesson.md).")


def test_solutions_page_shows_each_answer_without_markers(tmp_path):
    source = write_notebook(tmp_path / "lesson.ipynb", [
        new_markdown_cell("# A lesson"), *exercise("1.1", ANSWER, "check_x(answer())")])
    (page,) = instructor.make_solutions_pages(tmp_path, tmp_path / "pages")
    text = page.read_text()
    assert text.startswith("# Solutions: A lesson\n")
    assert "## Exercise 1.1" in text and "def answer():\n    return 2" in text and "SOLUTION" not in text


def test_the_exercise_table_lists_every_exercise():
    table = instructor.exercise_table()
    assert all(f"| {exercise.number} | {exercise.title} |" in table for exercise in instructor_exercises())


def test_the_committed_student_copies_are_current(tmp_path):
    """The book's chapters and the launch buttons open student/: after changing a notebook, make student."""
    fresh = {path.name: path for path in make_student_copies(REPO_ROOT / "notebooks", tmp_path)}
    committed = sorted((REPO_ROOT / "student").glob("*.ipynb"))
    assert [path.name for path in committed] == sorted(fresh), "student/ and notebooks/ hold different notebooks"
    for path in committed:
        assert path.read_text() == fresh[path.name].read_text(), f"student/{path.name} is stale: run make student"


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
    with pytest.raises(ValueError, match="lesson.ipynb, cell 2") as raised:
        student_copy_of(tmp_path, cells)
    assert problem in str(raised.value)
    assert not (tmp_path / "student" / "lesson.ipynb").exists()


def test_markers_in_a_cell_not_tagged_solution_raise(tmp_path):
    forgot_the_tag = new_code_cell("# BEGIN SOLUTION\nanswer = 42\n# END SOLUTION")
    with pytest.raises(ValueError, match="lesson.ipynb, cell 1: .* not tagged 'solution'"):
        student_copy_of(tmp_path, [forgot_the_tag])


@pytest.mark.notebook_exec
def test_a_gpu_run_keeps_the_interpreters_outputs_of_tagged_cells(tmp_path, monkeypatch):
    monkeypatch.setattr(instructor, "ON_GPU", True)
    drawn = [new_output("stream", name="stdout", text="drawn by the interpreter\n")]
    tagged = new_code_cell("print('compiled on the GPU')", metadata={"tags": ["interpreter-output"]}, outputs=drawn)
    path = tmp_path / "chapter.ipynb"
    nbformat.write(notebook_v4.new_notebook(cells=[tagged, new_code_cell("print('ran')")]), path)
    execute_in_place([path])
    kept, ran = nbformat.read(path, as_version=4).cells
    assert [output["text"] for output in kept.outputs] == ["drawn by the interpreter\n"]
    assert [output["text"] for output in ran.outputs] == ["ran\n"]


def test_student_copies_cover_the_notebooks_of_the_folder_only(tmp_path):
    source_dir = tmp_path / "notebooks"
    (source_dir / "nested").mkdir(parents=True)
    for path in [source_dir / "01_a.ipynb", source_dir / "02_b.ipynb"]:
        write_notebook(path, [new_markdown_cell("### Exercise 1.1: a task"), solution_cell()])
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
        [sys.executable, "-c", blocked + "import course_lib.teaching.instructor"],
        cwd=REPO_ROOT,
        check=True,
    )


# --- exercise ids and nbgrader's metadata --------------------------------------------


def exercise(number, solution_source, checker_source):
    """An exercise's three cells: statement, solution, checker."""
    return [
        new_markdown_cell(f"### Exercise {number}: a task"),
        solution_cell(solution_source),
        checker_cell(checker_source),
    ]


def checker_cell(source):
    return new_code_cell(source, metadata={"tags": ["checker"]})


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


def instructor_exercises():
    from course_lib.teaching.exercises import EXERCISES

    return EXERCISES


def _output_text(output):
    """The text an output shows (printed or a value's repr), where a printed answer would be."""
    text = output.get("text", "") or output.get("data", {}).get("text/plain", "")
    return "".join(text) if isinstance(text, list) else text


def _solution_lines(source):
    """The lines between the markers of a solution cell, stripped."""
    lines, inside = [], False
    for line in source.split("\n"):
        if line.strip() in ("# BEGIN SOLUTION", "# END SOLUTION"):
            inside = line.strip() == "# BEGIN SOLUTION"
        elif inside and line.strip():
            lines.append(line.strip())
    return lines


@pytest.mark.parametrize("notebook", COURSE_NOTEBOOKS, ids=lambda path: path.name)
def test_no_student_copy_holds_an_answer_elsewhere(notebook, tmp_path):
    """Most lines of an answer printed in another cell would give the exercise away."""
    answers = [_solution_lines(cell.source) for cell in read_cells(notebook) if "solution" in cell.metadata.get("tags", [])]
    student_text = {line.strip() for cell in read_cells(make_student_copy(notebook, tmp_path / notebook.name))
                    for text in [cell.source, *map(_output_text, cell.get("outputs", []))]
                    for line in text.split("\n")}
    for answer in answers:
        distinctive = [line for line in answer if len(line) > 20]
        found = [line for line in distinctive if line in student_text]
        assert len(found) <= len(distinctive) // 3, f"a student copy prints these lines of an answer: {found}"


# --- grading ------------------------------------------------------------------------

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


def test_checkers_come_from_the_release_and_tampering_is_reported(tmp_path):
    release = write_release(tmp_path / "release")

    def edit_checker(notebook):
        notebook.cells[3].source = "pass"

    def delete_checker(notebook):
        del notebook.cells[3]

    def solve_then_break(notebook):
        notebook.cells[2].source = "def answer():\n    return 2"
        notebook.cells.append(new_code_cell("1 / 0"))

    def solve_then_delete_checker(notebook):
        notebook.cells[2].source = "def answer():\n    return 2"
        del notebook.cells[3]

    submissions = tmp_path / "returned"
    returned(release, submissions, "a_edited.ipynb", edit_checker)
    returned(release, submissions, "b_deleted.ipynb", delete_checker)
    returned(release, submissions, "c_solved.ipynb", solve_then_break)
    returned(release, submissions, "d_solved_checker_deleted.ipynb", solve_then_delete_checker)

    edited, deleted, solved, solved_deleted = grade_folder(submissions, tmp_path / "release", timeout=60)

    assert edited.checkers == [CheckerResult("exercise_1_1_checker", "check_x", False,
                                             "ValueError: x is wrong", "edited")]
    assert deleted.checkers == [CheckerResult(
        "exercise_1_1_checker", "check_x", False,
        "checker cell missing from the return (run from the release: ValueError: x is wrong)", "missing")]
    # A missing checker counts as failed even where the answer is right; the report says it would pass.
    assert solved_deleted.checkers == [CheckerResult(
        "exercise_1_1_checker", "check_x", False,
        "checker cell missing from the return (run from the release: it passed)", "missing")]
    assert solved.checkers == [CheckerResult("exercise_1_1_checker", "check_x", True, None, "as released")]
    assert solved.errored_cells == [CellError(cell_index=4, error="ZeroDivisionError: division by zero")]
    assert (edited.release, solved.score) == ("lesson.ipynb", "1/1")


GRADS_FORMULA = "g[..., None] * w, (x * g[..., None]).reshape(-1, x.shape[-1]).sum(0)"  # exercise 1.2's answer


def test_a_monkeypatched_exercises_module_has_no_effect(tmp_path):
    release = write_notebook(tmp_path / "release" / "lesson.ipynb", [
        new_code_cell("from course_lib.teaching import exercises\nimport torch"),
        *exercise("1.2", "def grads(x, w, g):\n    # BEGIN SOLUTION\n    return g[..., None] * w, x.sum(0)\n"
                         "    # END SOLUTION", "exercises.check_weighted_sum_grads(grads)"),
    ])

    def patch_checkers(notebook):
        notebook.cells.insert(1, new_code_cell(
            "import sys\nfor module in (exercises, sys.modules['course_lib.teaching.exercises']):\n"
            "    module.check_weighted_sum_grads = lambda answer: print('Exercise 1.2 passed')"))

    grade = grade_one(tmp_path, returned(release, tmp_path / "returned", "patched.ipynb", patch_checkers), timeout=120)
    assert not grade.checkers[0].passed
    assert grade.checkers[0].error.startswith("ExerciseError: Exercise 1.2 (weighted_sum_grads)")


def test_hidden_inputs_defeat_answers_recorded_from_the_visible_check(tmp_path):
    """An answer that looks up what the notebook recorded from the visible check is refused: the
    grader judges the function alone, out of the notebook's process (kernel_verdicts.py). One
    that holds the formula for the visible widths alone passes them, and fails the hidden size."""
    recorded_answers = (
        "def grads(x, w, g):\n"
        "    # BEGIN SOLUTION\n"
        "    return answers[float(x.sum())]\n"
        "    # END SOLUTION\n\n\n"
        "answers = {}\n"
        "torch.manual_seed(0)  # the inputs the visible check will draw, answered once with the formula\n"
        f"exercises.check_weighted_sum_grads(lambda x, w, g: answers.setdefault(float(x.sum()), ({GRADS_FORMULA})))\n"
        "torch.manual_seed(0)"
    )
    visible_widths_only = (
        "def grads(x, w, g):\n"
        "    # BEGIN SOLUTION\n"
        "    if x.shape[-1] in (3, 5, 7):  # the widths of the visible check\n"
        f"        return {GRADS_FORMULA}\n"
        "    return None\n"
        "    # END SOLUTION"
    )
    folder = tmp_path / "returned"
    for name, answer in (("a_recorded", recorded_answers), ("b_visible_widths", visible_widths_only)):
        release = write_notebook(tmp_path / name / "lesson.ipynb", [
            new_code_cell("from course_lib.teaching import exercises\nimport torch"),
            *exercise("1.2", answer, "exercises.check_weighted_sum_grads(grads)"),
        ])
        stamp_exercise_metadata([release])
        returned(release, folder, f"{name}.ipynb", solved=True)
    shutil.copytree(tmp_path / "b_visible_widths", tmp_path / "release")

    recorded, visible = grade_folder(folder, tmp_path / "release", timeout=120)  # no seed: the visible inputs
    assert not recorded.checkers[0].passed
    assert recorded.checkers[0].error.startswith("NotPyTorch: `grads` reads `answers` (line 3), which is neither its "
                                                 "own nor torch, F or math"), recorded
    assert visible.checkers[0].passed, visible
    hidden = grade_folder(folder, tmp_path / "release", timeout=120, seed=12345)[1]
    assert not hidden.checkers[0].passed
    assert "return a tuple" in hidden.checkers[0].error


# What both forgers below do first: walk up to the grader and write a "passed" record for
# the checker, once, then stop the checker's own record from being written.
FORGED_RECORD = (
    "    frame = sys._getframe()\n"
    "    while 'results_path' not in frame.f_locals:  # up to fresh_checker.run_checker\n"
    "        frame = frame.f_back\n"
    "    if frame.f_globals['_record'].__name__ == '_record':  # the first call: one record, as the checker's\n"
    "        with open(frame.f_locals['results_path'], 'a') as results:\n"
    "            results.write(json.dumps({'grade_id': frame.f_locals['grade_id'], 'passed': True, 'error': None}) + '\\n')\n"
    "        frame.f_globals['_record'] = lambda *args: None  # the checker's own record is never written\n"
)

STACK_FORGER = (
    "def grads(x, w, g):\n"
    "    # BEGIN SOLUTION\n"
    "    import json, sys\n"
    + FORGED_RECORD +
    "    checker = sys._getframe()\n"
    "    while checker.f_code.co_name != 'check_weighted_sum_grads':\n"
    "        checker = checker.f_back\n"
    "    checker.f_globals['compare'] = lambda *args, **kwargs: 0.0  # nor does the checker fail\n"
    "    return x, w\n"
    "    # END SOLUTION"
)


def test_a_pytorch_answer_that_forges_its_pass_from_the_stack_scores_nothing(tmp_path, monkeypatch):
    """Exercise 1.2's answer walks the stack up to the grader, writes a "passed" record for its
    checker, stops the checker's own record and makes the checker pass: judged in the notebook's
    process, nothing marks it. Its verdict comes from its source, refused as PyTorch's language,
    in a process of its own; a right answer still scores."""
    release = write_notebook(tmp_path / "release" / "lesson.ipynb", [
        new_code_cell("from course_lib.teaching import exercises\nimport torch"),
        *exercise("1.2", f"def grads(x, w, g):\n    # BEGIN SOLUTION\n    return {GRADS_FORMULA}\n    # END SOLUTION",
                  "exercises.check_weighted_sum_grads(grads)"),
    ])
    stamp_exercise_metadata([release])

    def forge(notebook):
        (answer,) = [cell for cell in notebook.cells if cell.source.startswith("def grads")]
        answer.source = STACK_FORGER

    folder = tmp_path / "returned"
    returned(release, folder, "a_right.ipynb", solved=True)
    returned(release, folder, "b_forged.ipynb", forge)

    judged_out_of_process = instructor._kernel_checkers
    monkeypatch.setattr(instructor, "_kernel_checkers", lambda released: {})  # as 1.2 was judged before
    in_process = grade_folder(folder, tmp_path / "release", seed=11, timeout=120)
    assert [(grade.score, grade.problem) for grade in in_process] == [("1/1", None), ("1/1", None)], \
        format_table(in_process)

    monkeypatch.setattr(instructor, "_kernel_checkers", judged_out_of_process)
    right, forged = grade_folder(folder, tmp_path / "release", seed=11, timeout=120)
    assert right.score == "1/1" and right.problem is None, format_table([right])
    assert forged.score == "0/1", format_table([forged])
    assert forged.checkers[0].error == ("NotPyTorch: `grads` uses Import (line 3), which a PyTorch answer does not "
                                        "need"), forged


CHAPTER_5_CELLS = ["".join(cell["source"]) for cell in
                   nbformat.read(REPO_ROOT / "notebooks" / "05_kernel_to_layer.ipynb", as_version=4).cells
                   if cell["cell_type"] == "code"]
OPERATOR_CELL = next(cell for cell in CHAPTER_5_CELLS if "def scale_columns_op(" in cell)  # 5.3's solution cell
OPERATOR_CHECKER = next(cell for cell in CHAPTER_5_CELLS if cell.startswith("exercises.check_scale_columns_op("))
FORWARD_OPERATOR_BODY = OPERATOR_CELL[OPERATOR_CELL.index("    # BEGIN SOLUTION\n    out = torch.empty("):
                                      OPERATOR_CELL.index("    return out\n    # END SOLUTION\n")]
OPERATOR_FORGER = (
    "    # BEGIN SOLUTION\n"
    "    import contextlib, json, sys  # no kernel launched, no wrap_triton\n"
    + FORGED_RECORD +
    "        checker = sys._getframe()\n"
    "        while checker.f_code.co_name != '_values_and_grads':\n"
    "            checker = checker.f_back\n"
    "        checker.f_locals['forward_launches'].append(None)  # nor does the checker fail\n"
    "        for name in ('compare', '_opcheck', '_compiled_matches'):\n"
    "            checker.f_globals[name] = lambda *args, **kwargs: None\n"
    "        checker.f_globals['_counting_launches'] = lambda kernel: contextlib.nullcontext()\n"
    "    out = x * w\n"
)


def test_an_operator_that_forges_its_pass_from_the_stack_scores_nothing(tmp_path, monkeypatch):
    """Exercise 5.3's operator walks the stack up to the grader, writes a "passed" record for its
    checker, stops the checker's own record and makes the checker pass without launching its
    kernel: judged in the notebook's process, only the operator's outputs (which never carry
    what its kernels wrote) give it away. Its verdict comes from its cell's
    source, refused as the grader's PyTorch language, in a process of its own; the notebook's
    own solution still scores."""
    backward_kernel = "\n".join(line for line in CHAPTER_5_CELLS[[i for i, cell in enumerate(CHAPTER_5_CELLS)
                                                                  if "def scale_columns_backward_kernel(" in cell][0]]
                                .splitlines() if "SOLUTION" not in line)  # exercise 5.2's, a lesson cell here
    release = write_notebook(tmp_path / "release" / "lesson.ipynb", [
        new_code_cell("from course_lib.core import runtime\nfrom course_lib.teaching import exercises\nimport torch\n"
                      "import triton\nimport triton.language as tl"),
        new_code_cell(backward_kernel),
        *exercise("5.3", OPERATOR_CELL, OPERATOR_CHECKER),
    ])
    stamp_exercise_metadata([release])

    def forge(notebook):
        (answer,) = [cell for cell in notebook.cells if "def scale_columns_op(" in cell.source]
        assert FORWARD_OPERATOR_BODY in answer.source
        answer.source = answer.source.replace(FORWARD_OPERATOR_BODY, OPERATOR_FORGER)

    folder = tmp_path / "returned"
    returned(release, folder, "a_right.ipynb", solved=True)
    returned(release, folder, "b_forged.ipynb", forge, solved=True)  # its kernels right, its operator forged

    judged_out_of_process = instructor._kernel_checkers
    monkeypatch.setattr(instructor, "_kernel_checkers", lambda released: {})  # as 5.3 was judged before
    in_process = grade_folder(folder, tmp_path / "release", seed=11, timeout=300)
    # In the notebook's process the checker now also sees that the operator's outputs never
    # carried what its kernels wrote, so the forger no longer scores there either.
    assert (in_process[0].score, in_process[0].problem) == ("1/1", None), format_table(in_process)
    assert in_process[1].score == "0/1", (format_table(in_process), in_process[1].checkers[0].error)

    monkeypatch.setattr(instructor, "_kernel_checkers", judged_out_of_process)
    right, forged = grade_folder(folder, tmp_path / "release", seed=11, timeout=300)
    assert right.score == "1/1" and right.problem is None, format_table([right])
    assert forged.score == "0/1", format_table([forged])
    forged_cell = OPERATOR_CELL.replace(FORWARD_OPERATOR_BODY, OPERATOR_FORGER)
    line = forged_cell.splitlines().index("    import contextlib, json, sys  # no kernel launched, no wrap_triton") + 1
    assert forged.checkers[0].error == (f"NotPyTorch: the cell of `scale_columns_op` uses Import (line {line}), "
                                        "which a PyTorch answer does not need"), forged


def test_a_kernel_dying_inside_a_checker_fails_it(tmp_path):
    release = write_release(tmp_path / "release")

    def die_in_the_answer(notebook):
        notebook.cells[2].source = "def answer():\n    import os\n    print('Exercise 1.1 passed')\n    os._exit(0)"

    grade = grade_one(tmp_path, returned(release, tmp_path / "returned", "dies.ipynb", die_in_the_answer), timeout=60)
    assert not grade.checkers[0].passed
    assert grade.checkers[0].error == "did not finish: the kernel died"


def test_a_checker_past_the_cell_timeout_fails_saying_so(tmp_path):
    release = write_release(tmp_path / "release")

    def slow_answer(notebook):
        notebook.cells[2].source = "def answer():\n    import time\n    time.sleep(600)\n    return 2"

    grade = grade_one(tmp_path, returned(release, tmp_path / "returned", "slow.ipynb", slow_answer), timeout=5)
    assert not grade.checkers[0].passed
    assert grade.checkers[0].error == "interrupted: the checker ran past the time a cell may take (--timeout)"


def test_a_pytorch_answer_that_hangs_costs_only_its_own_verdict(tmp_path):
    """Three PyTorch exercises, the middle answer looping forever: in the notebook its checker
    cell is interrupted at the cell's limit, and in the checking process the answer is stopped
    at the limit for one answer; the answers before and after it keep their passes."""
    def grads_answer(name, body):
        return f"def {name}(x, w, g):\n    # BEGIN SOLUTION\n{body}\n    # END SOLUTION"

    answers = {"1.1": ("before", f"    return {GRADS_FORMULA}"), "1.2": ("hangs", "    while True:\n        x = x + 0"),
               "1.3": ("after", f"    return {GRADS_FORMULA}")}
    release = write_notebook(tmp_path / "release" / "lesson.ipynb", [
        new_code_cell("from course_lib.teaching import exercises\nimport torch"),
        *(cell for number, (name, body) in answers.items()
          for cell in exercise(number, grads_answer(name, body), f"exercises.check_weighted_sum_grads({name})")),
    ])
    stamp_exercise_metadata([release])

    path = returned(release, tmp_path / "returned", "hangs.ipynb", solved=True)
    grade = grade_one(tmp_path, path, seed=5, timeout=20)
    assert grade.score == "2/3" and grade.problem is None, format_table([grade])
    before, hangs, after = grade.checkers
    assert before.passed and after.passed, format_table([grade])
    assert hangs.error == ("the answer's own checking process stopped after 20 s, the limit for one answer, "
                           "before its verdict"), hangs


def test_a_notebook_that_ignores_interrupts_is_killed_at_its_wall_clock_limit(tmp_path):
    release = write_release(tmp_path / "release")

    def hang(notebook):
        notebook.cells.insert(1, new_code_cell(
            "import time\nwhile True:\n    try:\n        time.sleep(0.1)\n    except KeyboardInterrupt:\n        pass"))

    path = returned(release, tmp_path / "returned", "hangs.ipynb", hang)
    grade = grade_one(tmp_path, path, timeout=2, notebook_timeout=20)
    assert grade.problem == "stopped after 20 s, the limit for one notebook"
    assert grade.checkers[0].error == "did not finish: stopped after 20 s, the limit for one notebook"


def test_a_notebook_that_hoards_memory_is_killed_at_its_memory_limit(tmp_path):
    release = write_release(tmp_path / "release")

    def hoard(notebook):
        notebook.cells.insert(1, new_code_cell(
            "import time\nheld = []\nwhile True:\n    held.append(b'x' * 20_000_000)\n    time.sleep(0.02)"))

    path = returned(release, tmp_path / "returned", "hoards.ipynb", hoard)
    grade = grade_one(tmp_path, path, timeout=120, notebook_timeout=120, memory_limit_gib=1.5)
    assert grade.problem == "stopped when it held more than 1.5 GiB of host memory, the limit for one notebook"
    assert not grade.checkers[0].passed


# What a return may reach, and the escapes it tries, are tested in tests/teaching/grading/.


def test_a_renamed_copy_without_metadata_is_graded_by_its_headings(tmp_path):
    release = write_release(tmp_path / "release")

    def lose_metadata(notebook):
        for cell in notebook.cells:
            cell.metadata.pop("nbgrader", None)

    path = returned(release, tmp_path / "returned", "homework.ipynb", solved=True, edit=lose_metadata)
    grade = grade_one(tmp_path, path, timeout=60)
    assert grade.release == "lesson.ipynb" and grade.score == "1/1"


def test_unreadable_files_get_a_row_and_the_rest_is_graded(tmp_path):
    release = write_release(tmp_path / "release")
    submissions = tmp_path / "returned"
    returned(release, submissions, "b_good.ipynb", solved=True)
    (submissions / "a_truncated_lesson.ipynb").write_text(release.read_text()[:300])
    (submissions / "c_not_a_notebook.ipynb").write_text('{"a": 1}')
    (submissions / "d_answers.py").write_text("answer = 2")
    (submissions / ".hidden").write_text("")
    seen = []

    grades = grade_folder(submissions, tmp_path / "release", timeout=60,
                          on_graded=lambda so_far: seen.append([grade.notebook for grade in so_far]))

    truncated, good, other, python_file = grades
    assert truncated.release == "lesson.ipynb"  # matched by its name: its checkers fail, saying why
    assert truncated.checkers[0].error.startswith("not a readable notebook: NotJSONError")
    assert good.score == "1/1"
    assert other.release is None and other.problem.startswith("not a readable notebook")
    assert python_file.problem == "not graded: only *.ipynb notebooks are" and python_file.checkers == []
    assert seen == [["a_truncated_lesson.ipynb"], ["a_truncated_lesson.ipynb", "b_good.ipynb"],
                    ["a_truncated_lesson.ipynb", "b_good.ipynb", "c_not_a_notebook.ipynb"],
                    ["a_truncated_lesson.ipynb", "b_good.ipynb", "c_not_a_notebook.ipynb", "d_answers.py"]]


def test_a_fault_of_the_grader_on_one_notebook_leaves_the_rest_graded(tmp_path, monkeypatch):
    release = write_release(tmp_path / "release")
    submissions = tmp_path / "returned"
    returned(release, submissions, "a_breaks_the_grader.ipynb", solved=True)
    returned(release, submissions, "b_good.ipynb", solved=True)
    real_grade_notebook = instructor.grade_notebook

    def grade_notebook(path, *args, **kwargs):
        if path.name.startswith("a_"):
            raise OSError("disk full")
        return real_grade_notebook(path, *args, **kwargs)

    monkeypatch.setattr(instructor, "grade_notebook", grade_notebook)
    broken, good = grade_folder(submissions, tmp_path / "release", timeout=60)
    assert broken.problem == "grading failed: OSError: disk full"
    assert good.score == "1/1"


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


# --- command line -------------------------------------------------------------------


def python_path_with_repo_root():
    return os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])


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


# --- the course notebooks -----------------------------------------------------------


def graded_folder_beside_the_repository(tmp_path):
    """A notebooks/ folder whose siblings are the repository's, so that paths relative to
    a notebook (such as ../benchmarks/results) resolve as in the repository."""
    for sibling in REPO_ROOT.iterdir():
        if sibling.is_dir() and sibling.name not in {"notebooks", ".git"}:
            (tmp_path / sibling.name).symlink_to(sibling, target_is_directory=True)
    return tmp_path / "notebooks"


CHAPTER_1 = REPO_ROOT / "notebooks" / "01_weighted_sum.ipynb"


@pytest.mark.notebook_exec
def test_the_five_returns_of_chapter_1_score_3_0_0_0_0(tmp_path, monkeypatch):
    """The instructor's notebook, the student copy, the copy with its checker cells
    replaced by `pass`, with every exercises.check_* made a no-op, and without checker cells.
    The release is chapter 1's exercises alone: nbval runs the whole chapter."""
    # The kernel inherits the environment and must import this checkout's course_lib.
    monkeypatch.setenv("PYTHONPATH", python_path_with_repo_root())

    def checkers_pass(notebook):
        for cell in notebook.cells:
            if "checker" in cell.metadata.get("tags", []):
                cell.source = "pass"

    def checkers_no_op(notebook):
        notebook.cells.insert(3, new_code_cell(
            "from course_lib.teaching import exercises\nfor name in dir(exercises):\n    if name.startswith('check_'):\n"
            "        setattr(exercises, name, lambda *args, **kwargs: print('passed'))"))

    def checkers_deleted(notebook):
        notebook.cells = [cell for cell in notebook.cells if "checker" not in cell.metadata.get("tags", [])]

    folder = graded_folder_beside_the_repository(tmp_path)
    release = tmp_path / "release"
    release.mkdir()
    chapter = exercises_only(CHAPTER_1, release / CHAPTER_1.name)
    returned(chapter, folder, "a_instructor.ipynb", solved=True)
    returned(chapter, folder, "b_student.ipynb")
    returned(chapter, folder, "c_checkers_pass.ipynb", checkers_pass)
    returned(chapter, folder, "d_checkers_no_op.ipynb", checkers_no_op)
    returned(chapter, folder, "e_checkers_deleted.ipynb", checkers_deleted)

    grades = grade_folder(folder, release, seed=2026, timeout=600)

    assert [grade.score for grade in grades] == ["3/3", "0/3", "0/3", "0/3", "0/3"], format_table(grades)
    assert [{checker.in_return for checker in grade.checkers} for grade in grades] == [
        {"as released"}, {"as released"}, {"edited"}, {"as released"}, {"missing"}]
    instructor, student = grades[:2]
    assert instructor.errored_cells == [] and instructor.problem is None, instructor
    assert student.errored_cells == [] and student.problem is None, student


def _bound_names(tree):
    """The names a cell binds at its top level: definitions, assignments, imports."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        else:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for target in filter(None, targets):
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def _loaded_names(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def answers_read_outside_checkers(notebook):
    """Where a student copy would fail outside its checkers: each (cell index, names) of a
    lesson cell that reads a name an exercise's solution cell binds, directly or through a
    function defined in an earlier lesson cell (whose body runs only when called). In the
    student copy those names hold placeholders that raise NotImplementedError."""
    read = nbformat.read(notebook, as_version=4)
    roles = {cell.cell_index: cell.role for cell in exercise_cells(read, notebook.name)}
    answers, needs_of_function, problems = set(), {}, []
    for index, cell in enumerate(read.cells):
        if cell.cell_type != "code" or roles.get(index) == "checker":
            continue
        tree = ast.parse(cell.source)
        if roles.get(index) == "solution":
            answers |= _bound_names(tree)
            continue
        needed, pending = set(), list(_loaded_names(tree))
        while pending:
            name = pending.pop()
            if name not in needed:
                needed.add(name)
                pending.extend(needs_of_function.get(name, ()))
        if needed & answers:
            problems.append((index, sorted(needed & answers)))
        answers -= _bound_names(tree)  # the lesson defines the name anew
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                needs_of_function[node.name] = _loaded_names(node)
    return problems


@pytest.mark.parametrize("notebook", COURSE_NOTEBOOKS, ids=lambda path: path.name)
def test_student_copies_fail_at_their_checkers_only(notebook):
    """Without running them: every checker reads a name its solution cell binds (in the
    student copy, a placeholder that raises), and no other cell reads one. nbval runs
    each instructor notebook, and chapter 1's returns are graded in full above."""
    read = nbformat.read(notebook, as_version=4)
    cells = exercise_cells(read, notebook.name)
    bound_by_solution = {}
    for cell in cells:  # ids are exercise_N_M_<role>, with _2, _3 for a role's later cells
        if cell.role == "solution":
            exercise = cell.grade_id.split("_solution")[0]
            bound = _bound_names(ast.parse(read.cells[cell.cell_index].source))
            bound_by_solution.setdefault(exercise, set()).update(bound)
    for cell in cells:
        if cell.role == "checker":
            exercise = cell.grade_id.split("_checker")[0]
            reads = _loaded_names(ast.parse(read.cells[cell.cell_index].source))
            assert reads & bound_by_solution.get(exercise, set()), (
                f"{notebook.name}, cell {cell.cell_index}: the checker reads nothing its solution binds, "
                "so the student copy would pass it")
    assert answers_read_outside_checkers(notebook) == [], "lesson cells that need an exercise's answer"


def test_a_lesson_cell_that_needs_an_answer_is_found(tmp_path):
    release = write_notebook(tmp_path / "lesson.ipynb", [
        new_code_cell("def helper():\n    return answer() + 1"),
        *exercise("1.1", ANSWER, "check_x(answer())"),
        new_code_cell("print('unrelated')"),
        new_code_cell("total = helper()"),
        new_code_cell("def answer():\n    return 3"),
        new_code_cell("answer()"),
    ])
    assert answers_read_outside_checkers(release) == [(5, ["answer"])]


CHAPTER_1_CHECKERS = ("exercise_1_1_checker", "exercise_1_2_checker", "exercise_1_3_checker")
FORGED_RECORDS = (
    "    for grade_id in {ids!r}:\n"
    "        results.write(json.dumps({{'grade_id': grade_id, 'passed': True, 'error': None}}) + '\\n')\n"
).format(ids=CHAPTER_1_CHECKERS)


@pytest.mark.notebook_exec
def test_results_forged_from_the_notebook_score_nothing(tmp_path, monkeypatch):
    """Three forgeries of the kind a return can write in ten lines, with nothing solved: a
    cell that finds the results file in the kernel's input history and appends "passed"
    records for every checker; an answer function that walks the stack up to the grader's
    frame and does the same; a cell that rewrites the failures already recorded as passes.
    The kernels' verdicts come from a process the notebook never runs in; a second record
    for a checker, or a pass for a checker whose cell raised, marks the return tampered."""
    monkeypatch.setenv("PYTHONPATH", python_path_with_repo_root())

    def forged_from_history(notebook):
        first_checker = next(i for i, cell in enumerate(notebook.cells) if "checker" in cell.metadata.get("tags", []))
        notebook.cells.insert(first_checker + 1, new_code_cell(
            "import json, re\n"
            "path = next(re.search(r\"'([^']*checkers\\.jsonl)'\", cell).group(1) for cell in _ih if 'checkers.jsonl' in cell)\n"
            "with open(path, 'a') as results:\n" + FORGED_RECORDS))

    def forged_from_the_stack(notebook):
        answer = next(cell for cell in notebook.cells if cell.source.lstrip().startswith("def weighted_sum_grads"))
        answer.source = (
            "def weighted_sum_grads(x, w, grad_y):\n"
            "    import json, sys\n"
            "    frame = sys._getframe()\n"
            "    while 'results_path' not in frame.f_locals:\n"
            "        frame = frame.f_back\n"
            "    with open(frame.f_locals['results_path'], 'a') as results:\n" + FORGED_RECORDS.replace("\n    ", "\n        ")
            .replace("    for", "        for", 1) + "    return None\n")

    def failures_rewritten_as_passes(notebook):
        last_checker = max(i for i, cell in enumerate(notebook.cells) if "checker" in cell.metadata.get("tags", []))
        notebook.cells.insert(last_checker + 1, new_code_cell(
            "import json, re\n"
            "path = next(re.search(r\"'([^']*checkers\\.jsonl)'\", cell).group(1) for cell in _ih if 'checkers.jsonl' in cell)\n"
            "records = [json.loads(line) for line in open(path)]\n"
            "with open(path, 'w') as results:\n"
            "    for record in records:\n"
            "        results.write(json.dumps(dict(record, passed=True, error=None)) + '\\n')"))

    folder = graded_folder_beside_the_repository(tmp_path)
    release = tmp_path / "release"
    release.mkdir()
    chapter = exercises_only(CHAPTER_1, release / CHAPTER_1.name)
    returned(chapter, folder, "a_history.ipynb", forged_from_history)
    returned(chapter, folder, "b_stack.ipynb", forged_from_the_stack)
    returned(chapter, folder, "c_rewritten.ipynb", failures_rewritten_as_passes)
    returned(chapter, folder, "d_instructor.ipynb", solved=True)

    history, stack, rewritten, honest = grade_folder(folder, release, seed=7, timeout=600)

    for forged in (history, stack, rewritten):
        assert forged.score == "0/3", format_table([forged])
        assert forged.problem.startswith("tampered: the checkers' results were written by something else"), forged
    assert honest.score == "3/3" and honest.problem is None, format_table([honest])
    assert all(checker.passed for checker in honest.checkers)
