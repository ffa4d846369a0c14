import math
import warnings

import pytest
import torch

from conftest import COMPILE_MODES, TOLERANCES, assert_compiled_refuses, assert_compiles_whole, gpu_only, poison_cached_memory
from course_lib.core import references
from course_lib.kernels.coor_descent_op import coor_descent, launchers
from course_lib.kernels.coor_descent_op.checks import MAX_N_ITERS
from course_lib.core.runtime import DEVICE, ON_GPU, multiprocessor_count, pick


ISSUE_SETTINGS = dict(eps=0.03, eps_init=4, eps_decay=0.7)  # CoLT5's fine-tuning follow-up
SETTINGS = [
    dict(n_iters=20, eps=0.1),
    dict(n_iters=20, **ISSUE_SETTINGS),
    dict(n_iters=50, **ISSUE_SETTINGS),
    dict(n_iters=7, eps=0.5, eps_init=2.0, eps_decay=0.9),
    dict(n_iters=1, eps=0.2),
    dict(n_iters=2, eps=0.3, eps_init=1.0, eps_decay=0.5),  # one step back: a pair with one member
]
SHAPES = [(1,), (3, 2), (2, 3, 3), (17,), (3, 17), (2, 3, 17), (2, 1000)] + pick(
    gpu=[(64, 4099), (8, 16384), (5, 20000), (3, 70001)], cpu=[]
)


def final_eps(n_iters, eps, eps_init=None, eps_decay=1.0):
    current = max(eps if eps_init is None else eps_init, eps)
    for _ in range(n_iters):
        current = max(current * eps_decay, eps)
    return current


def closest_to_a_kink(s64, k, mask, n_iters, eps, eps_init=None, eps_decay=1.0):
    """s + a at the iteration where it comes closest to 0, the kink of b = -relu(s + a),
    for every score (float64; masked scores are far from it). The recurrence is the
    reference's, recording a at every iteration."""
    if mask is not None:
        s64 = s64.masked_fill(~mask, -torch.finfo(s64.dtype).max)
    logk = torch.log(torch.as_tensor(k, dtype=torch.float64, device=s64.device))
    logk = logk[..., None] if logk.ndim else logk
    a, b = torch.zeros_like(s64[..., :1]), -s64
    current = max(eps_init if eps_init is not None else eps, eps)
    closest = torch.full_like(s64, math.inf)
    for _ in range(n_iters):
        sb = (s64 + b) / current
        if mask is not None:
            sb = sb.masked_fill(~mask, -torch.finfo(s64.dtype).max)
        a = current * (logk - sb.logsumexp(dim=-1, keepdim=True))
        b = -torch.relu(s64 + a)
        closest = torch.where((s64 + a).abs() < closest.abs(), s64 + a, closest)
        current = max(current * eps_decay, eps)
    return closest


def move_off_kinks_(s, k, mask, settings, within=1e-5, rounds=5):
    """Move every score within ``within`` of a kink away from it, in place; return the
    scores still at one.

    At a kink the router is not differentiable: float32 and float64 may put a score on
    different sides of it, and then ds differs by a whole term, in the whole row, which
    shares a and its gradient: one score 6e-7 from a kink, in a row of 16384, put ds 5
    times past its tolerance. A step of 2 * within, or two of the dtype's steps, takes
    the score off; it moves a by less, so a few rounds leave none, except where a score
    drags a along with it (the only score a short row keeps, or nearly): those stay.
    """
    for _ in range(rounds):
        closest = closest_to_a_kink(s.double(), k, mask, **settings)
        near = closest.abs() < within
        if not near.any():
            return near
        step = torch.clamp(2 * torch.finfo(s.dtype).eps * s.double().abs(), min=2 * within)
        moved = s.double() + torch.where(closest < 0, -step, step)
        s.copy_(torch.where(near, moved, s.double()).to(s.dtype))
    return closest_to_a_kink(s.double(), k, mask, **settings).abs() < within


def random_k(shape, per_row, requires_grad=True):
    """A budget between 0.5 and half the row: a number, or one per row."""
    n = shape[-1]
    if not per_row:
        return max(0.5, n / 8)
    k = torch.rand(shape[:-1], device=DEVICE, dtype=torch.float64) * (n - 1) / 2 + 0.5
    return k.float().requires_grad_(requires_grad)


def random_mask(shape):
    """About 70% kept, the first column always; every third row entirely kept."""
    mask = torch.rand(shape, device=DEVICE) < 0.7
    mask[..., 0] = True
    mask.view(-1, shape[-1])[::3] = True
    return mask


