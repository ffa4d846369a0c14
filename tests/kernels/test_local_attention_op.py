import pytest
import torch

from conftest import (COMPILE_MODES, DTYPES, TOLERANCES, assert_compiled_refuses, assert_compiles_whole, assert_matches,
                      far_apart)
from course_lib.core import references
from course_lib.kernels import local_attention_op as la
from course_lib.core.plans import LaunchPlan
from course_lib.kernels.local_attention_op import MAX_HEAD_DIM, local_causal_attention
from course_lib.core.runtime import DEVICE, pick

# (batch, heads, n, head_dim, window): one token; n not a multiple of the window; a
# window longer than the sequence; windows of one token; head sizes that are not powers
# of two and the largest one held in registers.
CASES = [(1, 1, 1, 8, 4), (2, 3, 37, 16, 8), (1, 2, 64, 64, 16), (1, 1, 130, 32, 64), (2, 1, 9, 4, 100),
         (1, 1, 50, 24, 1), (1, 1, 70, 128, 32)] + pick(
    gpu=[(2, 8, 1024, 64, 128), (1, 4, 4100, 64, 128), (1, 2, 300, 96, 50)], cpu=[])


def heads_of(t, heads):
    """(b, n, h * d) -> (b, h, n, d) as a view, as a block splits its heads."""
    b, n, _ = t.shape
    return t.reshape(b, n, heads, -1).transpose(1, 2)


def qkv(batch, heads, n, head_dim, dtype):
    """q, k and v as one projection's three chunks: strided views, as the block passes them."""
    projection = torch.randn(batch, n, 3 * heads * head_dim, device=DEVICE, dtype=dtype)
    return [heads_of(t, heads).requires_grad_() for t in projection.chunk(3, dim=-1)]


def check(q, k, v, window):
    out = local_causal_attention(q, k, v, window)
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    expected = references.local_causal_attention(q64, k64, v64, window)
    expected_grads = torch.autograd.grad(expected, (q64, k64, v64), grad_out.double())
    keys_seen = min(2 * window, q.shape[-2])  # terms in a query's sums
    assert_matches(out, expected.detach(), q.dtype, what="out")
    for name, got, want in zip("qkv", grads, expected_grads):
        assert_matches(got, want, q.dtype, length=keys_seen, what=f"grad_{name}")
    return out, grads


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("batch", "heads", "n", "head_dim", "window"), CASES, ids=str)
def test_matches_dense_reference(batch, heads, n, head_dim, window, dtype):
    q, k, v = (t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
               for t in qkv(batch, heads, n, head_dim, dtype))
    check(q, k, v, window)


@pytest.mark.parametrize("dtype", DTYPES)
def test_any_strides(dtype):
    q, k, v = qkv(2, 3, 37, 16, dtype)  # chunks of one projection
    out, _ = check(q, k, v, 8)
    contiguous = [t.detach().contiguous().requires_grad_() for t in (q, k, v)]
    torch.testing.assert_close(local_causal_attention(*contiguous, 8), out, rtol=0, atol=0)


def test_output_is_laid_out_heads_last():
    q, k, v = qkv(2, 3, 20, 8, torch.float32)
    out = local_causal_attention(q, k, v, 4)
    assert out.shape == (2, 3, 20, 8) and out.transpose(1, 2).is_contiguous()  # merging heads is a view
    grads = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert all(g.shape == (2, 3, 20, 8) for g in grads)


def test_without_gradients_gives_the_same_values():
    q, k, v = qkv(1, 2, 33, 16, torch.float32)
    with torch.no_grad():
        plain = local_causal_attention(q, k, v, 8)
    assert not plain.requires_grad
    torch.testing.assert_close(plain, local_causal_attention(q, k, v, 8).detach(), rtol=0, atol=0)


def test_a_key_outside_the_windows_changes_nothing():
    # Query 20 with windows of 8 sees keys 8..20. Keys 7 and 21.. share its tiles: NaN
    # scores there and huge values must get weight exactly 0. (A NaN value would not
    # stay out: 0 * NaN is NaN in the weights' product with the values, as in any
    # attention that multiplies a tile of weights by a tile of values.)
    q, k, v = (t.detach() for t in qkv(1, 1, 24, 8, torch.float32))
    clean = local_causal_attention(q, k, v, 8)
    k_dirty, v_dirty = k.clone(), v.clone()
    for hidden in (7, slice(21, None)):
        k_dirty[..., hidden, :] = float("nan")
        v_dirty[..., hidden, :] = 1e30
    dirty = local_causal_attention(q, k_dirty, v_dirty, 8)
    assert torch.equal(dirty[..., 20, :], clean[..., 20, :])


