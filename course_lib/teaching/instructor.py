"""The instructor tools' command line: student copies of the course notebooks, the book's
solutions pages and exercise table, the notebooks' stored outputs, and grading of the copies
students return.

Command line::

    python -m course_lib.teaching.instructor student SRC_DIR DEST_DIR
    python -m course_lib.teaching.instructor grade SUBMISSIONS_DIR [--out CSV] [--timeout SECONDS]

``nbformat`` and ``nbclient`` (and ``ipykernel`` to run notebooks) are instructor-only
dependencies, imported only by the commands that need them.
"""

from __future__ import annotations

import argparse
import secrets
import sys
from pathlib import Path

from .exercise_metadata import BEGIN_SOLUTION, END_SOLUTION, INSTALL_HINT, SOLUTION_TAG, stamp_exercise_metadata
from .execution import DEFAULT_TIMEOUT, execute_in_place
from ..core.benchmarking import code_commit
from .grading.gradebook import GRADEBOOK_FILE, format_table, write_gradebook
from .grading.graded_notebook import run_graded
from .grading.grader import DEFAULT_MEMORY_LIMIT_GIB, DEFAULT_NOTEBOOK_TIMEOUT, grade_folder
from .grading.sandbox import find_sandbox
from .student_copies import REMOVE_IN_STUDENT_TAG, exercise_table, make_solutions_pages, make_student_copies


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.teaching.instructor",
        description=(
            "Instructor tools for the course notebooks: make student copies with the "
            "solutions removed, and grade the notebooks students return. "
            f"Needs the instructor-only packages: {INSTALL_HINT}"
        ),
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    student = commands.add_parser(
        "student",
        help="write student copies of the notebooks in a folder",
        description=(
            "Copy every *.ipynb in SRC_DIR (not recursive) into DEST_DIR, replacing each "
            f"'{BEGIN_SOLUTION}' ... '{END_SOLUTION}' block of a cell tagged "
            f"'{SOLUTION_TAG}' with '# YOUR CODE HERE' and 'pass', dropping cells tagged "
            f"'{REMOVE_IN_STUDENT_TAG}', clearing the outputs of solution and checker cells and linking each "
            "exercise to its chapter's solutions page."
        ),
    )
    student.add_argument("src_dir", metavar="SRC_DIR", help="folder of instructor notebooks")
    student.add_argument("dest_dir", metavar="DEST_DIR", help="folder to write the copies to")

    solutions = commands.add_parser(
        "solutions", help="write one solutions page (markdown) a notebook, for the book",
        description="Write DEST_DIR/<notebook>.md for every *.ipynb in SRC_DIR: the code of its solution cells.")
    solutions.add_argument("src_dir", metavar="SRC_DIR", help="folder of instructor notebooks")
    solutions.add_argument("dest_dir", metavar="DEST_DIR", help="folder to write the pages to")
    table = commands.add_parser("exercise-table", help="write the instructors' table of every exercise (markdown)")
    table.add_argument("out", metavar="FILE", help="file to write")

    grade = commands.add_parser(
        "grade",
        help="grade returned notebooks against the release and print a score table",
        description=(
            "Run every returned notebook of SUBMISSIONS_DIR (nbgrader's submitted/<student>/<assignment>/, "
            "or flat, named <student>_<released notebook>), each in a sandbox of its own (bubblewrap), with "
            "the checker cells of the released notebook it comes from (found by their ids) in place of its "
            "own, against course_lib.teaching.exercises imported afresh, on hidden inputs drawn from --seed. "
            "Print per return the checkers passed, the checker cells it had edited or lost and any problem; "
            "write the gradebook and a feedback page per student and assignment to --out. Without "
            "bubblewrap it refuses to run, unless --unsafe. The exit code is 0 whatever the scores; "
            "it is non-zero only when grading itself fails."
        ),
    )
    grade.add_argument(
        "submissions_dir", metavar="SUBMISSIONS_DIR",
        help="folder of returned notebooks: nbgrader's layout (submitted/<student>/<assignment>/) or flat"
    )
    grade.add_argument(
        "--release", metavar="DIR", default="notebooks",
        help="folder of the instructor's notebooks the returns come from (default notebooks)",
    )
    grade.add_argument(
        "--out", metavar="DIR",
        help=f"also write DIR/{GRADEBOOK_FILE} (a row per student and assignment), DIR/feedback/<student>/"
             "<assignment>.html and the graded notebook beside it (.ipynb), rewritten as each return is graded; "
             "DIR must not be inside SUBMISSIONS_DIR",
    )
    grade.add_argument("--jobs", metavar="N", type=int, default=1, help="returns graded at once (default 1)")
    grade.add_argument("--unsafe", action="store_true",
                       help="grade without a sandbox when there is none (the returns' code can then reach "
                            "everything the grader can)")
    grade.add_argument(
        "--seed", metavar="N", type=int,
        help="seed of the checkers' hidden inputs (default: a new one, printed, to grade the same way again)",
    )
    grade.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=int,
        default=DEFAULT_TIMEOUT,
        help=f"longest a single cell, or one answer judged by its own process, may run (default {DEFAULT_TIMEOUT})",
    )
    grade.add_argument(
        "--notebook-timeout", metavar="SECONDS", type=float, default=DEFAULT_NOTEBOOK_TIMEOUT,
        help="longest one notebook may run before its process and kernel are killed "
             f"(default {DEFAULT_NOTEBOOK_TIMEOUT})",
    )
    grade.add_argument(
        "--memory-limit", metavar="GIB", type=float, default=DEFAULT_MEMORY_LIMIT_GIB,
        help="host memory one notebook's processes may hold together before they are killed "
             f"(default {DEFAULT_MEMORY_LIMIT_GIB:g})",
    )
    stamp = commands.add_parser(
        "stamp",
        help="give the exercise cells of notebooks their ids and nbgrader metadata",
        description="Write nbgrader's metadata (grade_id, solution, grade, locked, points) into the "
                    "exercise cells of each notebook, in place; sources and outputs stay as they are.",
    )
    stamp.add_argument("notebooks", metavar="NOTEBOOK", nargs="+", help="notebooks to stamp")
    run_graded_command = commands.add_parser("run-graded", help=argparse.SUPPRESS)
    run_graded_command.add_argument("graded_path", type=Path)
    run_graded_command.add_argument("folder", type=Path)
    run_graded_command.add_argument("summary_path", type=Path)
    run_graded_command.add_argument("executed_path", type=Path)
    run_graded_command.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT)
    run_graded_command.add_argument("--sandboxed", action="store_true")
    execute = commands.add_parser(
        "execute",
        help="re-execute notebooks in place, saving their new outputs",
        description="Run each notebook top to bottom in a fresh kernel and save it; stop at the first error.",
    )
    execute.add_argument("notebooks", metavar="NOTEBOOK", nargs="+", help="notebooks to execute")
    execute.add_argument("--timeout", metavar="SECONDS", type=int, default=DEFAULT_TIMEOUT,
                         help=f"longest a single cell may run (default {DEFAULT_TIMEOUT})")
    return parser