FLOAT32_ROUNDOFF = 2.0**-24  # u: float32 rounds each operation's result to within u of it, relatively


def float32_floor(s, mask, dy, y64, settings):
    """The error float32 leaves in ds and dk however far they cancel, an absolute one:
    u * sqrt(n_iters) * ||dy * y * (1 + max|s| / eps_T)|| / eps_T.

    ds is a difference of terms as large as dy * y / eps_T, added up over the
    iterations. Each term is resolved only as well as y = exp(min(s + a, 0) / eps_T):
    float32 holds s + a to u * max|s| (the threshold -a lies among the scores), which
    the exponential turns into a relative error of u * max|s| / eps_T, on top of the
    term's own u. Each iteration's a carries its rounding into the next, errors of
    either sign that grow like a random walk: sqrt(n_iters). max|s| is each row's,
    over its unmasked scores. The kernels compute in float32 whatever the dtype, so
    the floor is float32's for every dtype. Measured on rows of 17 to 262144 (CPU and
    H100), the kernel's ds and dk and PyTorch's float32 ones stayed within a fifth of
    rtol * size + floor.
    """
    eps_last = final_eps(**settings)
    magnitude = s.detach().double().abs()
    if mask is not None:
        magnitude = magnitude.masked_fill(~mask, 0)
    condition = 1 + magnitude.amax(dim=-1, keepdim=True) / eps_last
    terms = (dy.double() * y64.detach() * condition).norm() / eps_last
    return FLOAT32_ROUNDOFF * math.sqrt(settings["n_iters"]) * float(terms)


def assert_normwise(name, got, expected, rtol, floor=0.0):
    """||got - expected|| <= rtol * ||expected|| + floor, compared in float64: rtol for
    the rounding of the values, floor for what is lost where they cancel (float32_floor)."""
    assert got.shape == expected.shape, f"{name}: shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    error = float((got.detach().double() - expected).norm())
    size = float(expected.norm())
    allowed = rtol * size + floor
    assert error <= allowed, f"{name}: ||error|| = {error:.3g} > {allowed:.3g} (||expected|| = {size:.3g})"


def check_against_reference(s, k, settings, mask=None, dtype=torch.float32):
    """Kernel y, ds (and dk) against autograd of the float64 reference.

    y within the dtype's rtol (TOLERANCES); ds and dk within it plus float32_floor.
    Where the terms of ds cancel (rows converged to a hard top-k, whose ds is near 0;
    long rows with a large k) no float32 computation gets ds to rtol of its own size,
    PyTorch's included, and the floor is what bounds it: on rows of 262144 with k of
    50649 and 126598 (ISSUE_SETTINGS, 20 iterations) the kernel's ds was off by up to
    2.5e-5 of its size (an H200, an H100), PyTorch's float32 one by up to 3.6e-5,
    and the floor there is 3e-4 to 4e-4 of it.
    """
    rtol = TOLERANCES[dtype][0]
    s = s.detach().to(dtype)
    kinks = move_off_kinks_(s, k.detach() if isinstance(k, torch.Tensor) else k, mask, settings)
    # The few scores left at a kink are left out of ds; many would leave ds untested.
    assert kinks.sum() <= max(2, 0.01 * kinks.numel()), "too many scores at a kink for ds to be compared"
    s.requires_grad_()
    k_grad = isinstance(k, torch.Tensor) and k.requires_grad
    poison_cached_memory(s.numel() * 4)
    y = coor_descent(s, k=k, mask=mask, **settings)
    assert y.dtype == dtype and y.shape == s.shape
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, (s, k) if k_grad else (s,), dy)

    s64 = s.detach().double().requires_grad_()
    k64 = k.detach().double().requires_grad_() if k_grad else k
    y64 = references.coor_descent(s64, k=k64, mask=mask, **settings)
    grads64 = torch.autograd.grad(y64, (s64, k64) if k_grad else (s64,), dy.double())

    floor = float32_floor(s, mask, dy, y64, settings)
    assert_normwise("y", y, y64.detach(), rtol)
    assert_normwise("ds", grads[0].masked_fill(kinks, 0), grads64[0].masked_fill(kinks, 0), rtol, floor)
    if k_grad:
        assert grads[1].shape == k.shape
        assert_normwise("dk", grads[1], grads64[1], rtol, floor)
    if mask is not None:
        assert torch.all(y[~mask] == 0) and torch.all(grads[0][~mask] == 0), "masked positions must be exactly 0"


