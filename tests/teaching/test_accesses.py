"""The out-of-bounds guard, the access record and its picture, and the checkers' hints,
each tried on real kernels with the usual mistakes (tests/wrong_kernels.py)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from course_lib.teaching import accesses, exercises
from course_lib.teaching.checking import ExerciseError
from course_lib.core.runtime import ON_GPU

import wrong_kernels

pytestmark = pytest.mark.skipif(ON_GPU, reason="the guard checks the interpreter's accesses; compiled kernels have none to check")

WRONG_KERNELS = Path(__file__).parents[1] / "wrong_kernels.py"

# case -> (the pointer it runs off, load or store, what the hint must say)
OUT_OF_BOUNDS = {
    "1.1 cols <= n_cols": ("x_ptr", "load", "not <="),
    "1.1 no row mask": ("x_ptr", "load", "masked off"),
    "1.1 n_cols as row stride": ("x_ptr", "load", "stride_x_row, not n_cols"),
    "1.1 w indexed by rows": ("w_ptr", "load", "by the columns, not the rows"),
    "1.3 no row mask": ("partial_ptr", "load", "masked off"),
    "2.1 rows <= n_rows": ("x_ptr", "load", "not <="),
    "2.1 n_cols as row stride": ("x_ptr", "load", "stride_x_row, not n_cols"),
    "4.2 cols <= n_cols": ("s_ptr", "load", "not <="),
}


def test_every_case_has_expectations():
    assert set(OUT_OF_BOUNDS) == set(wrong_kernels.OUT_OF_BOUNDS)


@pytest.mark.parametrize("case", list(OUT_OF_BOUNDS))
def test_out_of_bounds_kernel_ends_in_a_named_exercise_error(case, seed):
    pointer, kind, hint = OUT_OF_BOUNDS[case]
    start = time.perf_counter()
    # In a process of its own: without the guard such a kernel corrupts the heap or hangs.
    done = subprocess.run([sys.executable, str(WRONG_KERNELS), case, str(seed)], capture_output=True, text=True,
                          timeout=180, env={**os.environ, "MPLBACKEND": "Agg"})
    seconds = time.perf_counter() - start
    assert done.returncode == 0, f"{case}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    out = done.stdout
    assert out.startswith("ExerciseError: Exercise"), out
    assert "out of bounds" in out and f"the {kind} through {pointer} in program" in out, out
    assert "element(s) outside the tensor passed as" in out and hint in out, out
    assert seconds < 60, f"{case}: {seconds:.0f} s"


def _relaunch(kernel):
    def scale_columns(x, w):
        out = torch.full_like(x, float("nan"), memory_format=torch.contiguous_format)
        kernel[(triton.cdiv(x.shape[0], 4), triton.cdiv(x.shape[1], 4))](
            x, w, out, x.shape[0], x.shape[1], x.stride(0), x.stride(1), out.stride(0), BLOCK_ROWS=4, BLOCK_COLS=4)
        return out
    return scale_columns


@triton.jit
def scale_columns_kernel(x_ptr, w_ptr, out_ptr, n_rows, n_cols, stride_x_row, stride_x_col, stride_out_row,
                         BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x_row + cols[None, :] * stride_x_col, mask=mask)
    w = tl.load(w_ptr + cols, mask=cols < n_cols)
    tl.store(out_ptr + rows[:, None] * stride_out_row + cols[None, :], x * w[None, :], mask=mask)


@triton.jit
def double_in_place_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offsets, 2 * tl.load(x_ptr + offsets, mask=offsets < n), mask=offsets < n)


def test_record_of_a_right_kernel_reads_and_writes_each_element_once():
    x = torch.randn(10, 7)[:, :6]  # rows 7 apart: the gaps between them are not x's
    w = torch.randn(6)
    launches = accesses.record_accesses(_relaunch(scale_columns_kernel), x, w)
    (launch,) = launches
    assert launch.stopped_by is None and launch.grid == (3, 2)
    for name, n_elements in [("x_ptr", 60), ("w_ptr", 6), ("out_ptr", 60)]:
        touched = [a for a in launch.accesses if a.argument == name]
        indices = torch.from_numpy(__import__("numpy").concatenate([a.indices for a in touched]))
        expected_count = 3 if name == "w_ptr" else 1  # w is read by every row tile
        assert torch.equal(torch.bincount(indices, minlength=n_elements),
                           torch.full((n_elements,), expected_count)), name
        assert all(len(a.outside) == 0 for a in touched)
        assert {a.kind for a in touched} == ({"store"} if name == "out_ptr" else {"load"})
    assert {a.program for a in launch.accesses} == {(r, c) for r in range(3) for c in range(2)}


def test_guarded_launch_gives_the_same_values_and_allows_in_place_kernels():
    x = torch.randn(37, 20)
    w = torch.randn(20)
    with accesses.guard_accesses() as guard:
        out = _relaunch(scale_columns_kernel)(x, w)
        y = torch.randn(50)
        expected = 2 * y
        double_in_place_kernel[(4,)](y, y, 50, BLOCK=16)  # two pointers into one storage
    assert guard.violation is None
    assert torch.equal(out, x * w) and torch.equal(y, expected)


def test_guard_stops_a_store_past_the_end_before_it_happens():
    y = torch.zeros(50)
    with accesses.guard_accesses() as guard, pytest.raises(Exception):
        double_in_place_kernel[(4,)](torch.ones(64), y, 64, BLOCK=16)
    message = str(guard.violation)
    assert "the store through y_ptr in program 3 of double_in_place_kernel writes 14 element(s)" in message
    assert "y_ptr + 50, 51, 52, 53, ..." in message and "past its last element" in message
    assert torch.equal(y, torch.zeros(50)), "a launch stopped by the guard copies nothing back"


def test_draw_accesses_draws_the_failing_launch_and_refuses_unknown_arguments(monkeypatch):
    import matplotlib.pyplot as plt

    shown = []
    monkeypatch.setattr(plt, "show", lambda: shown.append(plt.gcf()))
    launches = accesses.record_accesses(exercises.launch_scale_columns, wrong_kernels.wrong_kernel("1.1 cols <= n_cols"),
                                        torch.randn(5, 3), torch.randn(3))
    assert launches[-1].stopped_by is not None
    accesses.draw_accesses(launches[-1])
    titles = [ax.get_title() for ax in shown[0].axes]
    assert titles[0] == "x_ptr: read; red x: 1 out of bounds", titles
    with pytest.raises(ValueError, match=r"no tensor argument of 1 or more dimensions to draw among \['y_ptr'\]"):
        accesses.draw_accesses(launches[-1], arguments=["y_ptr"])
    plt.close("all")


@triton.jit
def _copy_one_past_the_end_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets <= n), mask=offsets < n)


def test_a_launch_on_tensors_of_three_dimensions_is_drawn_row_by_row(monkeypatch):
    import matplotlib.pyplot as plt

    shown = []
    monkeypatch.setattr(plt, "show", lambda: shown.append(plt.gcf()))
    x = torch.randn(2, 3, 5)
    y = torch.empty_like(x)
    launches = accesses.record_accesses(lambda: _copy_one_past_the_end_kernel[(1,)](x, y, x.numel(), BLOCK=32))
    accesses.draw_accesses(launches[-1])
    assert [ax.get_title() for ax in shown[0].axes][0] == "x_ptr: read; red x: 1 out of bounds"
    plt.close("all")


@pytest.mark.parametrize("shown", [False, True])
def test_the_picture_is_mentioned_only_when_one_was_drawn(monkeypatch, shown):
    import matplotlib.pyplot as plt

    from course_lib.teaching import checking

    drawn = []
    monkeypatch.setattr(checking, "shows_pictures", lambda: shown)
    monkeypatch.setattr(plt, "show", lambda: drawn.append(plt.gcf()))
    x = torch.randn(7)
    y = torch.empty_like(x)
    with pytest.raises(ExerciseError, match="out of bounds") as info:
        checking.run_student_code("Exercise 9.9", lambda: _copy_one_past_the_end_kernel[(1,)](x, y, 7, BLOCK=8))
    assert ("picture above" in str(info.value)) == shown == bool(drawn), str(info.value)
    plt.close("all")
