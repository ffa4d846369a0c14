import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from conftest import (COMPILE_MODES, DTYPES, TOLERANCES, assert_compiled_refuses, assert_compiles_whole, assert_matches,
                      far_apart, gpu_only, poison_cached_memory)
from course_lib.core import references
from course_lib.kernels.layernorm_op import whole_rows as layernorm_module
from course_lib.kernels.layernorm_op.whole_rows import LayerNorm, layer_norm, layernorm, layernorm_forward
from course_lib.core.plans import LaunchPlan
from course_lib.kernels.layernorm_op.parts import BACKWARD_MAX_BLOCK, SPLIT_ROW_BLOCK, BackwardConfig, backward_config
from course_lib.core.runtime import spin_waits_allowed
from course_lib.kernels.layernorm_op.wide_rows import SPLIT_PROGRAMS_PER_SM, can_split_rows
from course_lib.core.runtime import DEVICE, ON_GPU, multiprocessor_count

# The module itself, even where course_lib also exports a function named layernorm.

WIDTHS = [1, 2, 3, 17, 100, 1000]
LEADING = [(), (3,), (2, 3)]


def random_rows(shape, dtype, n_peaks=1):
    """Random rows whose largest value, 1 above the rest, sits at ``n_peaks`` random places.

    With one peak the maximum is unique, so stable=True's gradient meets no ties. The
    gap also keeps every row's spread, and so rstd, moderate: a near-constant row would
    amplify float32 rounding by its large rstd.
    """
    x = torch.randn(shape, device=DEVICE)
    lead, n_cols = shape[:-1], shape[-1]
    peaks = torch.rand(*lead, n_cols, device=DEVICE).argsort(dim=-1)[..., :n_peaks]
    top = x.amax(dim=-1, keepdim=True) + 1
    x.scatter_(-1, peaks, top.expand(*lead, n_peaks))
    return x.to(dtype)


def random_params(n_cols, dtype, with_gamma=True, with_beta=True):
    gamma = torch.randn(n_cols, device=DEVICE, dtype=dtype) if with_gamma else None
    beta = torch.randn(n_cols, device=DEVICE, dtype=dtype) if with_beta else None
    return gamma, beta


def leaf(t):
    return None if t is None else t.detach().requires_grad_()


def check_forward_and_backward(x, gamma, beta, dtype, eps=1e-5, stable=False):
    """Run the kernels; compare y, dx, dgamma, dbeta with float64 autograd through the reference."""
    x, gamma, beta = leaf(x), leaf(gamma), leaf(beta)
    poison_cached_memory(3 * x.numel() * x.element_size())
    y = layernorm(x, gamma, beta, eps=eps, stable=stable)
    grad_y = torch.randn_like(y)
    y.backward(grad_y)

    x64, gamma64, beta64 = (leaf(t.double()) if t is not None else None for t in (x, gamma, beta))
    y64 = references.layernorm(x64, gamma64, beta64, eps=eps, stable=stable)
    y64.backward(grad_y.double())

    n_rows = x.numel() // x.shape[-1]
    assert_matches(y, y64.detach(), dtype, what="y")
    # dx is rstd times a difference of terms of size |gamma * dy|: its rounding error
    # grows with both, and a row of one column has rstd = 1/sqrt(eps), about 316.
    # stable=True then divides by the row maximum m (z = x / m), and so does the error:
    # one rounding of gamma * dy in a row of one column (true dx 0) gave 1.6e-3.
    row_max = x64.detach().amax(-1, keepdim=True)
    z = x64.detach() / row_max if stable else x64.detach()
    rstd = (z.var(-1, unbiased=False) + eps).rsqrt().max().item()
    through_max = 1 / row_max.abs().min().item() if stable else 1.0
    weighted_grad = grad_y.double() * (gamma64.detach() if gamma is not None else 1.0)
    scale = max(1.0, rstd * weighted_grad.abs().max().item() * through_max)
    assert_matches(x.grad, x64.grad, dtype, what="dx", scale=scale)
    if gamma is not None:  # in the parameters' dtype, which may be float32 for x of 16 bits
        assert_matches(gamma.grad, gamma64.grad, gamma.dtype, length=n_rows, what="dgamma")
    if beta is not None:
        assert_matches(beta.grad, beta64.grad, beta.dtype, length=n_rows, what="dbeta")


# Blocks of the split-row backward in tests: on a GPU 16 columns, so rows of 17 and more
# are split across programs; the interpreter runs one program after another and splits
# only rows of one block, so there blocks are 64 wide and wider rows take two stages.
SPLIT_TEST_BLOCK = 16 if ON_GPU else 64
KERNELS = ["single", "two-stage", "split"]