@pytest.mark.parametrize("tiles", [LaunchPlan(32, 128, 8, 3), LaunchPlan(128, 32, 4, 1), LaunchPlan(16, 16, 4, 2)], ids=str)
def test_any_tiles_give_the_same_values(tiles):
    # Tiles larger and smaller than the window, and tiles of queries and keys that differ:
    # the key range of a query tile (and the query range of a key tile) must not assume
    # the tuned ones. Compared with the float64 reference, as the default tiles are.
    q, k, v = (t.detach() for t in qkv(1, 2, 150, 16, torch.float32))
    out, lse = la.local_attention_forward(q, k, v, 40, tiles=tiles)
    grad_out = torch.randn_like(out)
    grads = la.local_attention_backward(grad_out, q, k, v, out, lse, 40, q_tiles=tiles, kv_tiles=tiles)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    expected = references.local_causal_attention(q64, k64, v64, 40)
    expected_grads = torch.autograd.grad(expected, (q64, k64, v64), grad_out.double())
    assert_matches(out, expected.detach(), torch.float32, what="out")
    for name, got, want in zip("qkv", grads, expected_grads):
        assert_matches(got, want, torch.float32, length=80, what=f"grad_{name}")


def test_empty_sequence():
    q, k, v = (torch.zeros(2, 3, 0, 8, device=DEVICE, requires_grad=True) for _ in range(3))
    out = local_causal_attention(q, k, v, 4)
    assert out.shape == (2, 3, 0, 8)
    grads = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert all(g.shape == (2, 3, 0, 8) for g in grads)


def test_rejects_more_heads_than_a_grid_holds():
    # 70000 (batch * heads) programs in the grid's second dimension, which holds 65535.
    q = torch.zeros(1, 1, 1, 1, device=DEVICE).expand(70000, 1, 16, 16)
    with pytest.raises(ValueError, match=r"batch \* heads = 70000 is more than the 65535"):
        local_causal_attention(q, q, q, 8)


# ---------------------------------------------------------------- bad input

OK = torch.zeros(1, 2, 8, 16, device=DEVICE)


@pytest.mark.parametrize(("args", "error", "match"), [
    ((OK.cpu().numpy(), OK, OK, 4), TypeError, "q must be a torch.Tensor"),
    ((OK[0], OK[0], OK[0], 4), ValueError, r"q must have at least 4 dimension|q must have 4 dimensions"),
    ((OK[None], OK[None], OK[None], 4), ValueError, r"q must have 4 dimensions \(batch, heads, n, head_dim\)"),
    ((OK, OK[:, :, :4], OK, 4), ValueError, r"q, k and v must have one shape"),
    ((OK, OK.double(), OK, 4), TypeError, r"float64|dtype"),
    ((OK, OK, OK.half(), 4), (TypeError, ValueError), r"dtype"),
    ((torch.zeros(1, 1, 4, MAX_HEAD_DIM + 1, device=DEVICE),) * 3 + (4,), ValueError,
     rf"head_dim must be between 1 and {MAX_HEAD_DIM}, got {MAX_HEAD_DIM + 1}"),
    ((OK, OK, OK, 0), ValueError, "window must be at least 1, got 0"),
    ((OK, OK, OK, 4.0), TypeError, "window must be an int, got float"),
    ((OK, OK, OK, True), TypeError, "window must be an int, got bool"),
], ids=["numpy", "3-D", "5-D", "shapes", "float64", "mixed dtypes", "head_dim", "window 0", "window float",
        "window bool"])
def test_rejects_bad_input(args, error, match):
    with pytest.raises(error, match=match):
        local_causal_attention(*args)


# ------------------------------------------------------------------ torch.compile


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_compiles_whole(mode, dtype):
    q, k, v = qkv(2, 3, 37, 16, dtype)
    assert_compiles_whole(lambda q, k, v: local_causal_attention(q, k, v, 8), q, k, v, mode=mode,
                          op="local_attention")


def test_compiled_refuses_bad_input():
    assert_compiled_refuses(lambda q: local_causal_attention(q, q, q, 0), OK, error=ValueError,
                            match="window must be at least 1")


def test_operators_pass_opcheck():
    q, k, v = (t.detach().requires_grad_() for t in qkv(1, 2, 19, 16, torch.float32))
    torch.library.opcheck(torch.ops.course_lib.local_attention.default, (q, k, v, 8))
    out, lse = torch.ops.course_lib.local_attention(q.detach(), k.detach(), v.detach(), 8)
    grad_out = torch.randn_like(out)
    torch.library.opcheck(torch.ops.course_lib.local_attention_backward.default,
                          (grad_out, q.detach(), k.detach(), v.detach(), out, lse, 8))


