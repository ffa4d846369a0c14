import json
import subprocess
import sys
from pathlib import Path


SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "restore_interpreter_outputs.py"


def notebook(outputs_by_id, tagged):
    return {"cells": [{"id": cell_id, "cell_type": "code", "source": "", "outputs": outputs,
                       "metadata": {"tags": ["interpreter-output"]} if cell_id in tagged else {}}
                      for cell_id, outputs in outputs_by_id.items()]}


def run(before, after, tmp_path):
    (tmp_path / "before").mkdir()
    (tmp_path / "before" / "ch.ipynb").write_text(json.dumps(before))
    (tmp_path / "ch.ipynb").write_text(json.dumps(after))
    return subprocess.run([sys.executable, SCRIPT, tmp_path / "before", tmp_path / "ch.ipynb"],
                          capture_output=True, text=True)


def test_tagged_cells_get_their_interpreter_outputs_back_and_the_others_keep_the_gpus(tmp_path):
    before = notebook({"a": ["cpu picture"], "b": ["cpu value"]}, tagged={"a"})
    after = notebook({"a": ["compiled on the GPU"], "b": ["gpu value"]}, tagged={"a"})
    assert run(before, after, tmp_path).returncode == 0
    cells = json.loads((tmp_path / "ch.ipynb").read_text())["cells"]
    assert [cell["outputs"] for cell in cells] == [["cpu picture"], ["gpu value"]]


def test_a_tagged_cell_missing_after_the_run_is_an_error(tmp_path):
    result = run(notebook({"a": ["cpu picture"]}, tagged={"a"}), notebook({"b": []}, tagged=set()), tmp_path)
    assert result.returncode != 0 and "cells ['a'] tagged interpreter-output are gone" in result.stderr
