"""The checkers of chapter 6 (course_lib/teaching/exercises/chapter6.py) pass a right answer and name each typical mistake."""

import pytest

from course_lib.teaching import exercises
from course_lib.teaching.checking import ExerciseError
from solutions import solution
from hidden_sizes import hidden_sizes  # noqa: F401  (autouse: visible and hidden sizes)

NOTEBOOK = "06_matmul"
ROWS_OF_A = "a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak"
K_MASK_OF_A = "mask=(rows < M)[:, None] & (ks < K)[None, :], other=0.0"


def _kernel(exercise, name, mistakes=None):
    return getattr(solution(NOTEBOOK, exercise, mistakes), name)


@pytest.mark.parametrize("exercise, name, checker", [
    ("6.1", "tile_matmul_kernel", "check_tile_matmul"),
    ("6.2", "matmul_kernel", "check_matmul"),
    ("6.3", "grouped_matmul_kernel", "check_grouped_matmul"),
    ("6.4", "matmul_bias_gelu_kernel", "check_matmul_bias_gelu"),
    ("6.5", "batched_matmul_kernel", "check_batched_matmul"),
])
def test_each_checker_passes_its_solution(exercise, name, checker, capsys):
    getattr(exercises, checker)(_kernel(exercise, name))
    out = capsys.readouterr().out
    assert out.startswith(f"Exercise {exercise} passed") and ("speed" in out) == (exercise != "6.1")


@pytest.mark.parametrize("mistake, message", [
    ({K_MASK_OF_A: "mask=(rows < M)[:, None] & (ks < K)[None, :]"}, "other=0.0"),  # lanes past K undefined
    ({"mask=(ks < K)[:, None] & (cols < N)[None, :], other=0.0": "mask=(ks < K)[:, None], other=0.0"},
     "out of bounds"),  # b's columns unmasked
    ({ROWS_OF_A: "a_ptr + rows[:, None] * K + ks[None, :]"}, "a here is a transposed view"),  # a taken as row-major
    ({"c = tl.dot(a, b)": "c = tl.dot(a, b) * 0.5"}, "Exercise 6.1"),
])
def test_tile_matmul_names_the_mistake(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_tile_matmul(_kernel("6.1", "tile_matmul_kernel", mistake))


@pytest.mark.parametrize("mistake, message", [
    ({"for start in range(0, K, BLOCK_K):": "for start in range(0, K - BLOCK_K + 1, BLOCK_K):"},
     "stops before the last tile"),
    ({"ks = start + tl.arange(0, BLOCK_K)": "ks = tl.arange(0, BLOCK_K)"}, "multiplied the first K tile again"),
    ({K_MASK_OF_A: "mask=(rows < M)[:, None] & (ks < K)[None, :]"}, "other=0.0"),
    ({"b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn":
      "b_ptr + ks[:, None] * N + cols[None, :]"}, "b here is a transposed view"),
])
def test_matmul_names_the_mistake(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_matmul(_kernel("6.2", "matmul_kernel", mistake))


def test_matmul_refuses_an_answer_that_stops_past_the_listed_sizes():
    # right at every size the checker lists, nothing written past 100 rows
    stops = {"    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)":
             "    if M > 100:\n        return\n    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)"}
    with pytest.raises(ExerciseError, match="a 130×700 times b 700×90"):
        exercises.check_matmul(_kernel("6.2", "matmul_kernel", stops))


@pytest.mark.parametrize("mistake, message", [
    # row-major order from a 1-D grid: right values, wrong order
    ({"tile_m = first_tile_m + (pid % in_group) % group_rows": "tile_m = pid // tiles_n",
      "tile_n = (pid % in_group) // group_rows": "tile_n = pid % tiles_n"}, "the programs go row by row"),
    # the last group taken as GROUP_M rows
    ({"group_rows = tl.minimum(tiles_m - first_tile_m, GROUP_M)": "group_rows = GROUP_M"}, "the last group has"),
])
def test_grouped_matmul_names_the_mistake(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_grouped_matmul(_kernel("6.3", "grouped_matmul_kernel", mistake))


@pytest.mark.parametrize("mistake, message", [
    ({"x = acc + bias[None, :].to(tl.float32)": "x = acc"}, "the bias is missing"),
    ({"bias = tl.load(bias_ptr + cols, mask=cols < N, other=0.0)":
      "bias = tl.load(bias_ptr + rows, mask=rows < N, other=0.0)",
      "x = acc + bias[None, :].to(tl.float32)": "x = acc + bias[:, None].to(tl.float32)"}, "along the rows"),
    ({"y = 0.5 * x * (1.0 + (2.0 * tl.sigmoid(2.0 * inner) - 1.0))": "y = x"}, "GELU is missing"),
    ({"y = 0.5 * x * (1.0 + (2.0 * tl.sigmoid(2.0 * inner) - 1.0))": "y = tl.maximum(x, 0.0)"}, "that is ReLU"),
])
def test_matmul_bias_gelu_names_the_mistake(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_matmul_bias_gelu(_kernel("6.4", "matmul_bias_gelu_kernel", mistake))


@pytest.mark.parametrize("mistake, message", [
    ({"    a_ptr += batch * stride_ab\n": "", "    b_ptr += batch * stride_bb\n": "",
      "    c_ptr += batch * stride_cb\n": ""}, "only the first matrix of the batch"),
    ({"b_ptr += batch * stride_bb": "b_ptr += batch * K * N"}, "out of bounds|Exercise 6.5"),
])
def test_batched_matmul_names_the_mistake(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_batched_matmul(_kernel("6.5", "batched_matmul_kernel", mistake))
