"""The exercise catalogue (course_lib/teaching/exercises/__init__.py's EXERCISES) matches the
chapters, and the chapters hold the ramp of kernel exercises the course promises."""

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from course_lib.teaching import exercises

NOTEBOOKS = sorted((Path(__file__).resolve().parents[3] / "notebooks").glob("*.ipynb"))
HEADING = re.compile(r"###\s+Exercise\s+(\d+\.\d+):\s*(.*)")
MIN_KERNEL_EXERCISES, MIN_KERNELS_A_CHAPTER = 14, 2


def _plain(title):
    return re.sub(r"[`$]", "", title).strip().lower()


def notebook_exercises():
    """(number, title, task source, solution source, checker source) of every exercise, in order."""
    found = []
    for path in NOTEBOOKS:
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"])
            grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")
            heading = HEADING.match(source) if cell["cell_type"] == "markdown" else None
            if heading:
                found.append({"number": heading.group(1), "title": heading.group(2), "task": source,
                              "solution": "", "checker": ""})
            elif grade_id.endswith("_solution") or "_solution_" in grade_id:
                found[-1]["solution"] += source
            elif grade_id.endswith("_checker") or "_checker_" in grade_id:
                found[-1]["checker"] += source
    return found


def test_the_catalogue_lists_the_chapters_exercises_in_order():
    listed = [(e.number, _plain(e.title)) for e in exercises.EXERCISES]
    assert listed == [(e["number"], _plain(e["title"])) for e in notebook_exercises()]


@pytest.mark.parametrize("entry", exercises.EXERCISES, ids=lambda e: e.number)
def test_each_catalogued_checker_is_the_one_its_cell_calls(entry):
    exercise = next(e for e in notebook_exercises() if e["number"] == entry.number)
    assert f"exercises.{entry.checker}(" in exercise["checker"]
    assert callable(getattr(exercises, entry.checker))
    assert 1 <= entry.difficulty <= 5 and entry.minutes > 0 and entry.skills


@pytest.mark.parametrize("entry", exercises.EXERCISES, ids=lambda e: e.number)
def test_a_kernel_exercise_hands_its_checker_a_kernel(entry):
    exercise = next(e for e in notebook_exercises() if e["number"] == entry.number)
    assert ("@triton.jit" in exercise["solution"]) == entry.kernel
    if entry.kernel:
        argument = re.search(rf"{entry.checker}\((\w+)", exercise["checker"]).group(1)
        assert re.search(rf"@triton\.jit\s*\ndef {argument}\(", exercise["solution"]), \
            f"exercise {entry.number}'s checker gets {argument}, which is not the solution's @triton.jit kernel"


@pytest.mark.parametrize("entry", exercises.EXERCISES, ids=lambda e: e.number)
def test_each_exercise_has_a_ladder_of_hints(entry):
    task = next(e for e in notebook_exercises() if e["number"] == entry.number)["task"]
    assert "<summary>Hint 1</summary>" in task and "<summary>Hint 2</summary>" in task


def test_the_ramp_of_kernel_exercises():
    kernels = [e for e in exercises.EXERCISES if e.kernel]
    assert len(kernels) >= MIN_KERNEL_EXERCISES
    per_chapter = Counter(e.number.split(".")[0] for e in kernels)
    assert all(per_chapter[str(chapter)] >= MIN_KERNELS_A_CHAPTER for chapter in range(1, 8)), per_chapter
    solutions = " ".join(e["solution"] for e in notebook_exercises())
    assert "tl.dot(" in solutions, "no exercise asks for tl.dot"


CITED = re.compile(r"\b[Ee]xercises?\s+(\d+\.\d+)((?:\s*(?:,|and|or|to)\s*\d+\.\d+)*)")
TEACHING = Path(exercises.__file__).resolve().parents[1]


def _cited_numbers(text):
    """Every exercise number a text cites: "Exercise 2.3", "exercise 4.2's", "Exercises 6.1 and 6.2"."""
    for match in CITED.finditer(text):
        yield match.group(1)
        yield from re.findall(r"\d+\.\d+", match.group(2))


def _citing_texts():
    for path in sorted(TEACHING.rglob("*.py")):
        yield str(path.relative_to(TEACHING.parents[1])), path.read_text()
    for path in NOTEBOOKS:
        for index, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] == "markdown":
                yield f"{path.name}, cell {index}", "".join(cell["source"])


def test_every_cited_exercise_exists():
    numbers = {e.number for e in exercises.EXERCISES}
    missing = [(where, number) for where, text in _citing_texts() for number in _cited_numbers(text)
               if number not in numbers]
    assert not missing, f"exercises cited that the catalogue does not list: {missing}"


def test_the_citation_finder_sees_every_form():
    assert list(_cited_numbers("see exercise 2.4's kernel; Exercises 6.1 and 6.2, Exercise 1.3.")) == [
        "2.4", "6.1", "6.2", "1.3"]
