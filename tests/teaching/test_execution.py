import pytest

from course_lib.teaching import execution
from course_lib.teaching.execution import execute_in_place

nbformat = pytest.importorskip("nbformat")
notebook_v4 = pytest.importorskip("nbformat.v4")
pytest.importorskip("nbclient")
from instructor_notebooks import new_code_cell  # noqa: E402
new_output = notebook_v4.new_output


@pytest.mark.notebook_exec
def test_a_gpu_run_keeps_the_interpreters_outputs_of_tagged_cells(tmp_path, monkeypatch):
    monkeypatch.setattr(execution, "ON_GPU", True)
    drawn = [new_output("stream", name="stdout", text="drawn by the interpreter\n")]
    tagged = new_code_cell("print('compiled on the GPU')", metadata={"tags": ["interpreter-output"]}, outputs=drawn)
    path = tmp_path / "chapter.ipynb"
    nbformat.write(notebook_v4.new_notebook(cells=[tagged, new_code_cell("print('ran')")]), path)
    execute_in_place([path])
    kept, ran = nbformat.read(path, as_version=4).cells
    assert [output["text"] for output in kept.outputs] == ["drawn by the interpreter\n"]
    assert [output["text"] for output in ran.outputs] == ["ran\n"]
