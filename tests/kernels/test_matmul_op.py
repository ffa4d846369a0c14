import pytest
import torch
import triton

from conftest import (COMPILE_MODES, DTYPES, assert_compiled_refuses, assert_compiles_whole, assert_matches, far_apart,
                      gpu_only, poison_cached_memory)
from course_lib import matmul
from course_lib.core import references
from course_lib.core.runtime import DEVICE, ON_GPU, pick
from course_lib.kernels import matmul_op
from course_lib.kernels.matmul_op import CONFIGS, INTERPRETER_CONFIG, dot_precision, launch_matmul

# (M, N, K): none a multiple of the tiles but the first (1 x 1 x 1), and tiles that span
# several groups of GROUP_M rows of tiles (the interpreter's tiles are 32 and GROUP_M 2).
SHAPES = [(1, 1, 1), (17, 33, 65), (70, 20, 33), (3, 100, 7)] + pick(
    gpu=[(1000, 700, 1100), (257, 1030, 4099), (4096, 96, 513)], cpu=[])
ACTIVATIONS = [None, "relu", "gelu"]


def operands(m, n, k, dtype, bias=False):
    """a (m, k) and b (k, n), b scaled by 1/sqrt(k) so that a @ b is about N(0, 1)
    wherever k is: the range where gelu bends."""
    a = torch.randn(m, k, device=DEVICE, dtype=dtype)
    b = (torch.randn(k, n, device=DEVICE) / max(k, 1) ** 0.5).to(dtype)
    return (a, b, torch.randn(n, device=DEVICE, dtype=dtype)) if bias else (a, b)


