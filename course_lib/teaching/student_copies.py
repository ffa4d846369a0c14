"""What the course releases from the instructors' notebooks: the student copies (the solutions
replaced by placeholders), the book's solutions pages and the table of every exercise."""

from __future__ import annotations

from pathlib import Path

from .exercise_metadata import (BEGIN_SOLUTION, CHECKER_TAG, END_SOLUTION, SOLUTION_ROLE, SOLUTION_TAG, TASK_ROLE,
                                cell_tags, exercise_cells, import_instructor_dependency, notebooks_in, stamp)


HIDE_INPUT_TAG = "hide-input"
REMOVE_IN_STUDENT_TAG = "remove-in-student"
# Where the student copies are kept (the book's chapter pages and the launch buttons' target)
# and where the book's solutions pages are written, relative to the repository.
STUDENT_DIR = "student"
SOLUTIONS_DIR = "book/solutions"
STUDENT_PLACEHOLDER = ("# YOUR CODE HERE", "pass")


def _is_marker(line: str, marker: str) -> bool:
    return line.strip() == marker


def _replace_solution_blocks(source: str, where: str) -> str:
    """Replace each marked block, markers included, by the placeholder at its indentation.

    ``where`` names the notebook and cell in error messages. A cell with no block, an
    ``# END SOLUTION`` without its ``# BEGIN SOLUTION``, a nested or an unclosed block is
    an error, so that a solution can never slip through into a student copy.
    """
    student_lines: list[str] = []
    block_indent: str | None = None
    blocks_found = 0
    for line_number, line in enumerate(source.split("\n"), start=1):
        if _is_marker(line, BEGIN_SOLUTION):
            if block_indent is not None:
                raise ValueError(f"{where}: nested {BEGIN_SOLUTION!r} at line {line_number}")
            block_indent = line[: len(line) - len(line.lstrip())]
        elif _is_marker(line, END_SOLUTION):
            if block_indent is None:
                raise ValueError(
                    f"{where}: {END_SOLUTION!r} at line {line_number} "
                    f"has no {BEGIN_SOLUTION!r} before it"
                )
            student_lines.extend(block_indent + text for text in STUDENT_PLACEHOLDER)
            block_indent = None
            blocks_found += 1
        elif block_indent is None:
            student_lines.append(line)
    if block_indent is not None:
        raise ValueError(f"{where}: {BEGIN_SOLUTION!r} is never closed by {END_SOLUTION!r}")
    if blocks_found == 0:
        raise ValueError(
            f"{where}: tagged {SOLUTION_TAG!r} but has no "
            f"{BEGIN_SOLUTION!r} ... {END_SOLUTION!r} block"
        )
    return "\n".join(student_lines)


def _without_run_metadata(cell) -> None:
    """Drop what the instructors' run left on a cell: its execution count and timings."""
    cell.metadata.pop("execution", None)
    if cell.cell_type == "code":
        cell.execution_count = None


def solutions_page_link(notebook_stem: str) -> str:
    """The line a student copy adds under each exercise statement: where its solution is."""
    return (f"Stuck after the hints? The solution is on [this chapter's solutions page]"
            f"(../{SOLUTIONS_DIR}/{notebook_stem}.md).")


def make_student_copy(src_path: str | Path, dest_path: str | Path) -> Path:
    """Write the student version of the notebook ``src_path`` to ``dest_path``.

    Solutions are replaced by ``# YOUR CODE HERE`` / ``pass`` and their cells lose the
    ``hide-input`` tag; cells tagged ``remove-in-student`` are dropped; the outputs of
    solution and checker cells (which came from the solution) are cleared, the others
    kept (the book's chapter pages are these copies, with the course's GPU outputs); execution
    counts and timings are dropped; each exercise statement ends with a link to the chapter's
    solutions page. Raises ValueError, naming the notebook and cell index, for a solution
    cell whose markers are missing or malformed, and for any ``# BEGIN SOLUTION`` line left
    outside a solution cell.
    """
    nbformat = import_instructor_dependency("nbformat")
    src_path, dest_path = Path(src_path), Path(dest_path)
    notebook = nbformat.read(src_path, as_version=4)
    stamp(notebook, src_path.name)  # the ids by which grading finds the checker cells
    roles = {cell.cell_index: cell.role for cell in exercise_cells(notebook, src_path.name)}

    kept_cells = []
    for cell_index, cell in enumerate(notebook.cells):
        tags = cell_tags(cell)
        if REMOVE_IN_STUDENT_TAG in tags:
            continue
        _without_run_metadata(cell)
        if roles.get(cell_index) == TASK_ROLE:
            cell.source = cell.source.rstrip() + "\n\n" + solutions_page_link(src_path.stem)
        if cell.cell_type == "code":
            if SOLUTION_TAG in tags:
                where = f"{src_path.name}, cell {cell_index}"
                cell.source = _replace_solution_blocks(cell.source, where)
                cell.metadata["tags"] = [tag for tag in tags if tag != HIDE_INPUT_TAG]
            if SOLUTION_TAG in tags or CHECKER_TAG in tags:
                cell.outputs = []
        kept_cells.append((cell_index, cell))

    # A marked solution in a cell not tagged `solution` would otherwise reach students.
    for cell_index, cell in kept_cells:
        if any(_is_marker(line, BEGIN_SOLUTION) for line in cell.source.split("\n")):
            raise ValueError(
                f"{src_path.name}, cell {cell_index}: contains {BEGIN_SOLUTION!r} but is "
                f"not tagged {SOLUTION_TAG!r}; tag it, or tag it {REMOVE_IN_STUDENT_TAG!r}"
            )

    notebook.cells = [cell for _, cell in kept_cells]
    dest_path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, dest_path)
    return dest_path