def test_the_float32_floor_admits_float32_rounding_but_not_a_gradient_1_percent_off():
    # Long rows with a large k converge near a hard top-k, where ds cancels: PyTorch's
    # own float32 ds may miss rtol there, and must be within rtol plus the floor.
    shape, settings = (2, 16384), dict(n_iters=20, **ISSUE_SETTINGS)
    s, mask = torch.randn(shape, device=DEVICE), random_mask(shape)
    k = random_k(shape, per_row=True, requires_grad=False)
    kinks = move_off_kinks_(s, k, mask, settings)
    dy = torch.randn_like(s)
    ds, y = {}, {}
    for dtype in (torch.float32, torch.float64):
        leaf = s.to(dtype).requires_grad_()
        y[dtype] = references.coor_descent(leaf, k=k.to(dtype), mask=mask, **settings)
        ds[dtype] = torch.autograd.grad(y[dtype], leaf, dy.to(dtype))[0].masked_fill(kinks, 0)
    floor = float32_floor(s, mask, dy, y[torch.float64], settings)
    assert_normwise("PyTorch's float32 ds", ds[torch.float32], ds[torch.float64], 1e-5, floor)
    with pytest.raises(AssertionError):
        assert_normwise("ds 1% off", 1.01 * ds[torch.float64], ds[torch.float64], 1e-5, floor)


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda d: "-".join(f"{k}={v}" for k, v in d.items()))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_reference(shape, settings):
    s = torch.randn(shape, device=DEVICE)
    check_against_reference(s, random_k(shape, per_row=True), settings)


@pytest.mark.parametrize("per_row", [False, True], ids=["k_number", "k_per_row"])
@pytest.mark.parametrize("shape", [(1,), (3, 2), (5, 3), (3, 17), (2, 3, 17), (2, 1000)], ids=str)
def test_masks(shape, per_row):
    s = torch.randn(shape, device=DEVICE)
    check_against_reference(s, random_k(shape, per_row), dict(n_iters=20, **ISSUE_SETTINGS), mask=random_mask(shape))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_computes_in_float32(dtype):
    s = torch.randn(4, 300, device=DEVICE)
    check_against_reference(s, random_k(s.shape, per_row=True), dict(n_iters=20, **ISSUE_SETTINGS), dtype=dtype)


@pytest.fixture
def small_tiles(monkeypatch):
    """Split rows longer than 16 columns into tiles of 8 to 16: the split kernels at
    sizes the interpreter runs quickly (there, the forward takes a launch a step)."""
    monkeypatch.setattr(launchers, "ROW_BLOCK_MAX", 16)
    monkeypatch.setattr(launchers, "SPLIT_TILE_MIN", 8)
    monkeypatch.setattr(launchers, "BACKWARD_ROW_BLOCK_MAX", 16)
    monkeypatch.setattr(launchers, "BACKWARD_SPLIT_TILE", 8)


@pytest.mark.parametrize("shape", [(3, 17), (1, 100), (2, 2, 33)] + pick(gpu=[(50, 100), (7, 3000)], cpu=[]), ids=str)
@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
def test_split_rows(small_tiles, shape, masked):
    assert launchers.forward_plan(math.prod(shape[:-1]), shape[-1]).tiles > 1
    s = torch.randn(shape, device=DEVICE)
    mask = random_mask(shape) if masked else None
    check_against_reference(s, random_k(shape, per_row=True), dict(n_iters=20, **ISSUE_SETTINGS), mask=mask)


def test_split_rows_with_a_number_k_and_eps_settings(small_tiles):
    s = torch.randn(2, 40, device=DEVICE)
    for settings in (SETTINGS[3], SETTINGS[4]):
        check_against_reference(s, 6.0, settings)


def test_sums_to_k_once_converged():
    # At a fixed point of a (eps constant) sum_j y_j = k exactly. With eps = 0.1, 150
    # iterations bring most rows within 1e-7 * k of it, though close scores near the
    # cut can slow a row down: so each row may miss k by what the float64 reference
    # misses it by, plus 1e-5 * k for float32 (n values of at most 1, each within
    # about 1e-7: measured 1e-7 * k to 3e-7 * k).
    s = torch.randn(3, 200, device=DEVICE)
    for k in (3, 40, 100):
        settings = dict(n_iters=150, k=k, eps=0.1)
        reference_gap = (references.coor_descent(s.double(), **settings).sum(-1) - k).abs()
        gap = (coor_descent(s, **settings).double().sum(-1) - k).abs()
        assert torch.all(gap <= reference_gap + 1e-5 * k), f"k = {k}: |sum(y) - k| = {gap.tolist()}"


