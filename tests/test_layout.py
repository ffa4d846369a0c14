"""The package's architecture, as course_lib/__init__.py states it: four rooms (core,
kernels, models, teaching) whose imports point only downward, no kernel module importing
another, no module named like a function the package exports, public names only across
the boundary to the notebooks, and no import workarounds left in the repository."""

import ast
import json
import re
from pathlib import Path

import pytest

import course_lib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "course_lib"
# Lower rooms first: a module may import from its own room or the rooms before it.
ROOMS = ["core", "kernels", "models", "teaching"]


def module_name(path):
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path):
    """The course_lib modules ``path`` imports, as dotted names."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("course_lib"):
                found.add(target)
                found.update(f"{target}.{alias.name}" for alias in node.names)  # a submodule or a name
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("course_lib"))
    return found


def room_of(dotted):
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ROOMS else None


def kernel_of(dotted):
    """'course_lib.kernels.layernorm_op.wide_rows' -> 'layernorm_op'."""
    parts = dotted.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "kernels" else None


SOURCES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(ROOT)))
def test_imports_point_only_downward(path):
    source = module_name(path)
    room = room_of(source)
    if room is None:  # course_lib/__init__.py and registry.py sit above the rooms
        return
    for target in imported_modules(path):
        target_room = room_of(target)
        assert target_room is not None or target == "course_lib", f"{source} imports {target}, above the rooms"
        if target == "course_lib":
            continue
        assert ROOMS.index(target_room) <= ROOMS.index(room), f"{source} ({room}) imports {target} ({target_room})"
        if room == "kernels" == target_room and kernel_of(source) and kernel_of(target):
            assert kernel_of(source) == kernel_of(target), f"kernel module {source} imports another kernel, {target}"


def test_no_module_is_named_like_an_exported_function():
    stems = {path.stem for path in SOURCES} | {path.name for path in PACKAGE.rglob("*") if path.is_dir()}
    exported = {name for name in course_lib.__all__ if not isinstance(getattr(course_lib, name), type(course_lib))}
    assert not stems & exported


def test_the_users_api_is_at_the_top():
    for name in ["weighted_sum", "softmax", "causal_softmax", "layernorm", "LayerNorm", "coor_descent",
                 "local_causal_attention", "RoutedBlock", "CoordinateDescentRouter", "RecallTask", "train_recall"]:
        assert name in course_lib.__all__ and callable(getattr(course_lib, name))
    readme = (ROOT / "README.md").read_text()
    usage = readme[readme.index("## Using the package"):]
    for name in course_lib.__all__:
        assert name in usage, f"the README's usage section does not mention {name}"


def repository_sources():
    for path in [*ROOT.glob("tests/**/*.py"), *ROOT.glob("benchmarks/*.py"), *ROOT.glob("scripts/**/*")]:
        if path.is_file():
            yield path, path.read_text()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        yield path, "\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "code")


def test_no_import_workarounds():
    workaround = re.compile(r"import_module\(\s*[\"']course_lib|sys\.modules\[\s*[\"']course_lib\.(?!teaching)")
    found = [str(path.relative_to(ROOT)) for path, text in repository_sources()
             if path.name != "test_layout.py" and workaround.search(text)]
    assert not found


def test_notebooks_import_only_public_names():
    statement = re.compile(r"from course_lib[\w.]* import (\([^)]*\)|[^\n]*)")
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            for names in statement.findall("".join(cell["source"])):
                names = re.sub(r"#[^\n]*", "", names).strip("()")
                underscored = [n.strip() for n in names.split(",") if n.strip().startswith("_")]
                assert not underscored, f"{path.name} imports {underscored}"
