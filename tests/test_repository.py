"""One repository URL (scripts/repository.py): _config.yml's, named by every install line."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("repository", ROOT / "scripts" / "repository.py")
repository = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(repository)


def copy_of_the_places(tmp_path):
    for path in [ROOT / repository.CONFIG, *repository.places()]:
        target = tmp_path / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    return tmp_path


def test_every_place_names_the_configured_repository():
    assert repository.disagreements() == []
    url = repository.configured_url()
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert notebooks and all(f"course-lib @ git+{url}" in repository.first_code_cell(path) for path in notebooks)


def test_a_notebook_naming_another_repository_is_found(tmp_path):
    root = copy_of_the_places(tmp_path)
    notebook = sorted((root / "notebooks").glob("*.ipynb"))[0]
    url = repository.configured_url(root)
    notebook.write_text(notebook.read_text().replace(url, "https://github.com/elsewhere/old-name"))
    found = repository.disagreements(root)
    name = f"notebooks/{notebook.name}"
    assert f"{name}: names https://github.com/elsewhere/old-name, not {url} (_config.yml)" in found
    assert f"{name}: its first code cell does not install `course-lib @ git+{url}`" in found


def test_set_rewrites_the_url_and_nothing_else(tmp_path):
    root = copy_of_the_places(tmp_path)
    old, new = repository.configured_url(root), "https://github.com/someone/triton-fork"
    repository.set_url(new, root)
    assert repository.configured_url(root) == new
    assert repository.disagreements(root) == []
    for path in [root / repository.CONFIG, *repository.places(root)]:
        original = (ROOT / path.relative_to(root)).read_text()
        assert old in original, path
        assert path.read_text() == original.replace(old, new), path
        if path.suffix == ".ipynb":
            json.loads(path.read_text())  # still a notebook


@pytest.mark.parametrize("url", ["https://gitlab.com/someone/fork", "github.com/someone/fork",
                                 "https://github.com/someone", "https://github.com/someone/fork.git"])
def test_set_refuses_what_colab_cannot_open(tmp_path, url):
    root = copy_of_the_places(tmp_path)
    with pytest.raises(ValueError, match="is not a GitHub repository URL"):
        repository.set_url(url, root)
    assert repository.configured_url(root) == repository.configured_url()  # nothing written
