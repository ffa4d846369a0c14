"""Running a notebook top to bottom in a fresh ``python3`` kernel: how the stored outputs are
made (:func:`execute_in_place`), and how grading runs a return."""

from __future__ import annotations

from pathlib import Path

from ..core.runtime import ON_GPU
from .exercise_metadata import INSTALL_HINT, import_instructor_dependency


INTERPRETER_OUTPUT = "interpreter-output"  # a cell whose outputs only the CPU interpreter can make
KERNEL_NAME = "python3"
DEFAULT_TIMEOUT = 600


def execute_notebook(notebook, folder: Path, timeout: int, allow_errors: bool) -> None:
    """Run ``notebook`` in a fresh ``python3`` kernel from ``folder``, outputs in place."""
    nbclient = import_instructor_dependency("nbclient")
    kernelspec = import_instructor_dependency("jupyter_client.kernelspec")
    client = nbclient.NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name=KERNEL_NAME,
        allow_errors=allow_errors,
        interrupt_on_timeout=allow_errors,
        resources={"metadata": {"path": str(Path(folder).resolve())}},
    )
    try:
        client.execute()
    except kernelspec.NoSuchKernel as error:
        raise RuntimeError(f"no {KERNEL_NAME!r} Jupyter kernel. Install one with: {INSTALL_HINT}") from error


def execute_in_place(paths, timeout: int = DEFAULT_TIMEOUT) -> None:
    """Re-execute notebooks top to bottom and save them with the new outputs.

    This is how the stored outputs are made (on a GPU, by ``make gpu-run``); any cell
    that raises stops it, so a broken notebook is never saved. Cells tagged
    INTERPRETER_OUTPUT draw what only Triton's CPU interpreter can (course_lib.teaching.accesses):
    run on a GPU, they keep the outputs the interpreter made.
    """
    nbformat = import_instructor_dependency("nbformat")
    for path in map(Path, paths):
        notebook = nbformat.read(path, as_version=4)
        kept = {cell.id: cell.outputs for cell in notebook.cells
                if INTERPRETER_OUTPUT in cell.metadata.get("tags", [])} if ON_GPU else {}
        execute_notebook(notebook, path.parent, timeout, allow_errors=False)
        for cell in notebook.cells:
            if cell.get("id") in kept:
                cell.outputs = kept[cell.id]
        nbformat.write(notebook, path)
