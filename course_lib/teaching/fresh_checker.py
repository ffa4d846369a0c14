"""One checker of the released notebook, run inside the kernel of a notebook being graded.

``course_lib.teaching.instructor`` puts a call to :func:`run_checker` where each checker cell of
the release belongs. The notebook's own cells may have replaced ``exercises.check_*``,
``course_lib.teaching.exercises`` in ``sys.modules`` or the checker cell itself; here the
checker comes from ``course_lib``'s files, imported anew into a package of its own, and
its cell's code sees only the names it reads: that module and the student's answers.
The result is appended to a file only once the checker has returned or raised, so a
kernel that dies inside a checker leaves no result, and the checker fails.

This file is loaded by path, not by import, because the notebook may have replaced
``course_lib`` in ``sys.modules`` too.
"""

import importlib
import json
import sys
import types
import uuid
import zlib

EXERCISES_NAME = "exercises"
EXERCISES_MODULE = f"teaching.{EXERCISES_NAME}"  # inside the package


def load_fresh_exercises(package_dir):
    """``course_lib.teaching.exercises`` (with the ``checking``, ``references`` and ``runtime`` it
    imports) executed anew from ``package_dir``, under a package name nothing else uses."""
    name = f"_course_lib_graded_{uuid.uuid4().hex}"
    package = types.ModuleType(name)
    package.__path__ = [str(package_dir)]
    sys.modules[name] = package
    return importlib.import_module(f"{name}.{EXERCISES_MODULE}")


def variant_seed(seed, grade_id):
    """The seed of one checker's hidden variant: the instructor's seed mixed with its id,
    so that checkers do not share inputs and none is the student's visible run."""
    return (int(seed) + zlib.crc32(grade_id.encode())) % 2**63


def _error_line(error):
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return text.split("\n", 1)[0]


def _message(error):
    """The checker's whole message, its hints included, for the student's feedback."""
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _record(results_path, grade_id, error, message=None):
    with open(results_path, "a", encoding="utf-8") as results:
        results.write(json.dumps({"grade_id": grade_id, "passed": error is None, "error": error,
                                  "message": message or error}) + "\n")


def run_checker(notebook_globals, checker_source, grade_id, seed, results_path, package_dir):
    """Run ``checker_source`` against freshly imported exercises and record the outcome."""
    import torch

    code = compile(checker_source, f"<checker {grade_id}>", "exec")
    try:
        exercises = load_fresh_exercises(package_dir)
        exercises.common.set_hidden_sizes(seed is not None)  # a case of hidden size beside the visible ones
        namespace = {EXERCISES_NAME: exercises}
        # Only the names the checker reads, such as the answer function, come from the notebook.
        namespace.update({name: notebook_globals[name] for name in code.co_names
                          if name != EXERCISES_NAME and name in notebook_globals})
        if seed is not None:
            torch.manual_seed(variant_seed(seed, grade_id))
        exec(code, namespace)
    except KeyboardInterrupt:  # how grading stops a cell that runs past its --timeout
        _record(results_path, grade_id, "interrupted: the checker ran past the time a cell may take (--timeout)")
        raise
    except BaseException as error:
        _record(results_path, grade_id, _error_line(error), _message(error))
        raise
    _record(results_path, grade_id, None)
