"""The copies of course_lib that grading runs returns and checkers from: each made from one snapshot
of the package, taken before any return runs, so that nothing a return writes reaches another."""

from __future__ import annotations

from pathlib import Path


PACKAGE_DIR = Path(__file__).resolve().parents[2]  # course_lib itself


def package_snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (caches aside), by relative path, as bytes: taken once for a
    class, so that each return, and each checking process, gets a fresh copy of the package
    as it was when grading began."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*"))
            if path.is_file() and "__pycache__" not in path.parts}


def _write_snapshot(snapshot: dict[str, bytes], folder: Path) -> None:
    for relative, content in snapshot.items():
        target = folder / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)


def fresh_package(snapshot: dict[str, bytes], folder: Path) -> Path:
    """A copy of course_lib at ``folder/package/course_lib``, from ``snapshot``."""
    package_copy = folder / "package" / "course_lib"
    _write_snapshot(snapshot, package_copy)
    return package_copy
