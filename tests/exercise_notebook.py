"""A chapter cut down to what grading reads: its setup cells and its exercises (each
exercise's heading, stub or solution and checker cells), so the grading tests execute the
real exercise cells without running the whole lesson again (nbval already does)."""

import nbformat


def _is_heading(cell):
    return cell.cell_type == "markdown" and cell.source.lstrip().startswith("#")


def exercises_only(chapter, path):
    """Write chapter's setup (the cells before its first section) and its exercises to path."""
    notebook = nbformat.read(chapter, as_version=4)
    kept, keeping, in_setup = [], True, True
    for cell in notebook.cells:
        if _is_heading(cell):
            section = cell.source.lstrip().splitlines()[0]
            if section.startswith("## "):
                in_setup = False
            keeping = in_setup or section.lstrip("#").strip().startswith("Exercise")
        if keeping:
            kept.append(cell)
    notebook.cells = kept
    nbformat.write(notebook, path)
    return path