def make_student_copies(src_dir: str | Path, dest_dir: str | Path) -> list[Path]:
    """Write a student copy of each ``*.ipynb`` in ``src_dir`` (not recursive) to ``dest_dir``."""
    notebooks = notebooks_in(src_dir)
    dest_dir = Path(dest_dir)
    if dest_dir.resolve() == Path(src_dir).resolve():
        raise ValueError(f"{dest_dir} is the source folder; student copies would overwrite it")
    return [make_student_copy(notebook, dest_dir / notebook.name) for notebook in notebooks]


def _solution_code(source: str) -> str:
    """A solution cell's code as the solutions page shows it: the markers left out."""
    return "\n".join(line for line in source.split("\n")
                     if not (_is_marker(line, BEGIN_SOLUTION) or _is_marker(line, END_SOLUTION))).strip()


def solutions_page(src_path: str | Path) -> str:
    """The markdown of one chapter's solutions page: each exercise's heading and the code of
    its solution cells, from the instructors' notebook ``src_path``."""
    nbformat = import_instructor_dependency("nbformat")
    src_path = Path(src_path)
    notebook = nbformat.read(src_path, as_version=4)
    title = next((cell.source.split("\n", 1)[0].lstrip("# ").strip() for cell in notebook.cells
                  if cell.cell_type == "markdown" and cell.source.startswith("# ")), src_path.stem)
    lines = [f"# Solutions: {title}", "",
             f"The answers to the exercises of [the chapter](../../{STUDENT_DIR}/{src_path.stem}.ipynb). "
             "Try the hints under each exercise first: a kernel you wrote yourself teaches more than one you read.",
             ""]
    for exercise_cell in exercise_cells(notebook, src_path.name):
        cell = notebook.cells[exercise_cell.cell_index]
        if exercise_cell.role == TASK_ROLE:
            lines += ["", cell.source.split("\n", 1)[0].replace("###", "##", 1), ""]
        elif exercise_cell.role == SOLUTION_ROLE:
            lines += ["```python", _solution_code(cell.source), "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def make_solutions_pages(src_dir: str | Path, dest_dir: str | Path) -> list[Path]:
    """Write one solutions page (markdown) for each ``*.ipynb`` of ``src_dir`` into ``dest_dir``."""
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for notebook in notebooks_in(src_dir):
        path = dest_dir / f"{notebook.stem}.md"
        path.write_text(solutions_page(notebook), encoding="utf-8")
        written.append(path)
    return written


def exercise_table() -> str:
    """The instructors' table of every exercise (``exercises.EXERCISES``), as markdown."""
    from .exercises import EXERCISES

    rows = ["| Exercise | Title | Answer | Skills | Difficulty (1–5) | Minutes |", "|---|---|---|---|---|---|"]
    for exercise in EXERCISES:
        answer = "a `@triton.jit` kernel" if exercise.kernel else "PyTorch"
        rows.append(f"| {exercise.number} | {exercise.title} | {answer} | {exercise.skills} | "
                    f"{exercise.difficulty} | {exercise.minutes} |")
    kernels = sum(exercise.kernel for exercise in EXERCISES)
    minutes = sum(exercise.minutes for exercise in EXERCISES)
    rows += ["", f"{len(EXERCISES)} exercises, {kernels} of them kernels; about {minutes / 60:.0f} hours in all."]
    return "\n".join(rows) + "\n"
