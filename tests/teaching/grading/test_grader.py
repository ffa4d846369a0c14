import shutil

import pytest

from course_lib.teaching.exercise_metadata import stamp_exercise_metadata
from course_lib.teaching.grading import grader
from course_lib.teaching.grading.gradebook import format_table
from course_lib.teaching.grading.grader import grade_folder
from course_lib.teaching.grading.results import CellError, CheckerResult

nbformat = pytest.importorskip("nbformat")
notebook_v4 = pytest.importorskip("nbformat.v4")
pytest.importorskip("nbclient")
from exercise_notebook import exercises_only  # noqa: E402  (needs nbformat)
from instructor_notebooks import (REPO_ROOT, exercise, grade_one, new_code_cell,  # noqa: E402
                                  python_path_with_repo_root, returned, write_notebook, write_release)


@pytest.fixture(autouse=True)
def package_to_guard(tmp_path_factory, monkeypatch):
    """Grading guards the package it grades with (puts back what a return wrote there): here a
    copy, so that a test's attack, or grading while someone edits the package, cannot touch the
    real one."""
    copy = tmp_path_factory.getbasetemp() / "guarded_package" / "course_lib"
    if not copy.exists():
        shutil.copytree(grader.PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(grader, "PACKAGE_DIR", copy)
    return copy


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

    judged_out_of_process = grader.out_of_process_checkers
    monkeypatch.setattr(grader, "out_of_process_checkers", lambda released: {})  # as 1.2 was judged before
    in_process = grade_folder(folder, tmp_path / "release", seed=11, timeout=120)
    assert [(grade.score, grade.problem) for grade in in_process] == [("1/1", None), ("1/1", None)], \
        format_table(in_process)

    monkeypatch.setattr(grader, "out_of_process_checkers", judged_out_of_process)
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

    judged_out_of_process = grader.out_of_process_checkers
    monkeypatch.setattr(grader, "out_of_process_checkers", lambda released: {})  # as 5.3 was judged before
    in_process = grade_folder(folder, tmp_path / "release", seed=11, timeout=300)
    # In the notebook's process the checker now also sees that the operator's outputs never
    # carried what its kernels wrote, so the forger no longer scores there either.
    assert (in_process[0].score, in_process[0].problem) == ("1/1", None), format_table(in_process)
    assert in_process[1].score == "0/1", (format_table(in_process), in_process[1].checkers[0].error)

    monkeypatch.setattr(grader, "out_of_process_checkers", judged_out_of_process)
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
    real_grade_notebook = grader.grade_notebook

    def grade_notebook(path, *args, **kwargs):
        if path.name.startswith("a_"):
            raise OSError("disk full")
        return real_grade_notebook(path, *args, **kwargs)

    monkeypatch.setattr(grader, "grade_notebook", grade_notebook)
    broken, good = grade_folder(submissions, tmp_path / "release", timeout=60)
    assert broken.problem == "grading failed: OSError: disk full"
    assert good.score == "1/1"


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
