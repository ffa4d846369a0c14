"""What grading finds in one returned notebook: each released checker's result, the return's own
cells that raised, and the grade they make."""

from __future__ import annotations

from dataclasses import dataclass, field


AS_RELEASED, EDITED, MISSING = "as released", "edited", "missing"


@dataclass
class CheckerResult:
    """One checker of the release, in one returned notebook."""

    grade_id: str
    label: str
    passed: bool
    error: str | None = None  # why it failed
    in_return: str = AS_RELEASED  # the return's copy of the cell: as released, edited or missing
    # The checker's whole message, its hints included (error is its first line): feedback, not a verdict.
    message: str | None = field(default=None, compare=False)


@dataclass
class CellError:
    """A code cell of the return, outside the checkers, that raised."""

    cell_index: int  # in the returned notebook
    error: str  # first line of "ename: evalue"


@dataclass
class NotebookGrade:
    """The result of grading one returned notebook against the release."""

    notebook: str  # file name
    release: str | None = None  # the released notebook it was graded against
    checkers: list[CheckerResult] = field(default_factory=list)
    errored_cells: list[CellError] = field(default_factory=list)
    problem: str | None = None  # why grading could not run it all: unreadable, killed, kernel died, tampered
    student: str | None = None
    assignment: str | None = None  # nbgrader's assignment folder, or the released notebook's name
    # The graded notebook handed back to the student (nbformat's JSON): feedback, not a verdict.
    feedback_notebook: str | None = field(default=None, compare=False, repr=False)

    @property
    def passed(self) -> int:
        return sum(checker.passed for checker in self.checkers)

    @property
    def total(self) -> int:
        return len(self.checkers)

    @property
    def score(self) -> str:
        # A return matched to no notebook was not graded: "0/0" would read like a pass.
        return f"{self.passed}/{self.total}" if self.release is not None else "not graded"


def error_line(ename: str, evalue: str) -> str:
    text = f"{ename}: {evalue}" if evalue else ename
    return text.split("\n", 1)[0]