def check_forward_and_backward(a, b, dtype, bias=None, activation=None):
    """Run the kernels and compare the output and the gradients of a, b (and bias) with
    the float64 reference; the error allowed grows with the square root of the terms
    each value sums."""
    leaves = [t.detach().requires_grad_() for t in (a, b) + ((bias,) if bias is not None else ())]
    poison_cached_memory(4 * (a.numel() + b.numel()))
    out = matmul(leaves[0], leaves[1], bias=leaves[2] if bias is not None else None, activation=activation)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)

    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    out64 = references.matmul(*leaves64[:2], leaves64[2] if bias is not None else None, activation)
    out64.backward(grad_out.double())

    k, n = b.shape
    rows = a.numel() // max(k, 1)
    assert_matches(out, out64.detach(), dtype, length=k, what="out")
    assert_matches(leaves[0].grad, leaves64[0].grad, dtype, length=n, what="grad_a")
    assert_matches(leaves[1].grad, leaves64[1].grad, dtype, length=rows, what="grad_b")
    if bias is not None:
        assert_matches(leaves[2].grad, leaves64[2].grad, dtype, length=rows, what="grad_bias")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_reference(shape, dtype):
    check_forward_and_backward(*operands(*shape, dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_bias_and_activation(activation, dtype):
    a, b, bias = operands(*pick(gpu=(300, 260, 200), cpu=(37, 45, 40)), dtype, bias=True)
    check_forward_and_backward(a, b, dtype, bias=bias, activation=activation)


@pytest.mark.parametrize("activation", ACTIVATIONS[1:])
def test_activation_without_bias(activation):
    check_forward_and_backward(*operands(19, 35, 24, torch.float32), torch.float32, activation=activation)


@pytest.mark.parametrize("dtype", DTYPES)
def test_any_strides(dtype):
    a, b = operands(40, 36, 50, dtype)
    check_forward_and_backward(a.t().contiguous().t(), b, dtype)  # a column-major
    check_forward_and_backward(a, b.t().contiguous().t(), dtype)  # b column-major, as F.linear's weight.t()
    wide_a, wide_b = operands(80, 108, 100, dtype)
    check_forward_and_backward(wide_a[::2, 1::2], wide_b[::2, ::3], dtype)  # every stride past 1
    bias = torch.randn(72, device=DEVICE, dtype=dtype)[::2]
    check_forward_and_backward(a, b, dtype, bias=bias, activation="gelu")  # a strided bias
    broadcast_b = torch.randn(1, 36, device=DEVICE, dtype=dtype).expand(50, 36)  # stride 0
    check_forward_and_backward(a, broadcast_b, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_leading_dimensions_are_rows(dtype):
    a, b = operands(2 * 3 * 7, 20, 24, dtype)
    batched = a.reshape(2, 3, 7, 24)
    check_forward_and_backward(batched, b, dtype, activation="relu")
    check_forward_and_backward(batched.permute(1, 0, 2, 3), b, dtype)  # not viewable as 2-D: copied
    out = matmul(batched, b)
    assert out.shape == (2, 3, 7, 20) and out.is_contiguous()
    torch.testing.assert_close(out.reshape(-1, 20), matmul(a, b), rtol=0, atol=0)


@pytest.mark.parametrize("group_m", [1, 2, 3, 8])
@pytest.mark.parametrize("blocks", [(16, 16, 16), (32, 64, 16), (64, 32, 32)], ids=str)
def test_every_tile_in_grouped_order(blocks, group_m):
    # 5 x 3 tiles and more: groups of GROUP_M rows of tiles, the last one short.
    config = triton.Config({"BLOCK_M": blocks[0], "BLOCK_N": blocks[1], "BLOCK_K": blocks[2], "GROUP_M": group_m},
                           num_warps=4, num_stages=2)
    a, b = operands(5 * blocks[0] - 3, 3 * blocks[1] - 5, 2 * blocks[2] + 1, torch.float32)
    c = torch.full((a.shape[0], b.shape[1]), float("nan"), device=DEVICE)
    launch_matmul(a, b, c, config=config)
    assert_matches(c, references.matmul(a.double(), b.double()), torch.float32, length=a.shape[1])


def test_accumulates_in_float32():
    # 2048 products of 1 in bfloat16: a bfloat16 accumulator would stop at 256.
    a = torch.ones(16, 2048, device=DEVICE, dtype=torch.bfloat16)
    b = torch.ones(2048, 16, device=DEVICE, dtype=torch.bfloat16)
    assert torch.all(matmul(a, b).double() == 2048.0)


def test_float32_takes_tf32_only_when_torch_does():
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert dot_precision(torch.float32) == "ieee"
        torch.backends.cuda.matmul.allow_tf32 = True
        assert dot_precision(torch.float32) == "tf32"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    assert dot_precision(torch.bfloat16) is None and dot_precision(torch.float16) is None


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_empty_inner_size_gives_the_activation_of_the_bias(activation):
    # K = 0: a @ b is zeros, so every row is act(bias); nothing is launched.
    a = torch.randn(4, 0, device=DEVICE, requires_grad=True)
    b = torch.randn(0, 6, device=DEVICE, requires_grad=True)
    bias = torch.randn(6, device=DEVICE, requires_grad=True)
    out = matmul(a, b, bias=bias, activation=activation)
    expected = references.matmul(a.detach(), b.detach(), bias.detach(), activation)
    torch.testing.assert_close(out, expected)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    assert a.grad.shape == (4, 0) and b.grad.shape == (0, 6)
    bias64 = bias.detach().double().requires_grad_()
    references.matmul(a.detach().double(), b.detach().double(), bias64, activation).backward(grad_out.double())
    assert_matches(bias.grad, bias64.grad, torch.float32, length=4, what="grad_bias")
    assert torch.equal(matmul(a.detach(), b.detach()), torch.zeros(4, 6, device=DEVICE))


@pytest.mark.parametrize("shape", [(0, 5, 3), (4, 0, 3), (0, 0, 0)], ids=str)
def test_empty_rows_or_columns(shape):
    m, n, k = shape
    a = torch.randn(m, k, device=DEVICE, requires_grad=True)
    b = torch.randn(k, n, device=DEVICE, requires_grad=True)
    bias = torch.randn(n, device=DEVICE, requires_grad=True)
    out = matmul(a, b, bias=bias, activation="gelu")
    assert out.shape == (m, n)
    out.sum().backward()
    # Gradients of sizes that are not empty are zeros, not unwritten memory.
    assert torch.equal(a.grad, torch.zeros(m, k, device=DEVICE))
    assert torch.equal(b.grad, torch.zeros(k, n, device=DEVICE))
    assert torch.equal(bias.grad, torch.zeros(n, device=DEVICE))


def test_without_gradients_skips_autograd():
    a, b, bias = (t.requires_grad_() for t in operands(9, 21, 17, torch.float32, bias=True))
    with torch.no_grad():
        out = matmul(a, b, bias=bias, activation="gelu")
    assert out.grad_fn is None and not out.requires_grad
    assert matmul(a.detach(), b.detach()).grad_fn is None
    torch.testing.assert_close(out, matmul(a, b, bias=bias, activation="gelu").detach(), rtol=0, atol=0)


def test_gradient_of_one_operand_only():
    a, b = operands(9, 21, 17, torch.float32)
    b.requires_grad_()
    matmul(a, b, activation="relu").sum().backward()
    expected = torch.autograd.grad(references.matmul(a, b, None, "relu").sum(), b)[0]
    torch.testing.assert_close(b.grad, expected, rtol=1e-5, atol=1e-5)


def test_relu_output_changed_in_place_is_refused_by_autograd():
    # relu's backward reads its output, as torch.relu's does: changing it first is an error.
    a, b = (t.requires_grad_() for t in operands(5, 6, 7, torch.float32))
    out = matmul(a, b, activation="relu")
    out += 1.0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_second_order_gradients_are_refused():
    a, b = (t.requires_grad_() for t in operands(5, 6, 7, torch.float32))
    grad_a, = torch.autograd.grad(matmul(a, b).sum(), a, create_graph=True)
    with pytest.raises(RuntimeError, match="matmul: second-order gradients are not supported"):
        grad_a.sum().backward()


@pytest.mark.parametrize("operand", ["a", "b"])
def test_offsets_past_two_to_the_31(operand, tmp_path):
    # The kernel indexes in 64 bits: a row (of a) or a row of b (along K) whose offset,
    # index × stride, passes 2**31 elements, with strides that fit in 32 bits.
    far = far_apart(torch.randn(8), tmp_path)[:, None]  # (8, 1), rows 2**31 / 7 apart
    other = torch.randn(1, 3, device=DEVICE) if operand == "a" else torch.randn(2, 8, device=DEVICE)
    a, b = (far, other) if operand == "a" else (other, far)
    out = matmul(a, b)
    torch.testing.assert_close(out.double(), references.matmul(a.double(), b.double()), rtol=1e-5, atol=1e-5)


def test_the_interpreter_takes_one_small_config_and_the_gpu_the_autotuner():
    for config in CONFIGS + [INTERPRETER_CONFIG]:
        for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
            value = config.kwargs[name]
            assert value >= 16 and value & (value - 1) == 0, (config, name)
    assert 6 <= len(CONFIGS) <= 10


@gpu_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_autotuned_choice_is_kept_and_deterministic(dtype):
    a, b = operands(1024, 1024, 1024, dtype)  # AUTOTUNED_WORK: smaller products take SMALL_CONFIG
    first = matmul(a, b)
    # 16-bit products on a GPU with the TMA engine take matmul_tma_kernel, the others matmul_kernel
    out = torch.empty(1024, 1024, device=DEVICE, dtype=dtype)
    tma = matmul_op.takes_tma(a, b, out)
    assert tma == (dtype == torch.bfloat16 and torch.cuda.get_device_capability()[0] >= 9)
    chosen = (matmul_op._tuned_tma[(1024, 1024, 1024, dtype, False, False)] if tma
              else matmul_op._tuned[(1024, 1024, 1024, dtype)])
    space = matmul_op.TMA_CONFIGS if tma else CONFIGS
    assert any(chosen.kwargs == config.kwargs and chosen.num_warps == config.num_warps for config in space)
    for _ in range(3):
        assert torch.equal(matmul(a, b), first)


needs_descriptors = pytest.mark.skipif(not matmul_op.HAS_DESCRIPTORS,
                                       reason="this Triton has no host-side tensor descriptors")


@needs_descriptors
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("a_transposed", [False, True])
@pytest.mark.parametrize("b_transposed", [False, True])
@pytest.mark.parametrize(("shape", "activation"), [((40, 48, 72), None), ((72, 200, 16), "gelu"),
                                                   ((296, 24, 136), "relu")], ids=str)
def test_tma_kernel_matches_reference(shape, activation, a_transposed, b_transposed, dtype):
    # Every layout the TMA engine reads (rows, or a transposed view of rows), edge tiles
    # past M and N, the bias, the activation and the kept pre-activation; K a multiple of
    # 8, and M too where a is transposed, as 16-byte rows of 16-bit values need. On a GPU
    # a fixed configuration (no autotuning).
    m, n, k = shape
    a = (torch.randn(k, m, device=DEVICE, dtype=dtype).t() if a_transposed
         else torch.randn(m, k, device=DEVICE, dtype=dtype))
    b = ((torch.randn(n, k, device=DEVICE).t() if b_transposed else torch.randn(k, n, device=DEVICE))
         / k**0.5).to(dtype)
    bias = torch.randn(n, device=DEVICE, dtype=dtype)
    out, pre = (torch.full((m, n), float("nan"), device=DEVICE, dtype=dtype) for _ in range(2))
    matmul_op.launch_matmul_tma(a, b, out, bias, pre, activation or "none",
                                config=pick(gpu=matmul_op.TMA_CONFIGS[1], cpu=None))
    a64, b64, bias64 = a.double(), b.double(), bias.double()
    assert_matches(out, references.matmul(a64, b64, bias64, activation), dtype, length=k, what="out")
    assert_matches(pre, references.matmul(a64, b64, bias64), dtype, length=k, what="pre")


def test_tma_reads_only_memory_the_engine_can():
    rows = torch.randn(8, 16, device=DEVICE, dtype=torch.bfloat16)
    assert matmul_op._tma_layout(rows) is False
    assert matmul_op._tma_layout(rows.t()) is True
    assert matmul_op._tma_layout(rows[:, 1:]) is None  # its first element 2 bytes past a boundary
    assert matmul_op._tma_layout(rows[:, ::2]) is None  # no unit stride
    assert matmul_op._tma_layout(torch.randn(8, 12, device=DEVICE, dtype=torch.bfloat16)) is None  # 24-byte rows
    big = torch.randn(1024, 1024, device=DEVICE, dtype=torch.bfloat16)
    out = torch.empty(1024, 1024, device=DEVICE, dtype=torch.bfloat16)
    # float32, the interpreter, a small product, a transposed output: matmul_kernel
    assert not matmul_op.takes_tma(big.float(), big.float(), out.float())
    assert not matmul_op.takes_tma(big[:64], big, out[:64])
    assert not matmul_op.takes_tma(big, big, out.t())
    if not ON_GPU:
        assert not matmul_op.takes_tma(big, big, out)


# ------------------------------------------------------------------------ bad input


OK = torch.randn(4, 3, device=DEVICE)
OK_B = torch.randn(3, 5, device=DEVICE)


@pytest.mark.parametrize(("args", "kwargs", "error", "match"), [
    ((OK.cpu().numpy(), OK_B), {}, TypeError, "matmul: a must be a torch.Tensor, got ndarray"),
    ((OK, OK_B.to("meta")), {}, ValueError, "matmul: b is on meta"),
    ((OK.long(), OK_B), {}, TypeError, "a has dtype torch.int64; accepted: float32, float16, bfloat16"),
    ((OK.double(), OK_B), {}, TypeError, "b has dtype torch.float32 but a has torch.float64; cast one"),
    ((OK, OK_B.half()), {}, TypeError, "b has dtype torch.float16 but a has torch.float32; cast one"),
    ((OK[0], OK_B), {}, ValueError, r"a must have at least 2 dimension\(s\), got shape \(3,\)"),
    ((OK, OK_B[None]), {}, ValueError, r"b must have 2 dimensions \(K, N\), got shape \(1, 3, 5\)"),
    ((OK, OK_B[:2]), {}, ValueError, r"inner sizes differ: a of shape \(4, 3\) has K = 3 columns, b of shape "
                                     r"\(2, 5\) has K = 2 rows"),
    ((OK, OK_B), {"bias": torch.randn(4, device=DEVICE)}, ValueError,
     r"bias must have shape \(N,\) with N = b.shape\[1\] = 5; got bias of shape \(4,\)"),
    ((OK, OK_B), {"bias": torch.randn(1, 5, device=DEVICE)}, ValueError, r"bias must have shape \(N,\)"),
    ((OK, OK_B), {"bias": torch.randn(5, device=DEVICE).half()}, TypeError,
     "bias has dtype torch.float16 but a has torch.float32"),
    ((OK, OK_B), {"bias": [1.0] * 5}, TypeError, "bias must be a torch.Tensor, got list"),
    ((OK, OK_B), {"activation": "tanh"}, ValueError, "unknown activation 'tanh'; accepted: None, 'relu', 'gelu'"),
    ((OK, OK_B), {"activation": torch.relu}, ValueError, "unknown activation"),
], ids=["numpy", "device", "int64", "float64 and float32", "mixed dtypes", "a 1-D", "b 3-D", "inner sizes", "bias length",
        "bias 2-D", "bias dtype", "bias list", "activation name", "activation function"])
def test_rejects_bad_input(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        matmul(*args, **kwargs)


def test_rejects_sizes_past_int32():
    huge = torch.zeros(1, 1, device=DEVICE).expand(2**31, 1)  # no memory behind it
    with pytest.raises(ValueError, match="M = 2147483648 is too large"):
        matmul(huge, torch.ones(1, 2, device=DEVICE))
    with pytest.raises(ValueError, match="N = 2147483648 is too large"):
        matmul(torch.ones(2, 1, device=DEVICE), huge.t())


def test_rejects_tensors_on_different_devices():
    with pytest.raises(ValueError, match="b is on meta"):
        matmul(OK, torch.empty(3, 5, device="meta"))
    if ON_GPU:
        with pytest.raises(ValueError, match="b is on cpu"):
            matmul(OK, OK_B.cpu())


# ------------------------------------------------------------------ torch.compile


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_compiles_whole(mode, dtype):
    a, b = operands(19, 37, 41, dtype)
    column_major = a.t().contiguous().t().requires_grad_()
    assert_compiles_whole(matmul, column_major, b.requires_grad_(), mode=mode, op="matmul")


@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_compiles_whole_with_bias_and_gelu(mode):
    a, b, bias = (t.requires_grad_() for t in operands(2 * 19, 37, 41, torch.float32, bias=True))
    batched = a.detach().reshape(2, 19, 41).requires_grad_()
    assert_compiles_whole(lambda a, b, bias: matmul(a, b, bias=bias, activation="gelu"), batched, b, bias,
                          mode=mode, op="matmul")


def test_compiled_refuses_bad_input():
    assert_compiled_refuses(lambda a: matmul(a, OK_B[:2]), OK, error=ValueError, match="inner sizes differ")


@pytest.mark.parametrize("activation", ["none", "relu", "gelu"])
def test_operators_pass_opcheck(activation):
    a, b, bias = (t.requires_grad_() for t in operands(9, 18, 21, torch.float32, bias=True))
    torch.library.opcheck(torch.ops.course_lib.matmul.default, (a, b, bias, activation))
    out, pre = torch.ops.course_lib.matmul(a.detach(), b.detach(), bias.detach(), activation)
    saved = {"none": pre, "relu": out, "gelu": pre}[activation]
    torch.library.opcheck(torch.ops.course_lib.matmul_backward.default,
                          (a.detach(), b.detach(), saved, torch.randn_like(out), activation, True))


def test_backward_operator_refuses_a_saved_tensor_of_another_shape():
    a, b = operands(9, 18, 21, torch.float32)
    with pytest.raises(ValueError, match=r"matmul_backward: saved must have shape \(9, 18\), got \(9, 17\)"):
        torch.ops.course_lib.matmul_backward(a, b, torch.randn(9, 17, device=DEVICE), torch.randn(9, 18, device=DEVICE),
                                             "gelu", False)