def _grade_command(arguments) -> None:
    sandbox = find_sandbox(unsafe=arguments.unsafe)  # before anything runs: no sandbox, no grading
    seed = arguments.seed if arguments.seed is not None else secrets.randbelow(2**31)
    commit = code_commit()
    print(f"sandbox: {sandbox.name}; hidden inputs from seed {seed} (--seed {seed} grades the same way again); "
          f"course at commit {commit}", file=sys.stderr)

    def save(grades):
        latest = grades[-1]
        print(f"  {latest.student} {latest.assignment or latest.notebook}: {latest.score}", file=sys.stderr)
        if arguments.out:
            write_gradebook(grades, arguments.out, seed, commit)

    grades = grade_folder(
        arguments.submissions_dir,
        arguments.release,
        seed=seed,
        timeout=arguments.timeout,
        notebook_timeout=arguments.notebook_timeout,
        memory_limit_gib=arguments.memory_limit,
        on_start=lambda path: print(f"grading {path.parent.name}/{path.name} ...", file=sys.stderr),
        on_graded=save,
        sandbox=sandbox,
        jobs=arguments.jobs,
    )
    print(format_table(grades))
    if arguments.out:
        print(f"wrote {Path(arguments.out) / GRADEBOOK_FILE} and {Path(arguments.out) / 'feedback'}/")


def main(argv: list[str] | None = None) -> int:
    arguments = _build_parser().parse_args(argv)
    try:
        if arguments.command == "student":
            for path in make_student_copies(arguments.src_dir, arguments.dest_dir):
                print(f"wrote {path}")
        elif arguments.command == "solutions":
            for path in make_solutions_pages(arguments.src_dir, arguments.dest_dir):
                print(f"wrote {path}")
        elif arguments.command == "exercise-table":
            Path(arguments.out).parent.mkdir(parents=True, exist_ok=True)
            Path(arguments.out).write_text(exercise_table(), encoding="utf-8")
            print(f"wrote {arguments.out}")
        elif arguments.command == "execute":
            for path in arguments.notebooks:
                print(f"executing {path} ...", file=sys.stderr)
                execute_in_place([path], timeout=arguments.timeout)
        elif arguments.command == "stamp":
            for path in stamp_exercise_metadata(arguments.notebooks):
                print(f"stamped {path}")
        elif arguments.command == "run-graded":
            run_graded(arguments.graded_path, arguments.folder, arguments.timeout, arguments.summary_path,
                       arguments.executed_path, arguments.sandboxed)
        else:
            _grade_command(arguments)
    except (ImportError, OSError, ValueError, RuntimeError) as error:  # SandboxUnavailable too
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
