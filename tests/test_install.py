"""course_lib as pip installs it: the wheel carries the benchmark results the notebooks plot,
an installed copy with no repository beside it loads them, and building it leaves nothing
that git would list as untracked."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from course_lib.core import benchmarking

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ["pyproject.toml", "README.md", "course_lib"]  # what the wheel is built from


def run(*command, **kwargs):
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, command))} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_an_installed_course_lib_loads_its_results(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, source / name)
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
        "--wheel-dir", tmp_path / "dist", source)

    # The benchmarks' files, and chapter 7's training runs in training/.
    stored = sorted(path.relative_to(benchmarking.RESULTS_DIR).as_posix()
                    for path in benchmarking.RESULTS_DIR.rglob("*.json"))
    assert stored, f"no results in {benchmarking.RESULTS_DIR}"
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    shipped = sorted(name for name in zipfile.ZipFile(wheel).namelist() if name.startswith("course_lib/results/"))
    assert shipped == [f"course_lib/results/{name}" for name in stored]

    # Whatever the build left beside the sources (build/, *.egg-info) must be ignored by git.
    leftovers = sorted(f"{path.name}/" if path.is_dir() else path.name
                       for path in source.iterdir() if path.name not in SOURCES)
    # check-ignore prints the ignored ones and exits 1 when there are none.
    ignored = subprocess.run(["git", "-C", ROOT, "check-ignore", "--no-index", *leftovers],
                             capture_output=True, text=True).stdout.split() if leftovers else []
    assert ignored == leftovers, f"not ignored by .gitignore: {sorted(set(leftovers) - set(ignored))}"

    site = tmp_path / "site"
    run(sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile", "--target", site, wheel)
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    loaded = run(sys.executable, "-c", "from course_lib.core import benchmarking as b; from course_lib.models import recall_task as r; "
                 "print(b.RESULTS_DIR); print(*sorted(b.load_results())); print(*sorted(r.load_training_runs()))",
                 cwd=tmp_path, env={**environment, "PYTHONPATH": str(site)}).splitlines()
    def stems(folder):
        return " ".join(Path(name).stem for name in stored if Path(name).parent == Path(folder))
    assert loaded == [str(site / "course_lib" / "results"), stems("."), stems("training")]
