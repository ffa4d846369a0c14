import json
import sys

import pytest

from course_lib.teaching import exercises
from course_lib.teaching.fresh_checker import load_fresh_exercises, run_checker, variant_seed
from course_lib.teaching.grading.package_copy import PACKAGE_DIR


def RIGHT_GRADS(x, w, grad_y):  # exercise 1.2's answer, in PyTorch
    return grad_y[..., None] * w, (x * grad_y[..., None]).reshape(-1, x.shape[-1]).sum(0)


def WRONG_GRADS(x, w, grad_y):  # grad_w without grad_y
    return grad_y[..., None] * w, x.reshape(-1, x.shape[-1]).sum(0)


def test_fresh_exercises_ignore_a_patched_package(monkeypatch):
    monkeypatch.setattr(exercises, "check_weighted_sum_grads", lambda answer: None)
    monkeypatch.setitem(sys.modules, "course_lib.teaching.exercises", None)
    fresh = load_fresh_exercises(PACKAGE_DIR)
    assert fresh is not exercises and fresh.check_weighted_sum_grads.__code__ is not None
    with pytest.raises(AssertionError, match="Exercise 1.2"):
        fresh.check_weighted_sum_grads(WRONG_GRADS)


def test_variant_seeds_differ_by_checker_and_by_seed():
    seeds = {variant_seed(seed, grade_id) for seed in (1, 2) for grade_id in ("exercise_1_1_checker", "exercise_1_2_checker")}
    assert len(seeds) == 4


def test_a_result_is_recorded_only_once_the_checker_returned_or_raised(tmp_path):
    results = tmp_path / "results.jsonl"
    notebook = {"grads": RIGHT_GRADS, "wrong": WRONG_GRADS}
    run_checker(notebook, "exercises.check_weighted_sum_grads(grads)", "ok", 3, results, PACKAGE_DIR)
    with pytest.raises(AssertionError):
        run_checker(notebook, "exercises.check_weighted_sum_grads(wrong)", "bad", 3, results, PACKAGE_DIR)
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert [(record["grade_id"], record["passed"]) for record in records] == [("ok", True), ("bad", False)]
    assert records[1]["error"].startswith("ExerciseError: Exercise 1.2")
