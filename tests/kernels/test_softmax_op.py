import re

import pytest
import torch
import triton

from conftest import (COMPILE_MODES, DTYPES, assert_compiled_refuses, assert_compiles_whole, assert_matches, gpu_only,
                      poison_cached_memory)
from course_lib.core import references
from course_lib.core.plans import LaunchPlan, warps_for
from course_lib.core.runtime import DEVICE, pick
from course_lib.kernels import softmax_op as softmax_module
from course_lib.kernels.softmax_op import (
    SINGLE_BLOCK_MAX_COLS,
    backward_tiles,
    causal_softmax,
    forward_tiles,
    softmax,
    softmax_backward,
)

CAUSAL_CASES = [(batch, n) for batch in [(), (3,), (2, 3)] for n in [1, 2, 3, 17, 127]] + pick(
    gpu=[((2,), 1000), ((64,), 1024), ((2,), 4096), ((), 8192)], cpu=[]
)
# The interpreter runs the looped kernels tile by tile, one row after another: it
# gets the small cases only.
LOOPED_CAUSAL_CASES = [((), 3), ((2, 3), 3), ((), 17), ((3,), 17), ((), 63)] + pick(
    gpu=[((2, 3), 17), ((3,), 127), ((2, 3), 127), ((2,), 1000)], cpu=[]
)
PLAIN_SHAPES = [(1,), (5,), (3, 17), (2, 3, 127), (4, 1000), (2, 1, 1, 5)] + pick(
    gpu=[(64, 16384), (8, 16385), (3, 131072), (70000, 64)], cpu=[]
)


