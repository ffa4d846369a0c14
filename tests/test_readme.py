"""The README's Python examples run as printed, in a fresh process, as a user of the package
runs them: without the interpreter switched on (CPU tensors then go to the PyTorch references;
on a GPU the kernels run)."""

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_examples():
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_the_readme_shows_the_public_functions():
    code = "\n".join(python_examples())
    assert "from course_lib import" in code and "RoutedBlock" in code and "train_recall" in code


def test_the_readme_examples_run_as_printed():
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", "\n".join(python_examples())], capture_output=True, text=True,
                            env=environment, timeout=900, cwd=README.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "course_lib:" in result.stdout
