import pytest
import torch

from conftest import DTYPES, TOLERANCES
from course_lib.core.rows import as_rows, sum_partial_rows, vector_width, width_hint
from course_lib.core.runtime import DEVICE, ON_GPU


@pytest.mark.parametrize("dtype", DTYPES)
def test_vector_width_divides_the_width_and_every_row_stride(dtype):
    full = 16 // torch.empty(0, dtype=dtype).element_size()  # 16 bytes: 4 float32 or 8 16-bit values
    rows = torch.randn(8, 1040, device=DEVICE, dtype=dtype)
    assert vector_width(rows[:, :1024]) == full  # width 1024, row stride 1040
    assert vector_width(rows[:, :1000]) == full  # 1000 = 8 * 125: enough, though not a multiple of 16
    assert vector_width(rows[:, :1002]) == 2  # 1002 = 2 * 501
    stride_1004 = torch.randn(8, 1004, device=DEVICE, dtype=dtype)[:, :1000]
    assert vector_width(rows[:, :1000], stride_1004) == 4  # every view counts: 1004 = 4 * 251
    assert vector_width(torch.randn(8, 2048, device=DEVICE, dtype=dtype)[:, ::2]) == 1  # columns 2 apart
    assert vector_width(rows[:, 1:1025]) == 1  # starts one value past a 16-byte boundary


def test_width_hint_tells_only_what_triton_cannot_see():
    rows = torch.randn(8, 1040, device=DEVICE, dtype=torch.bfloat16)
    assert width_hint(rows[:, :1024]) == 1  # 1024 and 1040 are multiples of 16: Triton sees it
    assert width_hint(rows[:, :1000]) == 8
    assert width_hint(torch.randn(8, 1004, device=DEVICE, dtype=torch.bfloat16)[:, :1024]) == 4  # row stride 1004
    assert width_hint(rows[:, :1023]) == 1  # nothing to tell


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_partial_rows, width", [(1, 1), (3, 17), (130, 5), (7, 1000)] + (
    [(1056, 4099)] if ON_GPU else []), ids=str)
def test_sum_partial_rows_adds_columns_in_float32_then_casts(n_partial_rows, width, dtype):
    partial = torch.randn(n_partial_rows, width, device=DEVICE)
    got = sum_partial_rows(partial, dtype)
    assert got.dtype == dtype and got.shape == (width,)
    expected = partial.double().sum(0)
    # float32 sums of n terms, then one rounding to dtype.
    rtol, atol = TOLERANCES[dtype]
    torch.testing.assert_close(got.double(), expected, rtol=rtol, atol=atol * n_partial_rows ** 0.5)


def test_sum_partial_rows_reads_the_row_stride():
    wide = torch.randn(9, 40, device=DEVICE)
    partial = wide[:, :29]  # rows 40 apart
    torch.testing.assert_close(sum_partial_rows(partial, torch.float32).double(), partial.double().sum(0),
                               rtol=1e-5, atol=1e-5)


def test_sum_partial_rows_is_bitwise_the_same_every_run():
    partial = torch.randn(500, 300, device=DEVICE)
    first = sum_partial_rows(partial, torch.float32)
    assert all(torch.equal(first, sum_partial_rows(partial, torch.float32)) for _ in range(3))


def test_as_rows_views_without_copying():
    x = torch.randn(2, 3, 5, device=DEVICE)
    rows = as_rows(x)
    assert rows.shape == (6, 5) and rows.data_ptr() == x.data_ptr()