def use_kernels(monkeypatch, kernels):
    """"single": the default tiles. Otherwise tiles of 16 columns, so that rows wider than
    16 take the looped forward and the two-stage or the split-row backward, even on a CPU."""
    if kernels == "single":
        return
    tiles = LaunchPlan(block_rows=2, block_cols=16, num_warps=4, num_stages=2)
    split_block = SPLIT_TEST_BLOCK if kernels == "split" else None
    monkeypatch.setattr(layernorm_module, "forward_tiles", lambda n_cols, element_size: tiles)
    monkeypatch.setattr(
        layernorm_module, "backward_config", lambda n_cols, element_size: BackwardConfig(tiles, 8, tiles, split_block)
    )


@pytest.mark.parametrize("stable", [False, True], ids=["plain", "stable"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead", LEADING, ids=str)
@pytest.mark.parametrize("width", WIDTHS)
def test_matches_reference(width, lead, dtype, stable):
    x = random_rows((*lead, width), dtype)
    check_forward_and_backward(x, *random_params(width, dtype), dtype, stable=stable)


@pytest.mark.parametrize("stable", [False, True], ids=["plain", "stable"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(300, 40), (130, 300)], ids=str)
def test_many_rows_split_between_programs(shape, dtype, stable):
    # Several persistent programs, each looping over rows: several partial rows to add.
    x = random_rows(shape, dtype)
    check_forward_and_backward(x, *random_params(shape[-1], dtype), dtype, stable=stable)


@pytest.mark.parametrize("stable", [False, True], ids=["plain", "stable"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 17), (2, 3, 100), (4, 300), (40, 33)], ids=str)
@pytest.mark.parametrize("kernels", KERNELS[1:])
def test_looped_kernels_match_reference(kernels, shape, dtype, stable, monkeypatch):
    use_kernels(monkeypatch, kernels)
    x = random_rows(shape, dtype)
    check_forward_and_backward(x, *random_params(shape[-1], dtype), dtype, stable=stable)


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("stable", [False, True], ids=["plain", "stable"])
@pytest.mark.parametrize("with_gamma", [True, False], ids=["gamma", "no-gamma"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_without_beta_or_gamma(dtype, with_gamma, stable, kernels, monkeypatch):
    use_kernels(monkeypatch, kernels)
    x = random_rows((7, 45), dtype)
    check_forward_and_backward(x, *random_params(45, dtype, with_gamma, with_beta=False), dtype, stable=stable)
    if not with_gamma:  # a shift alone
        check_forward_and_backward(x, *random_params(45, dtype, False, True), dtype, stable=stable)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # eps = 0: 1 / sqrt(0) on the padding rows
@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("stable", [False, True], ids=["plain", "stable"])
@pytest.mark.parametrize("eps", [0.0, 1e-3, 0.5, 10.0])
def test_eps(eps, stable, kernels, monkeypatch):
    # A large eps makes the stable gradient's term for the maximum large too.
    use_kernels(monkeypatch, kernels)
    x = random_rows((6, 37), torch.float32)
    check_forward_and_backward(x, *random_params(37, torch.float32), torch.float32, eps=eps, stable=stable)


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("n_peaks", [2, 3])
@pytest.mark.parametrize("dtype", DTYPES)
def test_stable_ties_share_the_gradient_of_the_maximum_like_autograd(dtype, n_peaks, kernels, monkeypatch):
    use_kernels(monkeypatch, kernels)
    x = random_rows((5, 40), dtype, n_peaks=n_peaks)
    check_forward_and_backward(x, *random_params(40, dtype), dtype, eps=0.5, stable=True)


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_stable_with_negative_maximum_divides_anyway_like_the_seed(dtype, kernels, monkeypatch):
    use_kernels(monkeypatch, kernels)
    x = random_rows((4, 30), torch.float32)
    x = (x - x.amax(dim=-1, keepdim=True) - 1).to(dtype)  # every row's maximum is -1
    check_forward_and_backward(x, *random_params(30, dtype), dtype, eps=0.1, stable=True)


# Constants a float32 row sum cannot hold exactly (257 x (1e6 + 0.5) needs 9 more bits),
# and one whose square overflows float32; each rounded to the test's dtype.
CONSTANTS = {
    torch.float32: [1e6 + 0.5, -3.25e7, 0.1, 3e30],
    torch.float16: [1000.5, -3.2e4, 0.1],
    torch.bfloat16: [1e6 + 0.5, -3.25e7, 0.1, 3e30],
}


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("stable", [False, True], ids=["plain", "stable"])
@pytest.mark.parametrize("width", [1, 3, 257])
@pytest.mark.parametrize("dtype", DTYPES)
def test_constant_rows_centre_to_exactly_zero(dtype, width, stable, kernels, monkeypatch):
    # The mean is taken relative to the row's first value, so a constant row has a mean
    # of exactly that value, at any magnitude: y is exactly beta and dgamma exactly 0.
    # A centred value one ulp off would be multiplied by rstd = 1 / sqrt(eps) = 316
    # (with the mean summed directly, 257 values of 1e6 + 0.5 gave +-1 instead of beta).
    # "two-stage" and "split" take the looped forward (tiles of 16 columns) at 257.
    use_kernels(monkeypatch, kernels)
    constants = torch.tensor(CONSTANTS[dtype], device=DEVICE).to(dtype)
    x = leaf(constants[:, None].repeat(2, width))  # every constant, twice
    gamma, beta = (leaf(t) for t in random_params(width, dtype))
    y = layernorm(x, gamma, beta, stable=stable)
    grad_y = torch.randn_like(y)
    y.backward(grad_y)
    assert torch.equal(y, beta.expand_as(y)), f"largest |y - beta|: {(y - beta).abs().max().item()}"
    assert torch.equal(gamma.grad, torch.zeros_like(gamma))
    if width == 1:  # y does not depend on x: dx is exactly 0, as torch's
        assert torch.equal(x.grad, torch.zeros_like(x)), f"largest |dx|: {x.grad.abs().max().item()}"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy sees 0 / 0
@pytest.mark.parametrize("kernels", KERNELS)
def test_stable_with_zero_maximum_gives_nan_like_the_seed(kernels, monkeypatch):
    use_kernels(monkeypatch, kernels)
    x = -torch.rand(3, 20, device=DEVICE)
    x[:, 4] = 0.0
    gamma, beta = random_params(20, torch.float32)
    assert references.layernorm(x, gamma, beta, stable=True).isnan().all()
    assert layernorm(x, gamma, beta, stable=True).isnan().all()


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_any_strides(dtype, kernels, monkeypatch):
    use_kernels(monkeypatch, kernels)
    base = random_rows((30, 50), dtype)
    transposed = base.t()  # (50, 30), column-major
    check_forward_and_backward(transposed, *random_params(30, dtype), dtype, stable=True)
    every_other = base[::2, 1::3]  # row stride 100, column stride 3
    gamma = torch.randn(2 * every_other.shape[1], device=DEVICE, dtype=dtype)[::2]
    beta = torch.randn(3 * every_other.shape[1], device=DEVICE, dtype=dtype)[::3]
    check_forward_and_backward(every_other, gamma, beta, dtype)
    permuted = random_rows((6, 5, 19), dtype).permute(2, 0, 1)  # (19, 6, 5): not viewable as 2-D
    check_forward_and_backward(permuted, *random_params(5, dtype), dtype)
    broadcast_gamma = torch.randn(1, device=DEVICE, dtype=dtype).expand(50)  # stride 0
    check_forward_and_backward(base, broadcast_gamma, None, dtype)


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width, row_stride", [(200, 208), (200, 204), (96, 100)], ids=str)
def test_rows_narrower_than_their_stride(width, row_stride, dtype, kernels, monkeypatch):
    # Contiguous rows whose stride is not their width: the kernels' VEC must divide both.
    use_kernels(monkeypatch, kernels)
    x = random_rows((37, row_stride), dtype)[:, :width]
    check_forward_and_backward(x, *random_params(width, dtype), dtype)


def test_gradient_through_sum_has_stride_zero_grad():
    x = random_rows((9, 33), torch.float32).requires_grad_()
    gamma = torch.randn(33, device=DEVICE, requires_grad=True)
    beta = torch.randn(33, device=DEVICE, requires_grad=True)
    layernorm(x, gamma, beta).sum().backward()  # grad_y arrives expanded, stride 0
    x64 = x.detach().double().requires_grad_()
    references.layernorm(x64, gamma.detach().double(), beta.detach().double()).sum().backward()
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(beta.grad, torch.full_like(beta, 9.0))


def test_forward_tiles_override_picks_the_looped_kernel():
    x = random_rows((5, 100), torch.float32)
    gamma, beta = random_params(100, torch.float32)
    whole, whole_stats = layernorm_forward(x, gamma, beta, 1e-5, save_stats=True)
    looped, looped_stats = layernorm_forward(x, gamma, beta, 1e-5, save_stats=True, tiles=LaunchPlan(1, 32, 4))
    torch.testing.assert_close(looped, whole)
    for a, b in zip(looped_stats, whole_stats):
        torch.testing.assert_close(a, b)


def saved_by(fn):
    """Run fn and return the tensors autograd saves while it runs."""
    saved = []

    def pack(tensor):
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn()
    return saved


@pytest.mark.parametrize("stable", [False, True], ids=["plain", "stable"])
def test_training_saves_only_row_statistics_besides_the_inputs(stable):
    x = random_rows((6, 40), torch.float32).requires_grad_()
    gamma, beta = (leaf(t) for t in random_params(40, torch.float32))
    saved = saved_by(lambda: layernorm(x, gamma, beta, stable=stable))
    inputs = [t for t in saved if t.numel() != 6]
    row_stats = [t for t in saved if t.numel() == 6]
    assert [t.data_ptr() for t in inputs] == [x.data_ptr(), gamma.data_ptr()]
    assert len(row_stats) == (3 if stable else 2)  # mean, rstd (and the row maximum)
    assert all(t.dtype == torch.float32 for t in row_stats)


def test_inference_saves_nothing():
    x = random_rows((6, 40), torch.float32)
    gamma, beta = (leaf(t) for t in random_params(40, torch.float32))
    with torch.no_grad():
        assert saved_by(lambda: layernorm(x.requires_grad_(), gamma, beta)) == []
        y = layernorm(x, gamma, beta)
    assert y.grad_fn is None
    assert saved_by(lambda: layernorm(x.detach(), gamma.detach(), None)) == []
    torch.testing.assert_close(y, layernorm(x, gamma, beta).detach())


def test_empty_rows():
    x = torch.randn(0, 8, device=DEVICE, requires_grad=True)
    gamma, beta = (leaf(t) for t in random_params(8, torch.float32))
    y = layernorm(x, gamma, beta)
    assert y.shape == (0, 8)
    y.sum().backward()
    assert x.grad.shape == (0, 8)
    assert torch.all(gamma.grad == 0) and torch.all(beta.grad == 0)


def test_rows_are_split_only_where_all_their_programs_fit():
    block = SPLIT_ROW_BLOCK
    most_blocks = SPLIT_PROGRAMS_PER_SM * multiprocessor_count()
    assert backward_config(BACKWARD_MAX_BLOCK + 1, 2).split_block == block
    assert backward_config(BACKWARD_MAX_BLOCK, 2).split_block is None  # whole rows
    def rows(width):  # can_split_rows reads only the width, the device and whether x is traced
        return torch.empty(0, width, device=DEVICE)

    assert can_split_rows(rows(block), block)  # one block: even the interpreter
    assert can_split_rows(rows(block + 1), block) == spin_waits_allowed(rows(1))  # two blocks wait on each other
    assert can_split_rows(rows(most_blocks * block), block) == spin_waits_allowed(rows(1))
    assert not can_split_rows(rows(most_blocks * block + 1), block)
    with FakeTensorMode():  # torch.compile's launches are not cooperative: no waiting there
        assert not can_split_rows(torch.empty(4, block + 1, device=DEVICE), block)


# --------------------------------------------------------------------------- module


@pytest.mark.parametrize(
    "affine, bias", [(True, True), (True, False), (False, True)], ids=["affine", "no-bias", "no-affine"]
)
@pytest.mark.parametrize("dtype", DTYPES)
def test_module_stands_in_for_torch_layernorm(dtype, affine, bias):
    n_cols = 48
    theirs = torch.nn.LayerNorm(n_cols, eps=1e-4, elementwise_affine=affine, bias=bias, device=DEVICE, dtype=dtype)
    ours = LayerNorm(n_cols, eps=1e-4, elementwise_affine=affine, bias=bias, device=DEVICE, dtype=dtype)
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    theirs.load_state_dict(ours.state_dict())
    assert (ours.bias is None) == (not affine or not bias)

    x = random_rows((4, 5, n_cols), dtype)
    x_ours, x_theirs = leaf(x), leaf(x)
    y_ours, y_theirs = ours(x_ours), theirs(x_theirs)
    grad_y = torch.randn_like(y_ours)
    y_ours.backward(grad_y)
    y_theirs.backward(grad_y)

    # Both round to dtype: allow two roundings.
    rtol, atol = (2 * t for t in TOLERANCES[dtype])
    torch.testing.assert_close(y_ours, y_theirs, rtol=rtol, atol=atol)
    torch.testing.assert_close(x_ours.grad, x_theirs.grad, rtol=rtol, atol=atol)
    for p_ours, p_theirs in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(p_ours.grad, p_theirs.grad, rtol=rtol, atol=atol * 20 ** 0.5)


def test_module_accepts_a_one_element_shape_and_has_torch_defaults():
    module = LayerNorm([8])
    assert module.normalized_shape == (8,)
    assert torch.equal(module.weight, torch.ones(8)) and torch.equal(module.bias, torch.zeros(8))
    assert module.eps == 1e-5 and "stable=False" in repr(module)


# ------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("name", ["gamma", "beta"])
def test_rejects_wrong_parameter_shape(name):
    x = torch.randn(3, 4, device=DEVICE)
    for bad_shape in [(5,), (1, 4)]:
        params = {"gamma": torch.ones(4, device=DEVICE), "beta": torch.zeros(4, device=DEVICE)}
        params[name] = torch.ones(bad_shape, device=DEVICE)
        with pytest.raises(ValueError, match=rf"{name} must have shape \(N,\) with N = x.shape\[-1\] = 4"):
            layernorm(x, params["gamma"], params["beta"])


@pytest.mark.parametrize("with_beta", [True, False], ids=["beta", "no-beta"])
@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_float32_parameters_with_low_precision_x(dtype, kernels, with_beta, monkeypatch):
    # Mixed precision, as torch.nn.LayerNorm takes it: y in x's dtype, the parameters'
    # gradients in float32.
    use_kernels(monkeypatch, kernels)
    x = random_rows((3, 5, 40), dtype)
    gamma, beta = random_params(40, torch.float32, with_beta=with_beta)
    check_forward_and_backward(x, gamma, beta, dtype)
    y = layernorm(x, leaf(gamma), leaf(beta))
    assert y.dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_module_with_float32_parameters_takes_low_precision_x(dtype):
    # torch.nn.LayerNorm in float32 on the same values is the reference: torch itself
    # takes mixed dtypes on a CPU, and on a GPU only under autocast, in float32.
    theirs = torch.nn.LayerNorm(48, device=DEVICE)
    ours = LayerNorm(48, device=DEVICE)
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_()
    ours.load_state_dict(theirs.state_dict())
    x = random_rows((4, 48), dtype)
    x_ours, x_theirs = leaf(x), leaf(x.float())
    y_ours, y_theirs = ours(x_ours), theirs(x_theirs)
    assert y_ours.dtype == dtype
    grad_y = torch.randn_like(y_ours)
    y_ours.backward(grad_y)
    y_theirs.backward(grad_y.float())
    rtol, atol = TOLERANCES[dtype]  # ours rounds once to dtype
    torch.testing.assert_close(y_ours, y_theirs.to(dtype), rtol=rtol, atol=atol)
    torch.testing.assert_close(x_ours.grad, x_theirs.grad.to(dtype), rtol=rtol, atol=atol)
    for p_ours, p_theirs in zip(ours.parameters(), theirs.parameters()):
        assert p_ours.grad.dtype == torch.float32
        torch.testing.assert_close(p_ours.grad, p_theirs.grad, rtol=rtol, atol=atol * 4 ** 0.5)


def test_module_under_autocast_gives_the_dtype_torchs_gives():
    # Under autocast a Linear returns the low-precision dtype; LayerNorm takes it with its
    # float32 parameters. torch's runs layer_norm in float32 on a CUDA GPU (autocast's fp32
    # list) and in the input's dtype on the CPU; course_lib's LayerNorm does the same.
    low = torch.bfloat16
    linear, norm = torch.nn.Linear(32, 48, device=DEVICE), LayerNorm(48, device=DEVICE)
    torch_norm = torch.nn.LayerNorm(48, device=DEVICE)
    x = torch.randn(4, 32, device=DEVICE)
    with torch.autocast(DEVICE.type, dtype=low):
        hidden = linear(x)
        y, expected = norm(hidden), torch_norm(hidden)
    assert hidden.dtype == low and y.dtype == expected.dtype == (torch.float32 if DEVICE.type == "cuda" else low)
    y.float().sum().backward()
    assert norm.weight.grad.dtype == torch.float32
    with torch.autocast(DEVICE.type, dtype=low):
        assert torch.equal(y, norm(hidden))


@pytest.mark.parametrize("name", ["gamma", "beta"])
def test_rejects_parameter_of_another_dtype(name):
    x = torch.randn(3, 4, device=DEVICE)
    params = {"gamma": torch.ones(4, device=DEVICE), "beta": torch.zeros(4, device=DEVICE)}
    params[name] = params[name].half()
    with pytest.raises(TypeError, match=f"{name} has dtype torch.float16 but x has torch.float32"):
        layernorm(x, params["gamma"], params["beta"])


def test_rejects_low_precision_parameters_of_another_low_precision():
    x = torch.randn(3, 4, device=DEVICE, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="gamma must have x's dtype, or be float32"):
        layernorm(x, torch.ones(4, device=DEVICE, dtype=torch.float16))


def test_rejects_gamma_and_beta_of_different_dtypes():
    x = torch.randn(3, 4, device=DEVICE, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="gamma has dtype torch.float32 but beta has torch.bfloat16"):
        layernorm(x, torch.ones(4, device=DEVICE), torch.zeros(4, device=DEVICE, dtype=torch.bfloat16))


def test_module_errors_name_its_own_parameters():
    module = LayerNorm(4, device=DEVICE)
    module.weight.data = module.weight.data.half()
    with pytest.raises(TypeError, match="LayerNorm: weight has dtype torch.float16"):
        module(torch.randn(3, 4, device=DEVICE, dtype=torch.bfloat16))
    module = LayerNorm(4, device=DEVICE)
    module.bias.data = torch.zeros(5, device=DEVICE)
    with pytest.raises(ValueError, match=r"LayerNorm: bias must have shape \(N,\)"):
        module(torch.randn(3, 4, device=DEVICE))


def test_rejects_empty_last_dimension():
    with pytest.raises(ValueError, match="last dimension N of x must be at least 1"):
        layernorm(torch.randn(3, 0, device=DEVICE), torch.randn(0, device=DEVICE))


@pytest.mark.parametrize("eps", [-1e-5, float("nan")])
def test_rejects_negative_eps(eps):
    with pytest.raises(ValueError, match="eps must be a non-negative number"):
        layernorm(torch.randn(3, 4, device=DEVICE), None, eps=eps)


def test_rejects_eps_that_is_not_a_number():
    with pytest.raises(TypeError, match="eps must be a number, got str"):
        layernorm(torch.randn(3, 4, device=DEVICE), None, eps="1e-5")


def test_rejects_rows_too_wide_for_the_partial_sums():
    huge = torch.zeros(1, 1, device=DEVICE).expand(1, 2**30)  # no memory behind it
    with pytest.raises(ValueError, match="N = 1073741824 is too large"):
        layernorm(huge, None)


def test_rejects_more_rows_than_int32():
    huge = torch.zeros(1, 1, device=DEVICE).expand(2**31, 1)  # no memory behind it
    with pytest.raises(ValueError, match="M = 2147483648 is too large"):
        layernorm(huge, None)


def test_module_rejects_several_normalized_dimensions():
    with pytest.raises(ValueError, match="normalizes over the last dimension only"):
        LayerNorm((4, 8))


@pytest.mark.parametrize("arguments, error, match", [
    ({"normalized_shape": -3}, ValueError, "normalized_shape must be at least 1, got -3"),
    ({"normalized_shape": 2.5}, TypeError, "normalized_shape must be an int or a 1-tuple of one; got 2.5"),
    ({"normalized_shape": None}, TypeError, "normalized_shape must be an int or a 1-tuple of one; got None"),
    ({"normalized_shape": True}, TypeError, "normalized_shape must be an int or a 1-tuple of one; got True"),
    ({"normalized_shape": "4"}, TypeError, "normalized_shape must be an int or a 1-tuple of one; got '4'"),
    ({"normalized_shape": 7, "dtype": torch.int32}, TypeError, "dtype must be float32, float16, bfloat16, float64"),
    ({"normalized_shape": 7, "eps": -1}, ValueError, "eps must be a non-negative number"),
    ({"normalized_shape": 7, "eps": "x"}, TypeError, "eps must be a number, got str"),
    ({"normalized_shape": 7, "stable": "x"}, TypeError, "stable must be True or False, got str"),
    ({"normalized_shape": 7, "bias": 1}, TypeError, "bias must be True or False, got int"),
], ids=["negative", "float", "None", "bool", "str", "int dtype", "negative eps", "str eps", "str stable", "int bias"])
def test_module_refuses_bad_arguments_when_built(arguments, error, match):
    """At construction, naming the argument, not at the first forward or inside torch."""
    with pytest.raises(error, match=f"LayerNorm: {match}"):
        LayerNorm(**arguments)


@pytest.mark.parametrize("eps, error", [(True, TypeError), (math.inf, ValueError), (10**400, ValueError),
                                        (4e38, ValueError)], ids=["bool", "inf", "huge int", "beyond float32"])
def test_rejects_eps_that_float32_cannot_add(eps, error):
    with pytest.raises(error, match="layernorm: eps must be"):
        layernorm(torch.randn(3, 4, device=DEVICE), None, eps=eps)


@pytest.mark.parametrize("stable", ["yes", 1, None])
def test_rejects_stable_that_is_not_a_bool(stable):
    with pytest.raises(TypeError, match="layernorm: stable must be True or False"):
        layernorm(torch.randn(3, 4, device=DEVICE), None, stable=stable)


@pytest.mark.parametrize("affine", [True, False])
def test_module_rejects_input_of_another_width(affine):
    with pytest.raises(ValueError, match=r"expected x of shape \(\.\.\., 8\), got \(3, 5\)"):
        LayerNorm(8, elementwise_affine=affine, device=DEVICE)(torch.randn(3, 5, device=DEVICE))


# ------------------------------------------------------------------------- GPU only


@gpu_only
@pytest.mark.parametrize(
    "n_cols, kernels", [(1024, "single"), (20000, "split"), (60000, "split"), (20000, "two-stage")], ids=str
)
@pytest.mark.parametrize("stable", [False, True], ids=["plain", "stable"])
def test_grad_gamma_and_grad_beta_are_bitwise_deterministic(n_cols, kernels, stable, monkeypatch):
    # Rows of 20000 and 60000 split across programs by default (5 and 15 blocks a row:
    # fewer slots than threads, once a race, see split_rows.gather); forced to two
    # stages otherwise.
    if kernels == "two-stage":
        monkeypatch.setattr(layernorm_module, "backward_config", without_split(backward_config))
    n_rows = 2**24 // n_cols + 3
    # float32 results: no rounding to hide a difference in the last bits of the sums.
    x = random_rows((n_rows, n_cols), torch.float32).requires_grad_()
    gamma, beta = (leaf(t) for t in random_params(n_cols, torch.float32))
    grad_y = torch.randn_like(x)
    y = layernorm(x, gamma, beta, stable=stable)
    runs = [torch.autograd.grad(y, (x, gamma, beta), grad_y, retain_graph=True) for _ in range(5)]
    for run in runs[1:]:
        for got, first in zip(run, runs[0]):
            assert torch.equal(got, first)


def without_split(config_of):
    """backward_config with the split-row backward turned off: the two stages."""
    return lambda n_cols, element_size: config_of(n_cols, element_size)._replace(split_block=None)


@gpu_only
@pytest.mark.parametrize("stable", [False, True], ids=["plain", "stable"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(400, 8192), (400, 20000), (300, 32768), (5, 2**17), (3, 2**20 + 7)], ids=str)
def test_wide_rows(shape, dtype, stable):
    # The widest pipelined backward, whole rows of the forward on up to 32 warps
    # (padded and not), the looped forward, the split-row backward with 5 to 257
    # blocks a row (more rows than programs, and fewer), and, at 2**20 + 7 columns, the
    # two stages where the GPU has fewer than 129 multiprocessors.
    x = random_rows(shape, dtype)
    check_forward_and_backward(x, *random_params(shape[-1], dtype), dtype, stable=stable)


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(400, 20000), (5, 2**17)], ids=str)
def test_wide_rows_in_two_stages(shape, dtype, monkeypatch):
    # The fallback of the split-row backward, run on a GPU.
    monkeypatch.setattr(layernorm_module, "backward_config", without_split(backward_config))
    for stable in (False, True):
        x = random_rows(shape, dtype)
        check_forward_and_backward(x, *random_params(shape[-1], dtype), dtype, stable=stable)


@gpu_only
def test_offsets_past_int32():
    # 2**21 + 3 rows of 1024 bfloat16: the last rows start past element 2**31.
    n_rows, n_cols = 2**21 + 3, 1024
    x = torch.randn(n_rows, n_cols, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    gamma, beta = (leaf(t) for t in random_params(n_cols, torch.bfloat16))
    y = layernorm(x, gamma, beta)
    grad_y = torch.randn_like(y)
    (grad_x,) = torch.autograd.grad(y, x, grad_y)
    tail = slice(n_rows - 4, n_rows)
    x64 = leaf(x[tail].double())
    y64 = references.layernorm(x64, gamma.detach().double(), beta.detach().double())
    y64.backward(grad_y[tail].double())
    assert_matches(y[tail], y64.detach(), torch.bfloat16, what="y")
    assert_matches(grad_x[tail], x64.grad, torch.bfloat16, what="dx")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("stable", [False, True], ids=["plain", "stable"])
@pytest.mark.parametrize("parameters", ["gamma_beta", "gamma", "none"])
@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_compiles_whole(mode, parameters, stable, dtype):
    x = random_rows((2, 7, 33), dtype).transpose(0, 1).requires_grad_()  # strided
    gamma = torch.randn(33, device=DEVICE, dtype=dtype, requires_grad=True) if parameters != "none" else None
    beta = torch.randn(33, device=DEVICE, dtype=dtype, requires_grad=True) if parameters == "gamma_beta" else None
    assert_compiles_whole(lambda x, gamma, beta: layernorm(x, gamma, beta, 1e-5, stable), x, gamma, beta,
                          mode=mode, op="layernorm")


@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_module_compiles_whole(mode):
    module = LayerNorm(33, device=DEVICE)
    with torch.no_grad():
        module.weight.normal_()
        module.bias.normal_()
    x = random_rows((4, 33), torch.float32).requires_grad_()
    assert_compiles_whole(module, x, mode=mode, op="layernorm")
    assert module.weight.grad is not None and module.bias.grad is not None


def test_compiled_refuses_bad_input():
    x = torch.randn(4, 8, device=DEVICE)
    assert_compiled_refuses(layernorm, x, torch.randn(8, device=DEVICE, dtype=torch.float16), error=TypeError,
                            match="gamma has dtype")


@pytest.mark.parametrize("parameters", ["gamma_beta", "gamma", "beta", "none"])
@pytest.mark.parametrize("dtype, param_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32)],
                         ids=["float32", "mixed"])
def test_operators_pass_opcheck(dtype, param_dtype, parameters):
    x = random_rows((3, 17), dtype)
    def parameter(name):
        return torch.randn(17, device=DEVICE, dtype=param_dtype, requires_grad=True) if name in parameters else None
    gamma, beta = parameter("gamma"), parameter("beta")
    ops = torch.ops.course_lib
    torch.library.opcheck(ops.layernorm.default, (x.requires_grad_(), gamma, beta, 1e-5))
    x = x.detach()
    gamma = gamma.detach() if gamma is not None else None
    with torch.no_grad():
        _, mean, rstd = ops.layernorm(x, gamma, beta, 1e-5)
    torch.library.opcheck(ops.layernorm_backward.default, (torch.randn_like(x), x, gamma, beta is not None, mean,
                                                           rstd, param_dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_row_of_one_value_normalises_to_exactly_beta(dtype):
    """x - mean is exactly 0 in a row of one: y is beta, with no noise of eps's size, and
    dx exactly 0 (y does not depend on x); LayerNorm(1), weight 1 and bias 0, gives zeros.
    On a GPU dx once kept the rounding of dy * gamma times rstd, about 1e-5 (the compiler
    fused the product into dx's subtraction)."""
    x = (torch.randn(9, 1, device=DEVICE) * 100).to(dtype).requires_grad_()
    gamma, beta = (torch.randn(1, device=DEVICE, dtype=dtype, requires_grad=True) for _ in "gb")
    y = layernorm(x, gamma, beta)
    assert torch.equal(y, beta.expand(9, 1))
    y.backward(torch.randn_like(y))
    assert torch.equal(x.grad, torch.zeros_like(x)), f"largest |dx|: {x.grad.abs().max().item()}"
    assert torch.equal(LayerNorm(1, device=DEVICE, dtype=dtype)(x), torch.zeros_like(x))


def test_backward_operator_keeps_the_gradients_in_gammas_dtype():
    x, gamma = torch.randn(3, 8, device=DEVICE), torch.randn(8, device=DEVICE)
    y, mean, rstd = torch.ops.course_lib.layernorm(x, gamma, gamma, 1e-5)
    with pytest.raises(TypeError, match=r"layernorm_backward: param_dtype must be gamma's dtype, torch.float32"):
        torch.ops.course_lib.layernorm_backward(torch.randn_like(y), x, gamma, True, mean, rstd, torch.float16)


@pytest.mark.parametrize("stable", [False, True])
def test_parameters_whose_last_element_lies_past_2_31_elements(tmp_path, stable):
    # The kernels index γ and β in 64 bits: their strides fit in 32, index × stride does not.
    x = torch.randn(3, 8, device=DEVICE, requires_grad=True)
    gamma = far_apart(torch.randn(8), tmp_path).requires_grad_()
    beta = torch.randn(8, device=DEVICE).requires_grad_()
    y = layernorm(x, gamma, beta, stable=stable)
    x64, gamma64 = x.detach().double().requires_grad_(), gamma.detach().double().requires_grad_()
    expected = references.layernorm(x64, gamma64, beta.detach().double(), 1e-5, stable=stable)
    assert_matches(y, expected, torch.float32)
    grad_y = torch.randn_like(y)
    y.backward(grad_y)
    expected.backward(grad_y.double())
    assert_matches(x.grad, x64.grad, torch.float32, length=8, what="grad_x")
    assert_matches(gamma.grad, gamma64.grad, torch.float32, length=3, what="grad_gamma")


# ------------------------------------------------------ F.layer_norm's calling convention


@pytest.mark.parametrize("normalized_shape", [7, (7,), [7], torch.Size([7])], ids=["int", "tuple", "list", "Size"])
def test_layer_norm_takes_torch_functional_layer_norms_arguments(normalized_shape):
    x, weight, bias = torch.randn(3, 5, 7, device=DEVICE), torch.randn(7, device=DEVICE), torch.randn(7, device=DEVICE)
    expected = torch.nn.functional.layer_norm(x, (7,), weight, bias, 1e-3)
    torch.testing.assert_close(layer_norm(x, normalized_shape, weight, bias, 1e-3), expected)
    torch.testing.assert_close(layer_norm(x, normalized_shape, weight=weight, bias=bias, eps=1e-3), expected)
    torch.testing.assert_close(layer_norm(x, normalized_shape), torch.nn.functional.layer_norm(x, (7,)))


def test_layer_norm_says_it_normalises_over_the_last_dimension_only():
    x = torch.randn(3, 5, 7, device=DEVICE)
    with pytest.raises(ValueError, match=r"layer_norm: normalized_shape must be the last dimension of x, \(7,\)"):
        layer_norm(x, (5,))
    with pytest.raises(ValueError, match="layer_norm: normalizes over the last dimension only"):
        layer_norm(x, (5, 7))
    with pytest.raises(ValueError, match=r"layer_norm: weight must have shape \(N,\)"):
        layer_norm(x, 7, torch.ones(5, device=DEVICE))
