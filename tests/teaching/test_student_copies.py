import ast

import pytest

from course_lib.teaching.exercise_metadata import exercise_cells
from course_lib.teaching.student_copies import (exercise_table, make_solutions_pages, make_student_copies,
                                               make_student_copy)

nbformat = pytest.importorskip("nbformat")
notebook_v4 = pytest.importorskip("nbformat.v4")
pytest.importorskip("nbclient")
from instructor_notebooks import (ANSWER, COURSE_NOTEBOOKS, REPO_ROOT, exercise,  # noqa: E402
                                  new_code_cell, new_markdown_cell, read_cells, solution_cell, write_notebook)
new_output = notebook_v4.new_output


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


def student_copy_of(tmp_path, cells):
    """The student copy's cells after the exercise heading, which comes first as cell 0."""
    source = write_notebook(tmp_path / "lesson.ipynb", [new_markdown_cell("### Exercise 1.1: a task"), *cells])
    return read_cells(make_student_copy(source, tmp_path / "student" / "lesson.ipynb"))[1:]


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
    (page,) = make_solutions_pages(tmp_path, tmp_path / "pages")
    text = page.read_text()
    assert text.startswith("# Solutions: A lesson\n")
    assert "## Exercise 1.1" in text and "def answer():\n    return 2" in text and "SOLUTION" not in text


def test_the_exercise_table_lists_every_exercise():
    table = exercise_table()
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