def test_fully_masked_rows_give_zeros():
    s = torch.randn(4, 33, device=DEVICE, requires_grad=True)
    mask = random_mask(s.shape)
    mask[1] = False
    k = random_k(s.shape, per_row=True)
    y = coor_descent(s, n_iters=20, k=k, mask=mask, **ISSUE_SETTINGS)
    assert torch.all(y[1] == 0)
    ds, dk = torch.autograd.grad(y, (s, k), torch.randn_like(y))
    assert torch.all(ds[1] == 0) and dk[1] == 0
    keep = torch.tensor([0, 2, 3], device=DEVICE)
    check_against_reference(s[keep], k[keep].detach().requires_grad_(), dict(n_iters=20, **ISSUE_SETTINGS),
                            mask=mask[keep])


def test_more_k_than_unmasked_scores_saturates():
    # No y sums to k: a grows each iteration and y rises towards 1 where unmasked.
    s = torch.randn(3, 10, device=DEVICE)
    mask = torch.zeros(3, 10, dtype=torch.bool, device=DEVICE)
    mask[:, :4] = True
    check_against_reference(s, 6.0, dict(n_iters=30, eps=0.1), mask=mask)
    y = coor_descent(s, n_iters=100, k=6.0, eps=0.1, mask=mask)
    assert torch.all(y[:, :4] > 0.999) and torch.all(y[:, 4:] == 0)


def test_k_broadcasts_and_may_be_an_integer_tensor():
    s = torch.randn(2, 3, 40, device=DEVICE)
    check_against_reference(s, random_k((2, 1, 40), per_row=True), dict(n_iters=20, **ISSUE_SETTINGS))
    k_int = torch.tensor([3, 5, 9], device=DEVICE)
    expected = references.coor_descent(s.double(), n_iters=20, k=k_int, **ISSUE_SETTINGS)
    assert_normwise("y", coor_descent(s, n_iters=20, k=k_int, **ISSUE_SETTINGS), expected, 1e-5)


def test_scalar_k_tensor_for_a_single_row():
    s = torch.randn(50, device=DEVICE)
    check_against_reference(s, torch.tensor(7.5, device=DEVICE, requires_grad=True), dict(n_iters=20, eps=0.1))


def test_any_strides_and_broadcast_gradient():
    base = torch.randn(12, 20, device=DEVICE)
    check_against_reference(base.t(), random_k((20, 12), per_row=True), dict(n_iters=20, **ISSUE_SETTINGS))
    check_against_reference(base[::2, 1::3], 4.0, dict(n_iters=20, eps=0.1))
    mask = random_mask((20, 12)).t()  # a transposed mask too
    check_against_reference(base, 5.0, dict(n_iters=20, eps=0.1), mask=mask)
    settings = dict(n_iters=20, eps=0.1)
    s = base.clone().requires_grad_()
    coor_descent(s, k=5, **settings).sum().backward()  # grad arrives expanded, stride 0
    s64 = base.double().requires_grad_()
    y64 = references.coor_descent(s64, k=5, **settings)
    y64.sum().backward()
    assert_normwise("ds", s.grad, s64.grad, 1e-5, float32_floor(base, None, torch.ones_like(base), y64, settings))


def test_gradient_to_k_alone():
    s = torch.randn(3, 40, device=DEVICE)
    k = random_k(s.shape, per_row=True)
    dy = torch.randn_like(s)
    settings = dict(n_iters=20, eps=0.1)
    (dk,) = torch.autograd.grad(coor_descent(s, k=k, **settings), k, dy)
    k64 = k.detach().double().requires_grad_()
    y64 = references.coor_descent(s.double(), k=k64, **settings)
    (dk64,) = torch.autograd.grad(y64, k64, dy.double())
    assert_normwise("dk", dk, dk64, 1e-5, float32_floor(s, None, dy, y64, settings))


def test_checkpoint_segments_has_no_effect():
    s = torch.randn(3, 50, device=DEVICE)
    one = coor_descent(s, n_iters=20, k=5, checkpoint_segments=1, **ISSUE_SETTINGS)
    four = coor_descent(s, n_iters=20, k=5, checkpoint_segments=4, **ISSUE_SETTINGS)
    assert torch.equal(one, four)


