import functools

import pytest
import torch

from conftest import (COMPILE_MODES, DTYPES, assert_compiled_refuses, assert_compiles_whole, assert_matches, gpu_only,
                      far_apart, poison_cached_memory)
from course_lib.core import references
from course_lib import weighted_sum
from course_lib.core.runtime import DEVICE, pick
from course_lib.core.plans import LaunchPlan
from course_lib.kernels.weighted_sum_op import backward_tiles, forward_tiles, weighted_sum_forward

SHAPES = [(1, 1), (7, 3), (5, 16), (33, 17), (2, 3, 129), (4, 1000), (2, 1, 1, 5)] + pick(
    gpu=[(1000, 4099), (3, 70000), (70000, 3), (2, 4096, 257)], cpu=[(130, 300)]
)


def check_forward_and_backward(x, weight, dtype):
    """Run the kernels and compare y, grad_x, grad_weight with the float64 reference."""
    x = x.detach().requires_grad_()
    weight = weight.detach().requires_grad_()
    poison_cached_memory(x.numel() * x.element_size())
    y = weighted_sum(x, weight)
    grad_y = torch.randn_like(y)
    y.backward(grad_y)

    x64 = x.detach().double().requires_grad_()
    w64 = weight.detach().double().requires_grad_()
    y64 = references.weighted_sum(x64, w64)
    y64.backward(grad_y.double())

    n_rows = x.numel() // max(x.shape[-1], 1)
    assert_matches(y, y64.detach(), dtype, length=x.shape[-1], what="y")
    assert_matches(x.grad, x64.grad, dtype, what="grad_x")
    assert_matches(weight.grad, w64.grad, dtype, length=n_rows, what="grad_weight")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_reference(shape, dtype):
    x = torch.randn(shape, device=DEVICE, dtype=dtype)
    weight = torch.randn(shape[-1], device=DEVICE, dtype=dtype)
    check_forward_and_backward(x, weight, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_any_strides(dtype):
    base = torch.randn(40, 70, device=DEVICE, dtype=dtype)
    transposed = base.t()  # (70, 40), column-major
    check_forward_and_backward(transposed, torch.randn(40, device=DEVICE, dtype=dtype), dtype)
    every_other = base[::2, 1::3]  # row stride 140, column stride 3
    weight_strided = torch.randn(2 * every_other.shape[1], device=DEVICE, dtype=dtype)[::2]
    check_forward_and_backward(every_other, weight_strided, dtype)
    permuted = torch.randn(6, 5, 9, device=DEVICE, dtype=dtype).permute(2, 0, 1)  # not viewable as 2-D
    check_forward_and_backward(permuted, torch.randn(5, device=DEVICE, dtype=dtype), dtype)
    broadcast_weight = torch.randn(1, device=DEVICE, dtype=dtype).expand(70)  # stride 0
    check_forward_and_backward(base, broadcast_weight, dtype)


def test_large_magnitudes_accumulate_in_float32():
    # 4096 bfloat16 terms of 1e3: a bfloat16 accumulator would lose most of the sum.
    x = torch.full((3, 4096), 1000.0, device=DEVICE, dtype=torch.bfloat16)
    weight = torch.ones(4096, device=DEVICE, dtype=torch.bfloat16)
    y = weighted_sum(x, weight)
    assert torch.all(y.double() == 4096000.0), y


def test_gradient_through_sum_has_stride_zero_grad():
    x = torch.randn(9, 33, device=DEVICE, requires_grad=True)
    weight = torch.randn(33, device=DEVICE, requires_grad=True)
    weighted_sum(x, weight).sum().backward()  # grad_y arrives expanded, stride 0
    torch.testing.assert_close(x.grad, weight.detach().expand(9, 33))
    torch.testing.assert_close(weight.grad, x.detach().sum(0), rtol=1e-5, atol=1e-5)


def test_gradcheck_float32_against_finite_differences():
    # gradcheck needs float64, which the kernels do not take; compare the analytic
    # gradient with central differences computed in float32 instead.
    x = torch.randn(3, 5, device=DEVICE, requires_grad=True)
    weight = torch.randn(5, device=DEVICE, requires_grad=True)
    weighted_sum(x, weight).sum().backward()
    step = 1e-2
    for i in range(5):
        bump = torch.zeros(5, device=DEVICE)
        bump[i] = step
        numeric = (weighted_sum(x.detach(), weight.detach() + bump).sum()
                   - weighted_sum(x.detach(), weight.detach() - bump).sum()) / (2 * step)
        assert abs(numeric.item() - weight.grad[i].item()) < 1e-3


def test_empty_rows():
    x = torch.randn(0, 8, device=DEVICE, requires_grad=True)
    weight = torch.randn(8, device=DEVICE, requires_grad=True)
    y = weighted_sum(x, weight)
    assert y.shape == (0,)
    y.sum().backward()
    assert x.grad.shape == (0, 8)
    assert torch.all(weight.grad == 0)


def test_without_gradients_skips_autograd():
    # Under no_grad, or when nothing requires a gradient, the forward runs without the
    # autograd.Function, and gives the same result.
    x = torch.randn(5, 37, device=DEVICE, requires_grad=True)
    weight = torch.randn(37, device=DEVICE, requires_grad=True)
    with torch.no_grad():
        y = weighted_sum(x, weight)
    assert y.grad_fn is None and not y.requires_grad
    assert weighted_sum(x.detach(), weight.detach()).grad_fn is None
    assert torch.equal(y, weighted_sum(x, weight).detach())


@gpu_only
def test_grad_weight_is_bitwise_deterministic():
    x = torch.randn(100_003, 257, device=DEVICE)
    weight = torch.randn(257, device=DEVICE, requires_grad=True)
    grad_y = torch.randn(100_003, device=DEVICE)
    grads = [torch.autograd.grad(weighted_sum(x, weight), weight, grad_y)[0] for _ in range(5)]
    for g in grads[1:]:
        assert torch.equal(g, grads[0])


@pytest.mark.parametrize("tiles", [LaunchPlan(2, 64, 4, 1), LaunchPlan(1, 128, 2, 2), LaunchPlan(4, 512, 4, 1),
                                   LaunchPlan(1, 8192, 16, 1)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_column_loop_and_whole_row_tiles(tiles, dtype):
    # Tiles narrower than the row take the kernel's column loop; wider ones its
    # whole-row branch. The default tiles of small inputs only reach the second.
    x = torch.randn(37, 300, device=DEVICE, dtype=dtype)
    weight = torch.randn(300, device=DEVICE, dtype=dtype)
    y = weighted_sum_forward(x, weight, tiles)
    assert_matches(y, references.weighted_sum(x.double(), weight.double()), dtype, length=300, what="y")


@pytest.mark.parametrize(
    "tiles",
    [forward_tiles, functools.partial(forward_tiles, wide_loads=False), backward_tiles],
    ids=["forward", "forward_narrow_loads", "backward"],
)
@pytest.mark.parametrize("n_cols", [1, 2, 3, 15, 16, 17, 100, 128, 1000, 8192, 100_000])
@pytest.mark.parametrize("element_size", [2, 4])
def test_tiles_are_powers_of_two_and_never_zero(tiles, n_cols, element_size):
    block_rows, block_cols, num_warps, num_stages = tiles(n_cols, element_size)
    for value in (block_rows, block_cols, num_warps):
        assert value >= 1 and value & (value - 1) == 0
    assert num_stages >= 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width, row_stride", [(1000, 1040), (1000, 1004), (96, 100), (1002, 1002)], ids=str)
def test_rows_narrower_than_their_stride(width, row_stride, dtype):
    # Contiguous rows whose stride is not their width: VEC must divide both.
    x = torch.randn(37, row_stride, device=DEVICE, dtype=dtype)[:, :width]
    check_forward_and_backward(x, torch.randn(width, device=DEVICE, dtype=dtype), dtype)


# ------------------------------------------------------------------------ bad input


def test_rejects_wrong_weight_shape():
    with pytest.raises(ValueError, match=r"weight must have shape \(D,\) with D = x.shape\[-1\] = 4"):
        weighted_sum(torch.randn(3, 4, device=DEVICE), torch.randn(5, device=DEVICE))
    with pytest.raises(ValueError, match="weight must have shape"):
        weighted_sum(torch.randn(3, 4, device=DEVICE), torch.randn(1, 4, device=DEVICE))


def test_rejects_mismatched_dtypes():
    with pytest.raises(TypeError, match="weight has dtype torch.float16 but x has torch.float32"):
        weighted_sum(torch.randn(3, 4, device=DEVICE), torch.randn(4, device=DEVICE, dtype=torch.float16))


def test_rejects_empty_last_dimension():
    with pytest.raises(ValueError, match="last dimension D of x must be at least 1"):
        weighted_sum(torch.randn(3, 0, device=DEVICE), torch.randn(0, device=DEVICE))


def test_rejects_more_rows_than_int32():
    huge = torch.zeros(1, 1, device=DEVICE).expand(2**31, 1)  # no memory behind it
    with pytest.raises(ValueError, match="M = 2147483648 is too large"):
        weighted_sum(huge, torch.ones(1, device=DEVICE))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_compiles_whole(mode, dtype):
    x = torch.randn(3, 5, 33, device=DEVICE, dtype=dtype).transpose(0, 1).requires_grad_()  # strided
    weight = torch.randn(33, device=DEVICE, dtype=dtype, requires_grad=True)
    assert_compiles_whole(weighted_sum, x, weight, mode=mode, op="weighted_sum")


def test_compiled_refuses_bad_input():
    x = torch.randn(4, 8, device=DEVICE)
    assert_compiled_refuses(weighted_sum, x, torch.randn(7, device=DEVICE), error=ValueError, match="weight must have shape")


def test_operators_pass_opcheck():
    x = torch.randn(5, 33, device=DEVICE, requires_grad=True)
    weight = torch.randn(33, device=DEVICE, requires_grad=True)
    torch.library.opcheck(torch.ops.course_lib.weighted_sum.default, (x, weight))
    torch.library.opcheck(torch.ops.course_lib.weighted_sum_backward.default,
                          (x.detach(), weight.detach(), torch.randn(5, device=DEVICE)))


def test_an_infinity_times_a_zero_weight_is_nan_as_in_torch():
    x = torch.tensor([[float("inf"), 1.0], [2.0, 3.0], [float("-inf"), 0.0]], device=DEVICE)
    weight = torch.tensor([0.0, 1.0], device=DEVICE)
    got = weighted_sum(x, weight)
    assert got[0].isnan() and got[2].isnan() and got[1] == 3.0


def test_a_weight_whose_last_element_lies_past_2_31_elements(tmp_path):
    # The kernels index the weight in 64 bits: its stride fits in 32, index × stride does not.
    x = torch.randn(3, 8, device=DEVICE, requires_grad=True)
    weight = far_apart(torch.randn(8), tmp_path).requires_grad_()
    y = weighted_sum(x, weight)
    assert_matches(y, references.weighted_sum(x.detach().double(), weight.detach().double()), torch.float32)
    grad_y = torch.randn_like(y)
    y.backward(grad_y)
    assert_matches(x.grad, grad_y.double()[:, None] * weight.detach().double(), torch.float32, what="grad_x")