def test_a_window_of_any_size_is_plain_causal_attention():
    """Windows of n tokens or more (2**31 and beyond) are one window: computed as causal
    attention over the whole sequence, not passed to Triton as a constexpr too large."""
    q, k, v = (torch.randn(1, 2, 10, 16, device=DEVICE) for _ in range(3))
    expected = local_causal_attention(q, k, v, 10)
    for window in (11, 2**31, 2**40):
        torch.testing.assert_close(local_causal_attention(q, k, v, window), expected, rtol=0, atol=0)


def test_the_output_is_a_tensor_of_its_own():
    """Not a view made inside the autograd.Function: a caller may modify it in place,
    with or without a gradient (the tests below check the gradients)."""
    q, k, v = (torch.randn(1, 2, 10, 16, device=DEVICE) for _ in range(3))
    out = local_causal_attention(q, k, v, 4)
    assert out._base is None  # laid out heads-last, (b, n, h, d), but not a view of such a tensor
    assert out.transpose(1, 2).is_contiguous()
    out += 1.0
    torch.testing.assert_close(out, references.local_causal_attention(q, k, v, 4) + 1.0)
    q.requires_grad_()
    out = local_causal_attention(q, k, v, 4)
    out += 1.0
    out.sum().backward()
    assert q.grad is not None


# ------------------------------------------------ the output modified in place


def expected_gradients(q, k, v, window, modify, grad_out, *others):
    """The float64 gradients toward q, k, v and ``others`` of ``modify(attention, *others)``."""
    q64, k64, v64, *others64 = (t.detach().double().requires_grad_() for t in (q, k, v, *others))
    attention = references.local_causal_attention(q64, k64, v64, window)
    # Laid out heads-last as the kernel's output, so that modify may merge its heads as a view.
    result = modify(attention.transpose(1, 2).contiguous().transpose(1, 2), *others64)
    return torch.autograd.grad(result, (q64, k64, v64, *others64), grad_out.double())


def add_residual(out, residual):
    out += residual
    return out


def merged_heads_doubled(out):
    """Through a view, as a block merges the heads: bumps out's version all the same."""
    b, h, n, d = out.shape
    out.transpose(1, 2).view(b, n, h * d).mul_(2.0)
    out[:, 0, :3] += 1.0
    return out


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_residual_added_in_place_gives_the_right_gradients(dtype):
    # out += residual, as torch's scaled_dot_product_attention allows: autograd must not
    # refuse it, and the backward must not read the changed output as the forward's.
    q, k, v = qkv(2, 3, 37, 16, dtype)
    residual = torch.randn(2, 3, 37, 16, device=DEVICE, dtype=dtype, requires_grad=True)
    out = add_residual(local_causal_attention(q, k, v, 8), residual)
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v, residual), grad_out)
    expected = expected_gradients(q, k, v, 8, add_residual, grad_out, residual)
    for name, got, want in zip(["q", "k", "v", "residual"], grads, expected):
        assert_matches(got, want, dtype, length=2 * 8, what=f"grad_{name}")  # keys a query sees


def test_a_change_through_a_view_of_the_output_gives_the_right_gradients():
    q, k, v = qkv(2, 3, 37, 16, torch.float32)
    out = merged_heads_doubled(local_causal_attention(q, k, v, 8))
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    expected = expected_gradients(q, k, v, 8, merged_heads_doubled, grad_out)
    for name, got, want in zip("qkv", grads, expected):
        assert_matches(got, want, torch.float32, length=2 * 8, what=f"grad_{name}")


def test_the_backward_recomputes_the_output_only_when_it_was_changed(monkeypatch):
    # The unchanged output is read as the forward left it: no copy, no second forward.
    forwards, operator = [], la.LOCAL_ATTENTION.operator
    monkeypatch.setattr(la, "LOCAL_ATTENTION", la.LOCAL_ATTENTION._replace(
        operator=lambda *args: forwards.append(args) or operator(*args)))
    q, k, v = qkv(1, 2, 19, 16, torch.float32)
    out = local_causal_attention(q, k, v, 8)
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert not forwards
    changed = local_causal_attention(q, k, v, 8)
    changed += 1.0
    for got, want in zip(torch.autograd.grad(changed, (q, k, v), torch.ones_like(out)), grads):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert len(forwards) == 1