def test_empty_rows():
    s = torch.randn(0, 8, device=DEVICE, requires_grad=True)
    y = coor_descent(s, n_iters=5, k=2)
    assert y.shape == (0, 8)
    y.sum().backward()
    assert s.grad.shape == (0, 8)


@pytest.mark.parametrize("n_cols", [1, 2, 16, 17, 1000, 16384, 16385, 131072, 2**24])
@pytest.mark.parametrize("n_rows", [1, 4, 256, 100_000])
def test_plans_are_valid(n_rows, n_cols):
    plan = launchers.forward_plan(n_rows, n_cols)
    assert plan.block & (plan.block - 1) == 0 and plan.block * plan.tiles >= n_cols > plan.block * (plan.tiles - 1)
    assert 1 <= plan.row_programs <= n_rows and 1 <= plan.num_warps <= 16
    if plan.single_launch and plan.tiles > 1:  # split rows wait on each other: all resident
        assert ON_GPU and plan.tiles * plan.row_programs <= multiprocessor_count()
    backward = launchers.backward_plan(n_rows, n_cols)
    assert backward.block * backward.tiles >= n_cols > backward.block * (backward.tiles - 1)
    assert backward.block <= launchers.MAX_COUNTED_TILE


def test_refuses_a_plan_that_would_hang():
    s = torch.randn(2, 64, device=DEVICE)
    schedule = launchers.eps_schedule(5, 0.1, None, 1.0, s.device)
    too_many = launchers.ForwardPlan(8, 8, 2 * multiprocessor_count(), 1, True)
    with pytest.raises(ValueError, match="would hang: split rows in one launch wait on each other"):
        launchers.coor_descent_forward(s, None, 1.0, schedule, too_many)


def test_refuses_a_backward_tile_too_wide_for_its_counts():
    s = torch.randn(2, 64, device=DEVICE)
    schedule = launchers.eps_schedule(5, 0.1, None, 1.0, s.device)
    _, a, row_max = launchers.coor_descent_forward(s, None, 1.0, schedule)
    too_wide = launchers.BackwardPlan(2**16, 1, 4)
    with pytest.raises(ValueError, match="more than 65535 columns"):
        launchers.coor_descent_backward(s, None, 1.0, schedule, a, row_max, torch.randn_like(s), too_wide)


def test_counts_up_to_the_widest_whole_row():
    # The backward counts two iterations in the 16-bit halves of one int32: with k
    # near n almost every column lies above -a_t, and a count of the widest whole
    # row (BACKWARD_ROW_BLOCK_MAX columns) must not spill into the other half.
    n = launchers.BACKWARD_ROW_BLOCK_MAX
    assert launchers.backward_plan(2, n).tiles == 1
    s = torch.randn(2, n, device=DEVICE)
    k = torch.tensor([n - 3.0, n / 2], device=DEVICE, requires_grad=True)
    check_against_reference(s, k, dict(n_iters=6, eps=0.5))


# ----------------------------------------------------------------------- GPU only


@gpu_only
@pytest.mark.parametrize("per_row", [False, True], ids=["k_number", "k_per_row"])
@pytest.mark.parametrize("shape", [(4, 131072), (2, 262144)], ids=str)
def test_few_long_rows(shape, per_row):
    assert launchers.forward_plan(*shape).tiles > 1
    s = torch.randn(shape, device=DEVICE)
    check_against_reference(s, random_k(shape, per_row), dict(n_iters=20, **ISSUE_SETTINGS), mask=random_mask(shape))


@gpu_only
def test_one_launch_a_step_matches_one_launch_bit_for_bit():
    s = torch.randn(6, 50_000, device=DEVICE)
    schedule = launchers.eps_schedule(20, 0.03, 4.0, 0.7, s.device)
    plan = launchers.forward_plan(*s.shape)
    assert plan.single_launch and plan.tiles > 1
    together = launchers.coor_descent_forward(s, None, math.log(100), schedule, plan)
    stepwise = launchers.coor_descent_forward(s, None, math.log(100), schedule, plan._replace(single_launch=False))
    for one, other in zip(together, stepwise):
        assert torch.equal(one, other)


@gpu_only
@pytest.mark.parametrize("shape", [(4, 131072), (2, 262144)], ids=str)
def test_split_rows_are_bitwise_deterministic(shape):
    # 32 and 64 tiles a row: fewer slots than a program's threads, once a race (_gather).
    assert launchers.forward_plan(*shape).tiles > 1
    s = torch.randn(shape, device=DEVICE, requires_grad=True)
    dy = torch.randn_like(s)
    runs = []
    for _ in range(5):
        y = coor_descent(s, n_iters=20, k=1000, **ISSUE_SETTINGS)
        runs.append((y, *torch.autograd.grad(y, s, dy)))
    for y, ds in runs[1:]:
        assert torch.equal(y, runs[0][0]) and torch.equal(ds, runs[0][1])


