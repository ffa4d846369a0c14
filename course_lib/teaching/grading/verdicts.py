"""The answers judged out of the returned notebook's process: which checkers' answers are, and the
sandboxed processes that judge them (course_lib/teaching/kernel_verdicts.py)."""

from __future__ import annotations

import json
import re
import secrets
import sys
from pathlib import Path

from .package_copy import fresh_package
from .release import ReleasedNotebook
from .sandbox import Sandbox, run_limited


# A checker cell that hands one name to a kernel exercise's or a PyTorch exercise's checker, or
# exercise 5.3's three (two kernels and their torch.library operator): its verdict comes from
# course_lib/teaching/kernel_verdicts.py, run on the answers' source in a process of its own.
KERNEL_CHECKER_CALL = re.compile(r"^\s*exercises\.(check_\w+)\((\w+)\)\s*$")
OPERATOR_CHECKER_CALL = re.compile(r"^\s*exercises\.(check_\w+)\(\s*(\w+)\s*,\s*(\w+)\s*,\s*(\w+)\s*,?\s*\)\s*$")
KERNEL_VERDICTS_IN_PACKAGE = Path("teaching") / "kernel_verdicts.py"
KERNEL_ANSWER, TORCH_ANSWER, OPERATOR_ANSWER = "kernel", "torch", "operator"


def out_of_process_checkers(released: ReleasedNotebook) -> dict[str, tuple[str, str | tuple[str, ...], str]]:
    """{grade_id: (check function, answer name, KERNEL_ANSWER, TORCH_ANSWER or OPERATOR_ANSWER)} of
    the release's checkers judged out of the notebook's process: those of the kernel exercises and
    of the PyTorch exercises (``kernel=False``) whose checker cell hands the checker one name, and
    those of kernel_verdicts.OPERATOR_CHECKERS handed three (their answer name: the three names,
    two kernels and the operator)."""
    from ..exercises import EXERCISES
    from ..kernel_verdicts import OPERATOR_CHECKERS

    kinds = {exercise.checker: KERNEL_ANSWER if exercise.kernel else TORCH_ANSWER for exercise in EXERCISES}
    found = {}
    for checker in released.checkers:
        call = KERNEL_CHECKER_CALL.match(checker.source)
        operator_call = OPERATOR_CHECKER_CALL.match(checker.source)
        if call and call.group(1) in kinds and call.group(1) not in OPERATOR_CHECKERS:
            found[checker.grade_id] = (call.group(1), call.group(2), kinds[call.group(1)])
        elif operator_call and operator_call.group(1) in OPERATOR_CHECKERS and operator_call.group(1) in kinds:
            found[checker.grade_id] = (operator_call.group(1), operator_call.groups()[1:], OPERATOR_ANSWER)
    return found


def _verdict_records(log_path: Path, secret: str) -> list[dict]:
    """The verdicts a checking process printed, each after the secret only the grader knows."""
    if not log_path.exists():
        return []
    lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    return [json.loads(line[len(secret):]) for line in lines if line.startswith(secret)]


def out_of_process_verdicts(return_sources: list[str], kernels: dict[str, tuple[str, str, str]], seed: int | None,
                     scratch: Path, package: dict[str, bytes], sandbox: Sandbox, answer_limit: float,
                     memory_limit: float | None = None) -> dict[str, dict]:
    """{grade_id: record} for each checker of ``kernels`` (:func:`out_of_process_checkers`), from its
    answer's source alone, checked (a kernel in Triton's language, a PyTorch answer in the
    grader's PyTorch language, an operator's cell in that language extended by what building
    the operator needs) and run by kernel_verdicts.py in a process that never runs the return's
    other code: started once the return's sandbox is gone, in a sandbox of its own, from a fresh
    copy of the package (``package``, a :func:`package_snapshot`) in Python's isolated mode (``-I``: its
    own ``sys.path``, no environment variables read). Each answer has ``answer_limit`` seconds:
    one that hangs is stopped, and the answers after it get a new process."""
    from ..kernel_verdicts import NotAKernel, kernel_definition, operator_definition
    from ..torch_verdicts import NotPyTorch, torch_definition

    verdicts, entries = {}, []
    for grade_id, (checker, name, kind) in kernels.items():
        entry = {"grade_id": grade_id, "checker": checker, "kind": kind}
        try:
            if kind == OPERATOR_ANSWER:  # two kernels, and the cell that makes them an operator
                entry.update(name=name[-1], names=list(name),
                             sources=[kernel_definition(return_sources, kernel) for kernel in name[:-1]]
                             + [operator_definition(return_sources, name[:-1], name[-1])])
            else:
                definition = torch_definition if kind == TORCH_ANSWER else kernel_definition
                entry.update(name=name, source=definition(return_sources, name))
            entries.append(entry)
        except (NotAKernel, NotPyTorch) as error:
            message = f"{type(error).__name__}: {error}"
            verdicts[grade_id] = {"grade_id": grade_id, "passed": False, "error": message.split("\n", 1)[0],
                                  "message": message}
    if not entries:
        return verdicts
    folder = scratch / "verdicts"
    package_copy = fresh_package(package, folder)
    secret = secrets.token_hex(16)
    for attempt in range(len(entries)):  # a new process after each answer stopped at its limit
        remaining = [entry for entry in entries if entry["grade_id"] not in verdicts]
        if not remaining:
            break
        work = folder / f"work_{attempt}"  # its working directory, empty
        work.mkdir()
        spec = folder / f"spec_{attempt}.json"
        spec.write_text(json.dumps({"seed": seed, "kernels": remaining}), encoding="utf-8")
        log = folder / f"log_{attempt}.txt"  # outside the sandbox: only the grader reads it
        command, environment = sandbox.command(
            [sys.executable, "-I", str(package_copy / KERNEL_VERDICTS_IN_PACKAGE), str(package_copy), str(spec)],
            read_only=[package_copy.parent, spec], writable=[work], cwd=work)
        exit_code, killed = run_limited(command, answer_limit, log, environment=environment,
                                        stdin_text=secret + "\n", memory_limit=memory_limit,
                                        progress=lambda: len(_verdict_records(log, secret)),
                                        limit_name="the limit for one answer")
        for record in _verdict_records(log, secret):
            verdicts.setdefault(record["grade_id"], record)
        unjudged = [entry for entry in remaining if entry["grade_id"] not in verdicts]
        why = killed or f"ended with exit code {exit_code}"
        for entry in unjudged[:1] if killed else unjudged:  # killed: the answer it was judging
            answer = "kernel" if entry["kind"] == KERNEL_ANSWER else "answer"
            verdicts[entry["grade_id"]] = {"grade_id": entry["grade_id"], "passed": False,
                                           "error": f"the {answer}'s own checking process {why}, before its verdict"}
    return verdicts