def looped_tiles(n_cols, element_size, causal=False):
    """Tiles that send rows of 3 or more columns to the looped kernels: about four
    tiles a row, at most 1024 columns a tile."""
    block_cols = min(1024, max(2, triton.next_power_of_2(n_cols) // 4))
    return LaunchPlan(1, block_cols, warps_for(block_cols, 256))


def use_looped_kernels(monkeypatch):
    monkeypatch.setattr(softmax_module, "forward_tiles", looped_tiles)
    monkeypatch.setattr(softmax_module, "backward_tiles", looped_tiles)


@pytest.fixture(params=["one_block", "looped"])
def kernel_path(request, monkeypatch):
    """Run a test on both kernels: rows in one block, or the looped online softmax."""
    if request.param == "looped":
        use_looped_kernels(monkeypatch)
    return request.param


def check_softmax(x, causal, grad_y=None, diagonal=None):
    """Run the kernels on x and compare y and grad_x with float64 autograd through the
    reference; in the causal case also require exact zeros above the diagonal (query i
    sees keys j <= i + diagonal; given a diagonal, through causal_softmax)."""
    dtype = x.dtype
    x = x.detach().requires_grad_()
    poison_cached_memory(2 * x.numel() * x.element_size())
    y = softmax(x, causal=causal) if diagonal is None else causal_softmax(x, diagonal=diagonal)
    grad_y = torch.randn_like(y) if grad_y is None else grad_y
    y.backward(grad_y)

    x64 = x.detach().double().requires_grad_()
    y64 = references.causal_softmax(x64, diagonal or 0) if causal else references.softmax(x64)
    y64.backward(grad_y.double())
    assert_matches(y, y64.detach(), dtype, what="y")
    assert_matches(x.grad, x64.grad, dtype, what="grad_x")
    if causal:
        assert_zero_above_diagonal(y, "y", diagonal or 0)
        assert_zero_above_diagonal(x.grad, "grad_x", diagonal or 0)
    return y, x.grad


def assert_zero_above_diagonal(t, what, diagonal=0):
    upper = t.triu(diagonal=diagonal + 1)
    assert torch.equal(upper, torch.zeros_like(upper)), f"{what}: nonzero entries above the diagonal"


def test_looped_tiles_really_loop():
    for n_cols in (3, 17, 127, 1000, 131072):
        block_rows, block_cols, _, _ = looped_tiles(n_cols, 4)
        assert block_rows == 1 and 2 <= triton.cdiv(n_cols, block_cols) <= max(4, n_cols // 1024)


# --------------------------------------------------------------------- correctness


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("batch", "n"), CAUSAL_CASES, ids=str)
def test_causal_matches_reference(batch, n, dtype):
    check_softmax(torch.randn(*batch, n, n, device=DEVICE, dtype=dtype), causal=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("batch", "n"), LOOPED_CAUSAL_CASES, ids=str)
def test_causal_looped_matches_reference(batch, n, dtype, monkeypatch):
    use_looped_kernels(monkeypatch)
    check_softmax(torch.randn(*batch, n, n, device=DEVICE, dtype=dtype), causal=True)


def test_causal_1000_in_one_block():
    # Not a power of two: every row ends in a partly masked block. 1000 rows, in float32
    # only, to keep the interpreter quick.
    check_softmax(torch.randn(1000, 1000, device=DEVICE), causal=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", PLAIN_SHAPES, ids=str)
def test_plain_matches_reference(shape, dtype, kernel_path):
    check_softmax(torch.randn(shape, device=DEVICE, dtype=dtype), causal=False)


# (queries m, keys n, diagonal): bottom-right (n - m) as local attention uses it, top-left
# (0), queries that see nothing (i + diagonal < 0) and rows that see everything.
DIAGONAL_CASES = [(3, 8, 5), (5, 9, 0), (7, 7, -3), (6, 3, -3), (4, 20, 16), (3, 5, 9), (2, 4, -9), (33, 40, 7)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n", "diagonal"), DIAGONAL_CASES, ids=str)
def test_causal_diagonal_matches_reference(m, n, diagonal, dtype, kernel_path):
    y, grad_x = check_softmax(torch.randn(2, m, n, device=DEVICE, dtype=dtype), causal=True, diagonal=diagonal)
    blind = torch.arange(m, device=DEVICE) + diagonal < 0  # queries with no key to see
    assert torch.equal(y[:, blind], torch.zeros_like(y[:, blind]))
    assert torch.equal(grad_x[:, blind], torch.zeros_like(grad_x[:, blind]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tiles", [LaunchPlan(4, 256, 2), LaunchPlan(2, 512, 4)], ids=str)
def test_causal_diagonal_half_width_programs(tiles, dtype):
    # (128, 256) scores with diagonal 128, as local attention makes them: the first
    # queries' last keys fall in the first half of the block, the last ones' in the second.
    x = torch.randn(3, 128, 256, device=DEVICE, dtype=dtype)
    hidden = torch.ones(128, 256, dtype=torch.bool, device=DEVICE).triu(diagonal=129)
    y = softmax_module.softmax_forward(x.masked_fill(hidden, float("nan")), True, tiles, diagonal=128)
    assert_matches(y, references.causal_softmax(x.double(), 128), dtype, what="y")


def test_causal_diagonal_never_uses_hidden_keys(kernel_path):
    x = torch.randn(2, 6, 11, device=DEVICE)
    grad_y = torch.randn_like(x)
    hidden = torch.ones(6, 11, dtype=torch.bool, device=DEVICE).triu(diagonal=6)  # diagonal 5
    y_clean = causal_softmax(x, diagonal=5)
    y_dirty = causal_softmax(x.masked_fill(hidden, float("nan")), diagonal=5)
    assert torch.equal(y_dirty, y_clean)
    grad_clean = softmax_backward(y_clean, grad_y, causal=True, diagonal=5)
    assert torch.equal(softmax_backward(y_dirty, grad_y.masked_fill(hidden, float("nan")), causal=True, diagonal=5),
                       grad_clean)


def test_causal_diagonal_extremes():
    x = torch.randn(2, 5, 7, device=DEVICE)
    assert torch.equal(causal_softmax(x[:, :, :5], diagonal=0), causal_softmax(x[:, :, :5]))
    torch.testing.assert_close(causal_softmax(x, diagonal=2**40), softmax(x))  # every key visible
    assert torch.equal(causal_softmax(x, diagonal=-(2**40)), torch.zeros_like(x))  # none


def test_causal_flag_and_causal_softmax_agree():
    x = torch.randn(2, 9, 9, device=DEVICE)
    assert torch.equal(softmax(x, causal=True), causal_softmax(x))
    assert not torch.equal(softmax(x), causal_softmax(x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_any_strides(dtype, kernel_path):
    check_softmax(torch.randn(2, 11, 11, device=DEVICE, dtype=dtype).mT, causal=True)  # column stride 11
    check_softmax(torch.randn(2, 22, 22, device=DEVICE, dtype=dtype)[:, 1::2, ::2], causal=True)
    leading_permuted = torch.randn(7, 2, 7, device=DEVICE, dtype=dtype).permute(1, 0, 2)  # still a view
    check_softmax(leading_permuted, causal=True)
    unmergeable = torch.randn(3, 2, 5, 5, device=DEVICE, dtype=dtype).permute(1, 0, 3, 2)  # copied
    check_softmax(unmergeable, causal=True)
    check_softmax(torch.randn(70, 9, device=DEVICE, dtype=dtype).t(), causal=False)
    check_softmax(torch.randn(4, 3, 5, device=DEVICE, dtype=dtype).permute(2, 0, 1), causal=False)
    check_softmax(torch.randn(1, 33, device=DEVICE, dtype=dtype).expand(4, 33), causal=False)  # stride 0


@pytest.mark.parametrize("causal", [False, True])
def test_broadcast_grad_y(causal, kernel_path):
    # grad_y arrives expanded (stride 0 over the matrices) when the loss broadcasts.
    x = torch.randn(4, 6, 6, device=DEVICE)
    weights = torch.randn(6, 6, device=DEVICE)
    check_softmax(x, causal, grad_y=weights.expand(4, 6, 6))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_large_magnitudes_are_stable(causal, dtype, kernel_path):
    x = 1e4 * torch.randn(2, 13, 13, device=DEVICE, dtype=dtype)
    y, grad_x = check_softmax(x, causal)
    assert not y.isnan().any() and not grad_x.isnan().any()
    equal_rows = torch.full((3, 19), -1e4, device=DEVICE, dtype=dtype)
    torch.testing.assert_close(softmax(equal_rows).float(), torch.full((3, 19), 1 / 19, device=DEVICE),
                               rtol=1e-2, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_minus_inf_row_gives_zeros_and_zero_gradient(dtype, kernel_path):
    x = torch.randn(4, 21, device=DEVICE, dtype=dtype)
    x[1] = float("-inf")
    x[2, ::3] = float("-inf")  # some keys hidden: exactly 0 there
    y, grad_x = check_softmax(x, causal=False)
    assert torch.equal(y[1], torch.zeros_like(y[1])) and torch.equal(grad_x[1], torch.zeros_like(grad_x[1]))
    assert torch.equal(y[2, ::3], torch.zeros_like(y[2, ::3]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_causal_row_without_visible_key_gives_zeros(dtype, kernel_path):
    x = torch.randn(2, 21, 21, device=DEVICE, dtype=dtype)
    x[..., 0] = float("-inf")  # query 0 sees only key 0
    x[1, 7, :8] = float("-inf")  # query 7 of matrix 1 sees keys 0..7, all -inf
    y, grad_x = check_softmax(x, causal=True)
    for matrix, row in [(0, 0), (1, 0), (1, 7)]:
        assert torch.equal(y[matrix, row], torch.zeros_like(y[matrix, row]))
        assert torch.equal(grad_x[matrix, row], torch.zeros_like(grad_x[matrix, row]))
    torch.testing.assert_close(y[0, 1:].double().sum(-1), torch.ones(20, device=DEVICE, dtype=torch.float64),
                               rtol=0, atol=2e-2)
    everything_hidden = torch.full((3, 5, 5), float("-inf"), device=DEVICE, dtype=dtype)
    assert torch.equal(causal_softmax(everything_hidden), torch.zeros_like(everything_hidden))


@pytest.mark.parametrize("causal", [False, True])
def test_nan_propagates_to_its_row(causal, kernel_path):
    x = torch.randn(9, 9, device=DEVICE)
    x[5, 2] = float("nan")
    y = softmax(x, causal=causal)
    visible = ~references.causal_mask(9, DEVICE)[5] if causal else torch.ones(9, dtype=torch.bool, device=DEVICE)
    assert y[5, visible].isnan().all()
    # Only row 5: the others are exact, zeros above the diagonal included.
    others = torch.arange(9, device=DEVICE) != 5
    expected = references.causal_softmax(x) if causal else references.softmax(x)
    torch.testing.assert_close(y[others], expected[others], rtol=1e-5, atol=1e-6)
    if causal:
        assert_zero_above_diagonal(y.masked_fill(~others[:, None], 0.0), "y outside row 5")


def test_causal_never_uses_the_upper_triangle(kernel_path):
    # NaN and inf above the diagonal, in x and in grad_y, change nothing.
    x = torch.randn(2, 21, 21, device=DEVICE)
    grad_y = torch.randn_like(x)
    hidden = references.causal_mask(21, DEVICE)
    y_clean = causal_softmax(x)
    grad_clean = softmax_backward(y_clean, grad_y, causal=True)
    x_dirty = x.masked_fill(hidden, float("nan"))
    x_dirty[:, 0, 1] = float("inf")
    grad_y_dirty = grad_y.masked_fill(hidden, float("nan"))
    y_dirty = causal_softmax(x_dirty)
    assert torch.equal(y_dirty, y_clean)
    assert torch.equal(softmax_backward(y_dirty, grad_y_dirty, causal=True), grad_clean)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("n", "tiles"),
    [
        (40, LaunchPlan(4, 64, 2)),  # rows 0-31 at half width (32 columns), 32-39 whole
        (38, LaunchPlan(4, 64, 2)),  # a program holding rows 36-37 of one matrix and 0-1 of the next: whole
        (38, LaunchPlan(8, 128, 4)),  # the half block (64) covers every row: all at half width
        (33, LaunchPlan(2, 64, 1)),  # the first row past the half (32) has a single key in the second half
    ],
    ids=str,
)
def test_causal_half_width_programs(n, tiles, dtype):
    # softmax_forward_kernel's programs whose rows lie in the first half of their
    # matrix read half a block and write zeros to the rest: NaN there changes nothing.
    x = torch.randn(3, n, n, device=DEVICE, dtype=dtype)
    dirty = x.masked_fill(references.causal_mask(n, DEVICE), float("nan"))
    poison_cached_memory(2 * x.numel() * x.element_size())
    y = softmax_module.softmax_forward(dirty, True, tiles)
    assert_matches(y, references.causal_softmax(x.double()), dtype, what="y")
    assert_zero_above_diagonal(y, "y")


@pytest.mark.parametrize(
    ("shape", "causal"),
    [((0,), False), ((0, 5), False), ((3, 0), False), ((2, 0, 0), False), ((2, 0, 0), True), ((0, 4, 4), True)],
    ids=str,
)
def test_empty_inputs(shape, causal):
    x = torch.randn(shape, device=DEVICE, requires_grad=True)
    y = softmax(x, causal=causal)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize("causal", [False, True])
def test_without_gradients_skips_autograd(causal):
    # Under no_grad, or when x needs no gradient, the forward runs without the
    # autograd.Function, and gives the same result.
    x = torch.randn(2, 9, 9, device=DEVICE, requires_grad=True)
    with torch.no_grad():
        y = softmax(x, causal=causal)
    assert y.grad_fn is None and not y.requires_grad
    assert softmax(x.detach(), causal=causal).grad_fn is None
    assert torch.equal(y, softmax(x, causal=causal).detach())


def test_output_is_a_new_contiguous_tensor():
    x = torch.randn(8, 8, device=DEVICE).t()
    y = causal_softmax(x)
    assert y.is_contiguous() and y.data_ptr() != x.data_ptr()


# ---------------------------------------------------------------- references


def test_reference_softmax_is_torch_softmax_on_finite_rows():
    x = torch.randn(4, 3, 50, dtype=torch.float64)
    torch.testing.assert_close(references.softmax(x), torch.softmax(x, -1))
    hidden = references.causal_mask(50)
    scores = torch.randn(2, 50, 50, dtype=torch.float64)
    torch.testing.assert_close(references.causal_softmax(scores),
                               torch.softmax(scores.masked_fill(hidden, float("-inf")), -1))


def test_reference_backward_matches_autograd():
    x = torch.randn(3, 17, 17, dtype=torch.float64, requires_grad=True)
    grad_y = torch.randn(3, 17, 17, dtype=torch.float64)
    y = references.causal_softmax(x)
    y.backward(grad_y)
    torch.testing.assert_close(references.softmax_backward(y.detach(), grad_y).tril(), x.grad)


# ---------------------------------------------------------------------- tiles


@pytest.mark.parametrize("tiles", [forward_tiles, backward_tiles])
@pytest.mark.parametrize("n_cols", [1, 2, 3, 17, 100, 1024, 4096, 8192, 16384, 16385, 131072, 10**7])
@pytest.mark.parametrize("element_size", [2, 4])
def test_tiles(tiles, n_cols, element_size):
    block_rows, block_cols, num_warps, num_stages = tiles(n_cols, element_size)
    assert num_stages == 1
    for value in (block_rows, block_cols, num_warps):
        assert value >= 1 and value & (value - 1) == 0
    if n_cols <= SINGLE_BLOCK_MAX_COLS:
        assert block_cols >= n_cols
    else:
        assert block_rows == 1 and block_cols < n_cols


@pytest.mark.parametrize("n_cols", [4096, 8192])
def test_causal_16_bit_backward_takes_the_looped_kernel(n_cols):
    assert backward_tiles(n_cols, 2, causal=True).block_cols < n_cols
    assert backward_tiles(n_cols, 4, causal=True).block_cols >= n_cols
    assert backward_tiles(n_cols, 2, causal=False).block_cols >= n_cols


# ------------------------------------------------------------------ GPU only


@gpu_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n_cols", [2**17, 2**17 + 3, 2**20 + 1])
def test_wide_rows(n_cols, dtype):
    check_softmax(torch.randn(3, n_cols, device=DEVICE, dtype=dtype), causal=False)


@gpu_only
def test_causal_wider_than_one_block():
    n = SINGLE_BLOCK_MAX_COLS + 100
    x = torch.randn(1, n, n, device=DEVICE, dtype=torch.bfloat16)
    grad_y = torch.randn_like(x)
    poison_cached_memory(4 * x.numel() * x.element_size())
    y = causal_softmax(x)
    grad_x = softmax_backward(y, grad_y, causal=True)
    y64 = references.causal_softmax(x.double())
    assert_matches(y, y64, torch.bfloat16, what="y")
    assert_matches(grad_x, references.softmax_backward(y64, grad_y.double()), torch.bfloat16, what="grad_x")
    assert_zero_above_diagonal(y, "y")
    assert_zero_above_diagonal(grad_x, "grad_x")


@gpu_only
@pytest.mark.parametrize("n_cols", [8192, 65536])  # one block, looped
def test_offsets_past_two_to_the_31(n_cols):
    # 2**31 + 2 rows' worth of elements: the last rows start past 2**31.
    x = torch.randn(2**31 // n_cols + 2, n_cols, device=DEVICE, dtype=torch.bfloat16)
    grad_y = torch.randn_like(x)
    y = softmax(x)
    grad_x = softmax_backward(y, grad_y, causal=False)
    last = slice(-3, None)
    assert_matches(y[last], references.softmax(x[last].double()), torch.bfloat16, what="y")
    assert_matches(grad_x[last], references.softmax_backward(y[last].double(), grad_y[last].double()),
                   torch.bfloat16, what="grad_x")


@gpu_only
def test_more_than_65535_programs():
    # Grid dimension 0 takes up to 2**31 - 1 programs; dimensions 1 and 2 only 65535.
    rows_per_program = forward_tiles(1024, 4)[0]
    n_matrices = 65536 * rows_per_program // 1024 + 1
    check_softmax(torch.randn(n_matrices, 1024, 1024, device=DEVICE), causal=True)


# ---------------------------------------------------------------- bad input


def test_rejects_non_bool_causal():
    with pytest.raises(TypeError, match="causal must be True or False, got 1"):
        softmax(torch.randn(3, 3, device=DEVICE), causal=1)


@pytest.mark.parametrize("diagonal", [1.0, True, torch.tensor(1), "1"], ids=repr)
def test_causal_rejects_non_int_diagonal(diagonal):
    with pytest.raises(TypeError, match=r"causal_softmax: diagonal must be an int or None, got "):
        causal_softmax(torch.randn(3, 3, device=DEVICE), diagonal=diagonal)


def test_causal_rejects_vectors():
    with pytest.raises(ValueError, match=r"causal_softmax: x must have at least 2 dimension.*got shape \(5,\)"):
        causal_softmax(torch.randn(5, device=DEVICE))


@pytest.mark.parametrize("shape", [(3, 4), (2, 5, 4), (1, 0)])
def test_causal_rejects_non_square(shape):
    with pytest.raises(ValueError, match=r"square matrices .* got x of shape " + re.escape(str(shape))):
        causal_softmax(torch.randn(shape, device=DEVICE))
    with pytest.raises(ValueError, match="square matrices"):
        softmax(torch.randn(shape, device=DEVICE), causal=True)


def test_rejects_too_many_rows_or_columns():
    no_memory = torch.zeros(1, 1, device=DEVICE)
    with pytest.raises(ValueError, match="rows = 2147483648 is too large"):
        softmax(no_memory.expand(2**31, 1))
    with pytest.raises(ValueError, match="columns = 2147483648 is too large"):
        softmax(no_memory.expand(1, 2**31))
    # Kernels index up to one tile past the end, which must stay below 2**31 too.
    with pytest.raises(ValueError, match="2147483640 rows are too many for 32-bit indices"):
        softmax(no_memory.expand(2**31 - 8, 1))
    with pytest.raises(ValueError, match="2147483640 columns are too many for 32-bit indices"):
        softmax(no_memory.expand(1, 2**31 - 8))
    with pytest.raises(ValueError, match="^causal_softmax: 2147483640 rows are too many for 32-bit indices"):
        causal_softmax(no_memory.expand(2**31 - 8, 1, 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_compiles_whole(mode, causal, dtype):
    x = torch.randn(2, 3, 19, 19, device=DEVICE, dtype=dtype).transpose(-1, -2).requires_grad_()  # strided
    assert_compiles_whole(causal_softmax if causal else softmax, x, mode=mode, op="softmax")


@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_compiles_whole_with_diagonal(mode):
    x = torch.randn(2, 3, 7, 19, device=DEVICE, requires_grad=True)
    assert_compiles_whole(lambda x: causal_softmax(x, diagonal=12), x, mode=mode, op="softmax")


def test_compiled_refuses_bad_input():
    x = torch.randn(3, 4, 5, device=DEVICE)
    assert_compiled_refuses(causal_softmax, x, error=ValueError, match="square matrices")


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_operators_pass_opcheck(causal):
    x = torch.randn(3, 9, 9, device=DEVICE, requires_grad=True)
    torch.library.opcheck(torch.ops.course_lib.softmax.default, (x, causal, 0))
    y = softmax(x.detach(), causal=causal)
    torch.library.opcheck(torch.ops.course_lib.softmax_backward.default, (y, torch.randn_like(y), causal, 0))


def test_backward_operator_refuses_a_y_the_forward_did_not_write():
    """The backward kernels read y row-major, as the forward wrote it: another layout would
    be read as the wrong values."""
    y = softmax(torch.randn(5, 3, device=DEVICE)).t()
    with pytest.raises(ValueError, match=r"softmax_backward: y must be contiguous, as the forward wrote it"):
        torch.ops.course_lib.softmax_backward(y, torch.randn(3, 5, device=DEVICE), False, 0)


@pytest.mark.parametrize("diagonal", [6, -4, 2**63 - 1, -(2**63)])
def test_operators_refuse_a_diagonal_beyond_the_scores(diagonal):
    """causal_softmax clamps its diagonal to [-m, n]; the operators, called directly, refuse
    one outside it, where the kernels' 32-bit index sums would overflow."""
    x = torch.randn(3, 5, device=DEVICE)
    match = rf"diagonal must be between -m and n for scores \(\.\.\., m, n\) = \(3, 5\), got {diagonal}"
    with pytest.raises(ValueError, match=match):
        torch.ops.course_lib.softmax(x, True, diagonal)
    y = causal_softmax(x, diagonal=5)
    with pytest.raises(ValueError, match=match):
        torch.ops.course_lib.softmax_backward(y, torch.randn_like(y), True, diagonal)


def test_operators_pass_opcheck_with_diagonal():
    x = torch.randn(3, 5, 9, device=DEVICE, requires_grad=True)
    torch.library.opcheck(torch.ops.course_lib.softmax.default, (x, True, 4))
    y = causal_softmax(x.detach(), diagonal=4)
    torch.library.opcheck(torch.ops.course_lib.softmax_backward.default, (y, torch.randn_like(y), True, 4))


def test_causal_softmax_compiles_with_dynamic_shapes():
    """A new shape makes torch.compile trace again with dynamic shapes, where the sizes, and
    a diagonal computed from them, are SymInts: values and gradients as eager."""
    torch._dynamo.reset()
    square = torch.compile(lambda x: causal_softmax(x) * 2, backend="aot_eager", fullgraph=True)
    offset = torch.compile(lambda x: causal_softmax(x, diagonal=x.shape[-1] - x.shape[-2]), backend="aot_eager",
                           dynamic=True, fullgraph=True)
    for rows, cols in ((5, 5), (6, 6), (3, 7)):
        x = torch.randn(2, rows, cols, device=DEVICE, requires_grad=True)
        if rows == cols:
            torch.testing.assert_close(square(x), causal_softmax(x) * 2)
        y = offset(x)
        expected = causal_softmax(x, diagonal=cols - rows)
        torch.testing.assert_close(y, expected)
        grad_y = torch.randn_like(y)
        torch.testing.assert_close(torch.autograd.grad(y, x, grad_y)[0], torch.autograd.grad(expected, x, grad_y)[0])


def test_backward_operator_names_y():
    with pytest.raises(ValueError, match=r"softmax_backward: y must have at least 2 dimension"):
        torch.ops.course_lib.softmax_backward(torch.randn(8, device=DEVICE), torch.randn(8, device=DEVICE), True, 0)


# --------------------------------------------------------- PyTorch's calling convention


@pytest.mark.parametrize("dim", [0, 1, -2, 2, -1])
def test_softmax_takes_any_dim_as_torch_does(dim):
    x = torch.randn(3, 4, 5, device=DEVICE, requires_grad=True)
    y = softmax(x, dim)
    torch.testing.assert_close(y, torch.softmax(x, dim))
    torch.testing.assert_close(softmax(x, dim=dim), y)
    (grad,) = torch.autograd.grad(y, x, torch.ones_like(y) * torch.arange(5, device=DEVICE))
    (expected,) = torch.autograd.grad(torch.softmax(x, dim), x, torch.ones_like(y) * torch.arange(5, device=DEVICE))
    torch.testing.assert_close(grad, expected)


def test_softmax_refuses_a_dim_that_is_not_one_of_x_naming_it():
    x = torch.randn(3, 4, device=DEVICE)
    with pytest.raises(IndexError, match=r"softmax: dim must be in \[-2, 1\] for x of shape \(3, 4\), got 2"):
        softmax(x, 2)
    with pytest.raises(TypeError, match="softmax: dim must be an int, got float 1.0"):
        softmax(x, 1.0)
    with pytest.raises(TypeError, match=r"causal is keyword-only: softmax\(x, causal=True\)"):
        softmax(x, True)
    with pytest.raises(ValueError, match="causal_softmax: a causal softmax runs over the last dimension"):
        softmax(torch.randn(2, 3, 3, device=DEVICE), 1, causal=True)