@gpu_only
@pytest.mark.parametrize("shape", [(4, 131072), (1024, 4096), (256, 32768)], ids=str)
def test_peak_memory_at_most_three_inputs(shape):
    s = torch.randn(shape, device=DEVICE, requires_grad=True)
    dy = torch.randn_like(s)
    settings = dict(n_iters=20, k=shape[-1] // 8, **ISSUE_SETTINGS)
    torch.autograd.grad(coor_descent(s, **settings), s, dy)  # compile, cache the eps schedule
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    torch.autograd.grad(coor_descent(s, **settings), s, dy)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    assert extra <= 3 * s.numel() * s.element_size(), f"{extra / s.numel() / s.element_size():.2f}x the input"


# ------------------------------------------------------------------------ bad input


def scores(*shape):
    return torch.randn(shape or (3, 8), device=DEVICE)


def test_rejects_empty_rows():
    with pytest.raises(ValueError, match="last dimension of s must be at least 1"):
        coor_descent(torch.randn(3, 0, device=DEVICE), n_iters=5, k=1)


def test_rejects_k_on_another_device():  # s and mask: tests/core/test_validation.py
    with pytest.raises(ValueError, match="k is on meta"):
        coor_descent(scores(), n_iters=5, k=torch.ones(3, device="meta"))


@pytest.mark.parametrize("n_iters", [0, -3])
def test_rejects_too_few_iterations(n_iters):
    with pytest.raises(ValueError, match=f"n_iters must be at least 1, got {n_iters}"):
        coor_descent(scores(), n_iters=n_iters, k=1)


@pytest.mark.parametrize("n_iters", [2.5, True, "20", None])
def test_rejects_non_integer_iterations(n_iters):
    with pytest.raises(TypeError, match="n_iters must be an int"):
        coor_descent(scores(), n_iters=n_iters, k=1)


@pytest.mark.parametrize("bad", [{"n_iters": True}, {"n_iters": 1.0}, {"n_iters": [1]},
                                 {"checkpoint_segments": True}, {"eps": True}, {"eps_decay": [1.0]}])
def test_settings_accepted_once_do_not_let_lookalikes_through(bad):
    """The settings are checked once a combination (checks.check_settings): True, 1.0 and
    [1] still fail after 1 passed, as they do the first time."""
    good = {"n_iters": 1, "checkpoint_segments": 1, "eps": 1, "eps_decay": 1.0}
    coor_descent(scores(), k=1, **good)
    name = next(iter(bad))
    with pytest.raises(TypeError, match=f"{name} must be an? (int|number)"):
        coor_descent(scores(), k=1, **{**good, **bad})


@pytest.mark.parametrize("k", [0, -1.0, 8.5, math.nan, math.inf])
def test_rejects_k_out_of_range(k):
    with pytest.raises(ValueError, match=r"k must satisfy 0 < k <= n, the row length \(8\)"):
        coor_descent(scores(), n_iters=5, k=k)


@pytest.mark.parametrize("bad", [0.0, -2.0, 9.0, math.nan])
def test_rejects_per_row_k_out_of_range(bad):
    k = torch.tensor([1.0, bad, 3.0], device=DEVICE)
    with pytest.raises(ValueError, match=r"every k must satisfy 0 < k <= n, the row length \(8\)"):
        coor_descent(scores(), n_iters=5, k=k)


def test_rejects_k_of_wrong_shape_or_type():
    with pytest.raises(ValueError, match=r"k must be a number or a tensor of shape s.shape\[:-1\] = \(3,\)"):
        coor_descent(scores(), n_iters=5, k=torch.ones(4, device=DEVICE))
    with pytest.raises(ValueError, match=r"got k of shape \(3, 8\)"):
        coor_descent(scores(), n_iters=5, k=torch.ones(3, 8, device=DEVICE))
    with pytest.raises(TypeError, match="k has dtype torch.bool"):
        coor_descent(scores(), n_iters=5, k=torch.ones(3, dtype=torch.bool, device=DEVICE))
    with pytest.raises(TypeError, match="k must be a number or a torch.Tensor, got str"):
        coor_descent(scores(), n_iters=5, k="2")


@pytest.mark.parametrize("name", ["eps", "eps_init", "eps_decay"])
@pytest.mark.parametrize("value", [0.0, -0.1, math.inf])
def test_rejects_non_positive_eps(name, value):
    with pytest.raises(ValueError, match=f"{name} must be positive and finite, got {value}"):
        coor_descent(scores(), n_iters=5, k=1, **{name: value})


@pytest.mark.parametrize("name", ["eps", "eps_init"])
@pytest.mark.parametrize("value", [1e-39, 4e38, 1e300])
def test_rejects_eps_outside_float32(name, value):
    """The kernels divide float32 scores by eps: a value no normal float32 holds gave NaN."""
    with pytest.raises(ValueError, match=f"{name} must be between 1.18e-38 and 3.4e\\+38"):
        coor_descent(scores(), n_iters=5, k=1, **{name: value})


def test_rejects_more_iterations_than_it_takes():
    """The eps table and the saved (rows, n_iters) table grow with n_iters: a huge count
    would hang building them."""
    with pytest.raises(ValueError, match=f"n_iters must be at most {MAX_N_ITERS}, got 10000000"):
        coor_descent(scores(), n_iters=10**7, k=1)


@pytest.mark.parametrize("bad", [math.inf, math.nan, math.log(9)])
def test_operator_refuses_log_k_values_out_of_range(bad):
    """Called directly, the operator reads a per-row log k back, as coor_descent reads k."""
    s = scores()
    logk = torch.full((3,), math.log(2), device=DEVICE)
    logk[1] = bad
    with pytest.raises(ValueError, match=r"every logk must be log k with 0 < k <= n, the row length \(8\)"):
        torch.ops.course_lib.coor_descent(s, None, logk, 0.0, 3, 0.1, None, 1.0)


def test_rejects_non_number_eps():
    with pytest.raises(TypeError, match="eps must be a number, got str"):
        coor_descent(scores(), n_iters=5, k=1, eps="0.1")


def test_rejects_bad_mask():
    with pytest.raises(ValueError, match=r"mask must have the shape of s, \(3, 8\); got \(3, 7\)"):
        coor_descent(scores(), n_iters=5, k=1, mask=torch.ones(3, 7, dtype=torch.bool, device=DEVICE))
    with pytest.raises(ValueError, match=r"mask must have the shape of s, \(3, 8\); got \(8,\)"):
        coor_descent(scores(), n_iters=5, k=1, mask=torch.ones(8, dtype=torch.bool, device=DEVICE))
    with pytest.raises(TypeError, match="mask has dtype torch.float32; accepted: bool"):
        coor_descent(scores(), n_iters=5, k=1, mask=torch.ones(3, 8, device=DEVICE))


def test_rejects_bad_checkpoint_segments():
    with pytest.raises(ValueError, match="checkpoint_segments must be at least 1, got 0"):
        coor_descent(scores(), n_iters=5, k=1, checkpoint_segments=0)


def test_rejects_more_rows_than_int32():
    huge = torch.zeros(1, 1, device=DEVICE).expand(2**31, 1)  # no memory behind it
    with pytest.raises(ValueError, match="rows = 2147483648 is too large"):
        coor_descent(huge, n_iters=5, k=1)


@pytest.mark.parametrize("k", ["number", "per_row"])
@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_compiles_whole(mode, masked, k):
    s = torch.randn(3, 2, 40, device=DEVICE).transpose(0, 1).requires_grad_()  # strided
    mask = torch.rand(s.shape, device=DEVICE) > 0.3 if masked else None
    settings = dict(n_iters=7, eps=0.5, eps_init=2.0, eps_decay=0.9, mask=mask)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if k == "number":
            assert_compiles_whole(lambda s: coor_descent(s, k=5, **settings), s, mode=mode, op="coor_descent")
        else:
            per_row = torch.full((2, 1), 4.0, device=DEVICE, requires_grad=True)  # broadcast to (2, 3)
            assert_compiles_whole(lambda s, k: coor_descent(s, k=k, **settings), s, per_row, mode=mode,
                                  op="coor_descent")
    # Traced, the settings' checks run as code, not through their cache (dynamo warns of one it skips).
    assert not [w for w in caught if "lru_cache" in str(w.message)]


@pytest.mark.parametrize("k", [0.0, 41.0], ids=["zero", "above_n"])
def test_compiled_refuses_bad_input(k):
    s = torch.randn(2, 40, device=DEVICE)
    assert_compiled_refuses(lambda s: coor_descent(s, n_iters=3, k=k), s, error=ValueError, match="k must satisfy")
    per_row = torch.tensor([3.0, k], device=DEVICE)
    assert_compiled_refuses(lambda s, k: coor_descent(s, n_iters=3, k=k), s, per_row, error=ValueError,
                            match="every k must satisfy")


@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
def test_operators_pass_opcheck(masked):
    s = torch.randn(4, 50, device=DEVICE, requires_grad=True)
    mask = torch.rand(s.shape, device=DEVICE) > 0.3 if masked else None
    settings = (5, 0.1, 2.0, 0.7)
    ops = torch.ops.course_lib
    torch.library.opcheck(ops.coor_descent.default, (s, mask, None, 1.0, *settings))
    logk = torch.zeros(4, device=DEVICE, requires_grad=True)
    torch.library.opcheck(ops.coor_descent.default, (s, mask, logk, 0.0, *settings))
    torch.library.opcheck(ops.coor_descent_check_k.default, (torch.full((4,), 3.0, device=DEVICE, requires_grad=True), 50))
    _, a, row_max = ops.coor_descent(s.detach(), mask, None, 1.0, *settings)
    torch.library.opcheck(ops.coor_descent_backward.default,
                          (s.detach(), mask, None, 1.0, *settings, a, row_max, torch.randn_like(s.detach())))


@pytest.mark.parametrize("split", [False, True], ids=["whole-rows", "split-rows"])
def test_a_nan_score_makes_its_row_nan_as_the_reference_does(split, monkeypatch):
    """A GPU's max and min skip a NaN; the kernels still give its row NaN (max_or_nan),
    in whole rows and in rows split across programs."""
    if split:
        monkeypatch.setattr(launchers, "ROW_BLOCK_MAX", 16)
        monkeypatch.setattr(launchers, "SPLIT_TILE_MIN", 8)
    s = torch.randn(3, 40, device=DEVICE)
    s[1, 33] = float("nan")
    got = coor_descent(s, n_iters=5, k=3.0)
    expected = references.coor_descent(s.double(), n_iters=5, k=3.0)
    assert got[1].isnan().all() and expected[1].isnan().all()
    assert not got[[0, 2]].isnan().any()
    torch.testing.assert_close(got[[0, 2]].double(), expected[[0, 2]], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("split", [False, True], ids=["whole-rows", "split-rows"])
def test_a_nan_score_makes_its_rows_gradient_nan_as_the_reference_does(split, monkeypatch):
    """The backward of a row with a NaN score is NaN, as autograd through the reference
    gives it (a GPU's max would skip the NaN); the other rows' gradients are the reference's."""
    if split:
        monkeypatch.setattr(launchers, "ROW_BLOCK_MAX", 16)
        monkeypatch.setattr(launchers, "SPLIT_TILE_MIN", 8)
    s = torch.randn(3, 40, device=DEVICE)
    s[1, 33] = float("nan")
    weights = torch.randn(3, 40, device=DEVICE)
    ours = s.clone().requires_grad_()
    (coor_descent(ours, n_iters=5, k=3.0) * weights).sum().backward()
    reference = s.double().requires_grad_()
    (references.coor_descent(reference, n_iters=5, k=3.0) * weights.double()).sum().backward()
    assert ours.grad[1].isnan().all() and reference.grad[1].isnan().all()
    assert not ours.grad[[0, 2]].isnan().any()
    torch.testing.assert_close(ours.grad[[0, 2]].double(), reference.grad[[0, 2]], rtol=1e-3, atol=1e-4)


def test_k_check_operator_refuses_what_coor_descent_refuses():
    with pytest.raises(TypeError, match="coor_descent_check_k: k has dtype torch.bool"):
        torch.ops.course_lib.coor_descent_check_k(torch.tensor([True], device=DEVICE), 8)
    with pytest.raises(ValueError, match="coor_descent_check_k: n_cols, the row length, must be at least 1, got -1"):
        torch.ops.course_lib.coor_descent_check_k(torch.tensor([1.0], device=DEVICE), -1)


def test_backward_operator_errors_name_the_backward():
    s = scores()
    y, a, row_max = torch.ops.course_lib.coor_descent(s, None, None, 0.5, 3, 0.1, None, 1.0)
    with pytest.raises(ValueError, match="coor_descent_backward: n_iters must be at least 1"):
        torch.ops.course_lib.coor_descent_backward(s, None, None, 0.5, 0, 0.1, None, 1.0, a, row_max, y)