def test_a_retained_graph_gives_the_same_gradients_twice():
    # The first backward lets go of the output it kept; the second recomputes it.
    q, k, v = qkv(1, 2, 19, 16, torch.float32)
    out = local_causal_attention(q, k, v, 8)
    grad_out = torch.randn_like(out)
    first = torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)
    for got, want in zip(torch.autograd.grad(out, (q, k, v), grad_out), first):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_second_order_gradients_are_still_refused_after_an_in_place_change():
    q, k, v = qkv(1, 2, 19, 16, torch.float32)
    out = local_causal_attention(q, k, v, 8)
    out += 1.0
    first = torch.autograd.grad(out, (q, k, v), torch.randn_like(out), create_graph=True)
    with pytest.raises(RuntimeError, match="local_causal_attention: second-order gradients are not supported"):
        sum((g**2).sum() for g in first).backward()


@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_compiles_whole_with_a_residual_added_in_place(mode):
    q, k, v = qkv(2, 3, 37, 16, torch.float32)
    residual = torch.randn(2, 3, 37, 16, device=DEVICE, requires_grad=True)
    assert_compiles_whole(lambda q, k, v, r: add_residual(local_causal_attention(q, k, v, 8), r), q, k, v,
                          residual, mode=mode, op="local_attention")


def test_compiles_with_dynamic_shapes_and_a_window_taken_from_them():
    """Traced with dynamic shapes, window=n is a SymInt: taken as the number it is."""
    torch._dynamo.reset()
    compiled = torch.compile(lambda q: local_causal_attention(q, q, q, q.shape[2]), backend="aot_eager",
                             dynamic=True, fullgraph=True)
    for n in (9, 13):
        q = torch.randn(1, 2, n, 16, device=DEVICE)
        torch.testing.assert_close(compiled(q), local_causal_attention(q, q, q, n))


def test_a_head_dim_whose_stride_times_its_index_passes_2_31(tmp_path):
    # The kernels index head_dim in 64 bits: the stride fits in 32, index × stride does not.
    values = far_apart(torch.randn(8), tmp_path)
    q = values.as_strided((1, 1, 3, 8), (0, 0, 0, values.stride(0)))  # three rows, one storage
    k, v = (torch.randn(1, 1, 3, 8, device=DEVICE) for _ in range(2))
    expected = references.local_causal_attention(q.double(), k.double(), v.double(), 2)
    assert_matches(local_causal_attention(q, k, v, 2), expected, torch.float32, length=4)


@pytest.mark.parametrize("scale", [None, 0.25, 1.0])
def test_scale_sets_the_scores_factor(scale):
    q, k, v = (torch.randn(2, 3, 11, 16, device=DEVICE, requires_grad=True) for _ in "qkv")
    out = local_causal_attention(q, k, v, 4, scale=scale)
    expected = references.local_causal_attention(*(t.double() for t in (q, k, v)), 4, scale=scale)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    expected_grads = torch.autograd.grad(expected, (q, k, v), torch.ones_like(expected))
    for got, wanted in zip(grads, expected_grads):
        torch.testing.assert_close(got, wanted, atol=1e-5, rtol=1e-5)


def test_scale_must_be_a_finite_number():
    q = torch.randn(1, 1, 4, 8, device=DEVICE)
    with pytest.raises(TypeError, match="local_causal_attention: scale must be a number or None, got str"):
        local_causal_attention(q, q, q, 2, scale="0.5")
    with pytest.raises(ValueError, match="local_causal_attention: scale must be finite, got inf"):
        local_causal_attention(q, q, q, 2, scale=float("inf"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_values_near_the_largest_of_their_dtype_give_a_finite_output(dtype):
    """The output is a convex combination of the values: finite wherever they are. Summed
    with weights of up to 1 each before the division, 2 * window values near bfloat16's (or
    float32's) largest passed float32's range, and came out inf."""
    window, big = 16, 0.9 * torch.finfo(dtype).max
    q, k = (torch.randn(2, 2, 70, 32, device=DEVICE, dtype=dtype) for _ in "qk")
    v = ((torch.rand(2, 2, 70, 32, device=DEVICE) * 0.5 + 0.5) * big).to(dtype)  # all near big: no cancelling
    out = local_causal_attention(q, k, v, window)
    expected = references.local_causal_attention(q.double(), k.double(), v.double(), window)
    assert out.isfinite().all()
    rtol, _ = TOLERANCES[dtype]
    torch.testing.assert_close(out.double(), expected, rtol=rtol, atol=0)  # relative: every value is near big
