"""Matrix multiplication with a fused epilogue: C = act(A @ B + bias).

Chapter 6. Each program computes one BLOCK_M x BLOCK_N tile of C from a loop over K
of ``tl.dot`` on tensor cores, accumulating in float32; the programs run in grouped
order, so that the tiles of A and B they share are read from L2, not memory; the bias
and the activation are applied to the tile in registers before its one store. On Hopper
and later GPUs ``matmul_tma_kernel`` computes the same with persistent programs that move
tiles through the TMA engine (``takes_tma`` says where it can). The backward is two more
products by the same kernels. Read top to bottom: the kernels,
the launchers with their tile configurations and autotuning, the operator with its
autograd, and the public ``matmul``.
"""

import functools
import math

import torch
import triton
import triton.language as tl

from ..core import references
from ..core.operator import differentiable_op
from ..core.plans import TunedOn
from ..core.rows import as_rows, sum_partial_rows
from ..core.runtime import ON_GPU, TensorDescriptor, cdiv, is_traced, launch, multiprocessor_count, upcasts_dot
from ..core.validation import (FLOAT_DTYPES, PUBLIC_DTYPES, check_index_range, check_like, check_same_device_and_dtype,
                               check_tensor, on_device_of, runs_reference, by_reference, autocast_as_matmul)

ACTIVATIONS = ("none", "relu", "gelu")
SQRT_2_OVER_PI = tl.constexpr(math.sqrt(2 / math.pi))
GELU_CUBIC = tl.constexpr(0.044715)

# ---------------------------------------------------------------------------- kernels


@triton.jit
def _gelu_gate(x):
    """sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): the tanh approximation's
    0.5 (1 + tanh(u)), written without tanh, which Triton's core language lacks."""
    u = SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x)
    return tl.sigmoid(2.0 * u)


@triton.jit
def _activate(x, ACTIVATION: tl.constexpr):
    """relu or gelu (torch's approximate="tanh") of a float32 tile."""
    if ACTIVATION == "relu":
        x = tl.where(x < 0.0, 0.0, x)  # not tl.maximum: a NaN stays NaN, as in torch.relu
    elif ACTIVATION == "gelu":
        x = x * _gelu_gate(x)
    return x


@triton.jit
def _activation_slope(saved, ACTIVATION: tl.constexpr):
    """act'(pre) from what the forward saved: relu's output (positive exactly where
    pre is) or gelu's pre-activation."""
    if ACTIVATION == "relu":
        slope = tl.where(saved > 0.0, 1.0, 0.0)
    else:
        gate = _gelu_gate(saved)
        inner_slope = 2.0 * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * saved * saved)
        slope = gate + saved * gate * (1.0 - gate) * inner_slope
    return slope


@triton.jit
def grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of the ``tile``-th tile of C in grouped order (Triton's tutorial 03):
    consecutive tiles walk down GROUP_M rows of tiles before moving one tile right, so the
    programs running at once share their rows of A and columns of B, which then come from L2."""
    tiles_per_group = GROUP_M * num_pid_n
    first_pid_m = tile // tiles_per_group * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_pid_m, GROUP_M)  # the last group may be short
    return first_pid_m + (tile % tiles_per_group) % group_rows, (tile % tiles_per_group) // group_rows


@triton.jit
def matmul_kernel(
    a_ptr, b_ptr, bias_ptr, c_ptr, pre_ptr,
    M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_bias, stride_cm, stride_cn,
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, KEEP_PRE: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """One program computes the tile (pid_m, pid_n) of C = act(A @ B + bias).

    KEEP_PRE: also store A @ B + bias (pre_ptr, laid out as C), which gelu's backward
    needs. HAS_BIAS, ACTIVATION and KEEP_PRE are constexprs: each combination compiles
    to its own kernel, with no branch left in it.
    """
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)

    # Rows and columns past the matrix wrap around to real ones: the loads need no mask
    # along M and N (the store drops those values). In 64 bits: index × stride can pass 2**31.
    rows = (pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    cols = (pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    a_rows = a_ptr + rows[:, None] * stride_am
    b_cols = b_ptr + cols[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_start in range(0, K, BLOCK_K):
        ks = k_start + tl.arange(0, BLOCK_K)
        k_mask = ks < K  # the last step may pass K: zeros there add nothing
        a = tl.load(a_rows + ks[None, :].to(tl.int64) * stride_ak, mask=k_mask[None, :], other=0.0)
        b = tl.load(b_cols + ks[:, None].to(tl.int64) * stride_bk, mask=k_mask[:, None], other=0.0)
        if UPCAST_DOT:
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)

    # The epilogue, on the tile in registers: what separate operations would each read
    # and write through memory once more.
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols * stride_bias).to(tl.float32)[None, :]
    out_rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    out_cols = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    offsets = out_rows[:, None] * stride_cm + out_cols[None, :] * stride_cn
    mask = (out_rows < M)[:, None] & (out_cols < N)[None, :]
    if KEEP_PRE:
        tl.store(pre_ptr + offsets, acc.to(pre_ptr.dtype.element_ty), mask=mask)
    acc = _activate(acc, ACTIVATION)
    tl.store(c_ptr + offsets, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def matmul_tma_kernel(
    a_desc, b_desc, c_desc, pre_desc, bias_ptr,
    M, N, K, stride_bias,
    A_T: tl.constexpr, B_T: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, KEEP_PRE: tl.constexpr, UPCAST_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """matmul_kernel's product with the Tensor Memory Accelerator (Hopper and later) and
    persistent programs: NUM_PROGRAMS programs, one an SM, each take tiles of C in grouped
    order until none is left.

    The descriptors (triton.tools.tensor_descriptor.TensorDescriptor, made on the host)
    describe each matrix's memory with its block shape: a load asks the TMA engine for a
    whole tile, which it copies into shared memory with no per-element address or mask
    arithmetic in the program (a tile past the matrix's edge reads zeros; a store past it
    is dropped). A_T, B_T: the operand's memory holds its transpose row-major (a transposed
    view), so the tile is loaded as it lies and transposed in shared memory. With
    ``flatten=True`` the compiler pipelines the loads of the next tile under the last
    products of this one.
    """
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        first_row = pid_m * BLOCK_M
        first_col = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            a = a_desc.load([k, first_row]).T if A_T else a_desc.load([first_row, k])
            b = b_desc.load([first_col, k]).T if B_T else b_desc.load([k, first_col])
            if UPCAST_DOT:
                acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)
        if HAS_BIAS:
            cols = first_col + tl.arange(0, BLOCK_N)
            acc += tl.load(bias_ptr + cols * stride_bias, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        if KEEP_PRE:
            pre_desc.store([first_row, first_col], acc.to(pre_desc.dtype))
        acc = _activate(acc, ACTIVATION)
        c_desc.store([first_row, first_col], acc.to(c_desc.dtype))


@triton.jit
def activation_backward_kernel(
    grad_out_ptr, saved_ptr, grad_pre_ptr, partial_bias_ptr,
    M, N, rows_per_program,
    stride_gm, stride_gn, stride_sm, stride_pm, stride_partial,
    ACTIVATION: tl.constexpr, WITH_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Program (c, g): grad_pre = grad_out * act'(pre) on column block c for the rows of
    group g (written only when there is an activation; else grad_pre is grad_out), and
    with WITH_BIAS the group's float32 column sum of grad_pre, one partial row of
    grad_bias (summed in a fixed order after, as weighted_sum's grad_weight is)."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    first_row = tl.program_id(1) * rows_per_program
    last_row = tl.minimum(first_row + rows_per_program, M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for row_start in range(first_row, last_row, BLOCK_M):
        rows = (row_start + tl.arange(0, BLOCK_M)).to(tl.int64)
        mask = (rows < last_row)[:, None] & col_mask[None, :]
        grad = tl.load(grad_out_ptr + rows[:, None] * stride_gm + cols[None, :] * stride_gn, mask=mask,
                       other=0.0).to(tl.float32)
        if ACTIVATION != "none":
            saved = tl.load(saved_ptr + rows[:, None] * stride_sm + cols[None, :], mask=mask, other=0.0)
            grad = grad * _activation_slope(saved.to(tl.float32), ACTIVATION)
            tl.store(grad_pre_ptr + rows[:, None] * stride_pm + cols[None, :],
                     grad.to(grad_pre_ptr.dtype.element_ty), mask=mask)
        if WITH_BIAS:
            acc += grad
    if WITH_BIAS:
        tl.store(partial_bias_ptr + tl.program_id(1) * stride_partial + cols, tl.sum(acc, axis=0), mask=col_mask)


# -------------------------------------------------------------------------- launchers


def _config(block_m, block_n, block_k, group_m, num_warps, num_stages):
    return triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "GROUP_M": group_m},
                         num_warps=num_warps, num_stages=num_stages)


# The autotuner's choices on a GPU: tiles of 128 x 256 and 256 x 128 on 8 warps feed an
# H100/H200's tensor cores best at large sizes (Triton's tutorial 03 and its Hopper
# configurations); 128 x 128 and narrower tiles keep enough programs for every SM at
# smaller sizes; BLOCK_K = 32 leaves float32's tiles, twice the bytes, room for 4
# stages in shared memory. A configuration that does not fit a GPU's shared memory is
# skipped by the autotuner. The space is not yet swept: benchmarks/tune_matmul.py times
# each configuration at the benchmark's shapes.
TUNED_ON = TunedOn("NVIDIA H200", "3.6.0", "benchmarks/tune_matmul.py")
CONFIGS = [
    _config(128, 256, 64, 8, 8, 3),
    _config(256, 128, 64, 8, 8, 3),
    _config(128, 256, 64, 8, 8, 4),
    _config(128, 128, 64, 8, 8, 4),
    _config(128, 128, 64, 8, 4, 4),
    _config(64, 256, 64, 8, 4, 4),
    _config(128, 64, 64, 8, 4, 4),
    _config(128, 128, 32, 8, 8, 4),
    _config(64, 128, 32, 8, 4, 4),
]
# Traced by torch.compile before any eager call of the same sizes: no real tensors to
# time, so a configuration good at most large sizes.
UNTUNED_CONFIG = CONFIGS[0]
# Products of fewer multiply-adds take microseconds: not worth seconds of autotuning
# (nor, in the tests, a compilation of every configuration for every small shape).
AUTOTUNED_WORK = 2**30
SMALL_CONFIG = CONFIGS[-1]
# The interpreter runs programs one after another in numpy: small tiles, no autotuning.
INTERPRETER_CONFIG = _config(32, 32, 32, 2, 4, 1)

autotuned_matmul_kernel = triton.autotune(configs=CONFIGS, key=["M", "N", "K"])(matmul_kernel)
_tuned = {}  # (M, N, K, dtype) -> the Config the autotuner chose


def dot_precision(dtype):
    """tl.dot's input_precision: for float32, tf32 exactly when torch's own matmul
    takes it (torch.backends.cuda.matmul.allow_tf32), else full precision; 16-bit
    inputs are multiplied exactly whatever it says."""
    if dtype != torch.float32:
        return None
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"


def _config_for(args, options, key):
    """The Config of this launch: the interpreter's, SMALL_CONFIG for a small product, or
    the autotuner's choice for ``key``, timed on the first call of these sizes (seconds)."""
    if not ON_GPU:
        return INTERPRETER_CONFIG
    if key[0] * key[1] * key[2] < AUTOTUNED_WORK:
        return SMALL_CONFIG
    if is_traced(args[0]):
        return _tuned.get(key, UNTUNED_CONFIG) if all(isinstance(size, int) for size in key[:3]) else UNTUNED_CONFIG
    if key not in _tuned:
        M, N = key[:2]
        # The one launch through kernel[grid]: the autotuner times every configuration
        # here (and leaves C computed); launch() takes it from here with its choice.
        grid = lambda meta: (cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"]),)  # noqa: E731
        autotuned_matmul_kernel[grid](*args, **options)
        _tuned[key] = autotuned_matmul_kernel.best_config
    return _tuned[key]


# The TMA kernel's space (benchmarks/tune_matmul.py, on an H200 with Triton 3.6: 128 x 256 x 64
# on 8 warps with 3 stages was fastest at every benchmark shape, forward and backward products).
TMA_CONFIGS = [
    _config(128, 256, 64, 8, 8, 3),
    _config(128, 128, 64, 8, 8, 4),
    _config(128, 128, 64, 8, 4, 4),
    _config(64, 256, 64, 8, 4, 4),
]
_tuned_tma = {}  # (M, N, K, dtype, A_T, B_T) -> the Config the autotuner chose
TMA_DTYPES = (torch.float16, torch.bfloat16)
HAS_DESCRIPTORS = hasattr(TensorDescriptor, "from_tensor")  # runtime's stand-in on an older Triton has none


def _block_shapes(blocks, a_t, b_t):
    """The block shapes of the descriptors of a, b, c and pre for the tiles ``blocks``
    ({"BLOCK_M": ..., "BLOCK_N": ..., "BLOCK_K": ...}): a transposed operand's memory holds
    its tile transposed."""
    block_m, block_n, block_k = (blocks[f"BLOCK_{axis}"] for axis in "MNK")
    return ([block_k, block_m] if a_t else [block_m, block_k], [block_n, block_k] if b_t else [block_k, block_n],
            [block_m, block_n], [block_m, block_n])


def _set_block_shapes(arguments):
    """The autotuner's pre_hook: each descriptor's block shape from the configuration timed."""
    shapes = _block_shapes(arguments, arguments["A_T"], arguments["B_T"])
    for name, shape in zip(("a_desc", "b_desc", "c_desc", "pre_desc"), shapes):
        arguments[name].block_shape = shape


autotuned_matmul_tma_kernel = triton.autotune(
    configs=[triton.Config(c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages, pre_hook=_set_block_shapes)
             for c in TMA_CONFIGS],
    key=["M", "N", "K", "A_T", "B_T"])(matmul_tma_kernel)


@functools.cache
def _device_has_tma(device_index):
    """Hopper (compute capability 9.0) and later have the TMA engine; this Triton its descriptors."""
    return HAS_DESCRIPTORS and torch.cuda.get_device_capability(device_index)[0] >= 9


def _tma_layout(tensor):
    """How the TMA engine can read a 2-D ``tensor``: False for rows in memory (row-major), True
    for a transposed view of row-major memory, None where it cannot (its first element off a
    16-byte boundary, no unit stride, or a row's stride not a multiple of 16 bytes)."""
    size = tensor.element_size()
    if tensor.data_ptr() % 16:
        return None
    if tensor.stride(1) == 1 and tensor.stride(0) * size % 16 == 0:
        return False
    if tensor.stride(0) == 1 and tensor.stride(1) * size % 16 == 0:
        return True
    return None


def _tma_layouts(a, b, c, pre=None):
    """(_tma_layout(a), _tma_layout(b)) where launch_matmul multiplies these with
    matmul_tma_kernel, else None (see takes_tma)."""
    M, K = a.shape
    N = b.shape[1]
    if not (ON_GPU and a.dtype in TMA_DTYPES and M * N * K >= AUTOTUNED_WORK and not is_traced(a)
            and _device_has_tma(a.get_device()) and all(_tma_layout(t) is False for t in (c, pre) if t is not None)):
        return None
    layouts = _tma_layout(a), _tma_layout(b)
    return None if None in layouts else layouts


def takes_tma(a, b, c, pre=None):
    """Whether launch_matmul multiplies these with matmul_tma_kernel: on a GPU with the TMA
    engine, 16-bit operands, a product large enough to autotune, memory the engine can read
    (_tma_layout) and row-major outputs. Not while torch.compile traces: inductor launches
    matmul_kernel there."""
    return _tma_layouts(a, b, c, pre) is not None


def _descriptor(tensor, transposed, block_shape):
    """A TensorDescriptor of ``tensor``'s memory, read row-major: the tensor itself, or its
    transpose where ``tensor`` is a transposed view."""
    rows = tensor.t() if transposed else tensor
    return TensorDescriptor(rows, list(rows.shape), list(rows.stride()), block_shape)


def launch_matmul_tma(a, b, c, bias=None, pre=None, activation="none", config=None, layouts=None):
    """launch_matmul's product by matmul_tma_kernel, for a, b, c (and pre) that takes_tma
    accepts (the interpreter runs it too, for the tests): c = act(a @ b + bias), pre = a @ b + bias.
    ``layouts``: (_tma_layout(a), _tma_layout(b)) where the caller has them."""
    M, K = a.shape
    N = b.shape[1]
    a_t, b_t = layouts or (_tma_layout(a), _tma_layout(b))
    if a_t is None or b_t is None:
        raise ValueError("launch_matmul_tma: the TMA engine cannot read a or b (see takes_tma); "
                         f"got strides {a.stride()} and {b.stride()}")
    key = (M, N, K, a.dtype, a_t, b_t)
    programs = multiprocessor_count()
    options = dict(A_T=a_t, B_T=b_t, NUM_PROGRAMS=programs, HAS_BIAS=bias is not None, ACTIVATION=activation,
                   KEEP_PRE=pre is not None, UPCAST_DOT=upcasts_dot(a.dtype))
    config = config or (INTERPRETER_CONFIG if not ON_GPU else _tuned_tma.get(key))
    # Block shapes are set for the configuration launched (the autotuner's pre_hook sets its own).
    a_block, b_block, c_block, pre_block = _block_shapes(
        config.kwargs if config else {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}, a_t, b_t)
    descriptors = (_descriptor(a, a_t, a_block), _descriptor(b, b_t, b_block), _descriptor(c, False, c_block),
                   _descriptor(c if pre is None else pre, False, pre_block))
    args = (*descriptors, c if bias is None else bias, M, N, K, 0 if bias is None else bias.stride(0))
    with on_device_of(a):
        if config is None:  # a new product: every configuration timed, C left computed
            grid = lambda meta: (min(programs, cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"])),)  # noqa: E731
            autotuned_matmul_tma_kernel[grid](*args, **options)
            _tuned_tma[key] = autotuned_matmul_tma_kernel.best_config
            return
        grid = (min(programs, cdiv(M, c_block[0]) * cdiv(N, c_block[1])),)
        launch(matmul_tma_kernel, grid, *args, **options, **config.kwargs, num_warps=config.num_warps,
               num_stages=config.num_stages)


def _without_products(c, bias, pre, activation):
    """C when K = 0: A @ B is zeros, so C = act(bias) on every row (or zeros)."""
    values = torch.zeros(c.shape, device=c.device, dtype=torch.float32)
    if bias is not None:
        values += bias.float()
    if pre is not None:
        pre.copy_(values)
    if activation == "relu":
        values = torch.relu(values)
    elif activation == "gelu":
        values = torch.nn.functional.gelu(values, approximate="tanh")
    c.copy_(values)


def launch_matmul(a, b, c, bias=None, pre=None, activation="none", config=None, tma=True):
    """c = act(a @ b + bias) for 2-D a (M, K), b (K, N), any strides, into c (M, N); also
    ``pre`` = a @ b + bias where given (laid out as c). ``config``, a triton.Config,
    overrides the autotuner's and takes matmul_kernel; without it, products that takes_tma
    accepts go to matmul_tma_kernel, unless ``tma`` is False (chapter 6 times matmul_kernel)."""
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0:
        return
    if K == 0:
        _without_products(c, bias, pre, activation)
        return
    layouts = _tma_layouts(a, b, c, pre) if tma and config is None else None
    if layouts:
        launch_matmul_tma(a, b, c, bias, pre, activation, layouts=layouts)
        return
    args = (a, b, c if bias is None else bias, c, c if pre is None else pre,
            M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), 0 if bias is None else bias.stride(0),
            c.stride(0), c.stride(1))
    options = dict(
        HAS_BIAS=bias is not None, ACTIVATION=activation, KEEP_PRE=pre is not None,
        DOT_PRECISION=dot_precision(a.dtype),
        UPCAST_DOT=upcasts_dot(a.dtype),
    )
    with on_device_of(a):
        config = config or _config_for(args, options, (M, N, K, a.dtype))
        grid = (cdiv(M, config.kwargs["BLOCK_M"]) * cdiv(N, config.kwargs["BLOCK_N"]),)
        launch(matmul_kernel, grid, *args, **options, **config.kwargs,
               num_warps=config.num_warps, num_stages=config.num_stages)


def _output_like(a, n):
    """An empty (..., N) output for a of shape (..., K): contiguous, a tensor of its own."""
    return torch.empty((*a.shape[:-1], n), device=a.device, dtype=a.dtype)


def matmul_forward(a, b, bias=None, activation="none", keep_pre=False, config=None, tma=True):
    """Launch the forward on a (..., K) and b (K, N); return (out, pre): out (..., N),
    and the pre-activation a @ b + bias when ``keep_pre``, else an empty tensor. ``config``
    and ``tma`` as launch_matmul's."""
    out = _output_like(a, b.shape[1])
    pre = _output_like(a, b.shape[1]) if keep_pre else a.new_empty(0)
    launch_matmul(as_rows(a), b, as_rows(out), bias, as_rows(pre) if keep_pre else None, activation, config, tma)
    return out, pre


BACKWARD_BLOCK = (32, 64)  # rows, columns of activation_backward_kernel's tile
BACKWARD_PROGRAMS_PER_SM = 4


def activation_backward(grad_out, saved, activation, with_bias):
    """(grad_pre, grad_bias) of 2-D grad_out: grad_pre = grad_out * act'(pre) (grad_out
    itself without an activation), grad_bias its column sum (or an empty tensor)."""
    M, N = grad_out.shape
    grad_bias = grad_out.new_empty(N if with_bias else 0)
    if activation == "none" and not with_bias:
        return grad_out, grad_bias
    grad_pre = grad_out if activation == "none" else torch.empty((M, N), device=grad_out.device, dtype=grad_out.dtype)
    if M == 0 or N == 0:
        return grad_pre, grad_bias.zero_()
    block_m, block_n = BACKWARD_BLOCK
    col_blocks = cdiv(N, block_n)
    # Enough row groups for a few programs an SM, each a whole number of row tiles.
    wanted_groups = max(1, BACKWARD_PROGRAMS_PER_SM * multiprocessor_count() // col_blocks)
    rows_per_program = block_m * cdiv(cdiv(M, wanted_groups), block_m)
    row_groups = cdiv(M, rows_per_program)
    partial = torch.empty((row_groups, N) if with_bias else (0,), device=grad_out.device, dtype=torch.float32)
    with on_device_of(grad_out):
        launch(activation_backward_kernel, (col_blocks, row_groups),
            grad_out, saved if activation != "none" else grad_out, grad_pre, partial,
            M, N, rows_per_program,
            grad_out.stride(0), grad_out.stride(1), saved.stride(0) if activation != "none" else 0,
            grad_pre.stride(0), partial.stride(0) if with_bias else 0,
            ACTIVATION=activation, WITH_BIAS=with_bias, BLOCK_M=block_m, BLOCK_N=block_n,
        )
        if with_bias:
            grad_bias = sum_partial_rows(partial, grad_out.dtype)
    return grad_pre, grad_bias


def matmul_backward(a, b, saved, grad_out, activation, with_bias):
    """Launch the backward; return (grad_a, grad_b, grad_bias): with grad_pre = grad_out *
    act'(pre), grad_a = grad_pre @ bᵀ and grad_b = aᵀ @ grad_pre, both by the forward's
    kernel on transposed views, and grad_bias = grad_pre summed over the rows (an empty
    tensor without a bias)."""
    a2d = as_rows(a)
    grad_pre, grad_bias = activation_backward(as_rows(grad_out), as_rows(saved) if saved.numel() else saved,
                                              activation, with_bias)
    grad_a = torch.empty(a.shape, device=a.device, dtype=a.dtype)
    grad_b = torch.empty(b.shape, device=b.device, dtype=b.dtype)
    launch_matmul(grad_pre, b.t(), as_rows(grad_a))
    launch_matmul(a2d.t(), grad_pre, grad_b)
    return grad_a, grad_b, grad_bias


# -------------------------------------------------------------------- custom operator
# One unit for torch.compile and for eager autograd (core.operator; weighted_sum_op.py
# says how the paths differ). The forward's second output is what gelu's backward reads,
# the pre-activation (an empty tensor for the other activations): relu's backward reads
# the output itself, and without an activation nothing is needed.
#
# The gradient rule: with grad_pre = grad_out * act'(a @ b + bias),
#     grad_a = grad_pre @ bᵀ,   grad_b = aᵀ @ grad_pre,   grad_bias = grad_pre.sum(rows).


def _inference(a, b, bias, activation):
    return matmul_forward(a, b, bias, activation)[0]


def _backward(a: torch.Tensor, b: torch.Tensor, saved: torch.Tensor, grad_out: torch.Tensor, activation: str,
              with_bias: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return matmul_backward(a, b, saved, grad_out, activation, with_bias)


def _save(ctx, inputs, output):
    a, b, bias, activation = inputs
    out, pre = output
    ctx.activation, ctx.with_bias = activation, bias is not None
    ctx.save_for_backward(a, b, out if activation == "relu" else pre)


def _gradients(ctx, backward, grad_out):
    grad_a, grad_b, grad_bias = backward(*ctx.saved_tensors, grad_out, ctx.activation, ctx.with_bias)
    return grad_a, grad_b, grad_bias if ctx.with_bias else None, None


def _check_backward(a, b, saved, grad_out, activation, with_bias):
    op = "matmul_backward"
    _check_inputs(op, a, b, None, activation)
    out_shape = (*a.shape[:-1], b.shape[1])
    check_like(op, "grad_out", grad_out, out_shape, a)
    check_like(op, "saved", saved, out_shape if activation != "none" else (0,), a, contiguous=True)


@differentiable_op(
    "matmul", backward=_backward, save=_save, gradients=_gradients,
    check=lambda a, b, bias, activation: _check_inputs("matmul", a, b, bias, activation),
    check_backward=_check_backward, differentiable={"a": 0, "b": 1, "bias": 2}, inference=_inference,
)
def MATMUL(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None,
           activation: str) -> tuple[torch.Tensor, torch.Tensor]:
    return matmul_forward(a, b, bias, activation, keep_pre=activation == "gelu")


# ------------------------------------------------------------------------------ public


def _check_inputs(op, a, b, bias, activation, dtypes=FLOAT_DTYPES):
    """``dtypes``: the kernels' (the operators' check), or the public function's, float64 too."""
    check_tensor(op, "a", a, dtypes=dtypes, min_ndim=2)
    check_tensor(op, "b", b, dtypes=dtypes, min_ndim=2)
    if b.ndim != 2:
        raise ValueError(f"{op}: b must have 2 dimensions (K, N), got shape {tuple(b.shape)}")
    tensors = {"a": a, "b": b}
    if bias is not None:
        check_tensor(op, "bias", bias, dtypes=dtypes)
        tensors["bias"] = bias
    check_same_device_and_dtype(op, **tensors)
    if a.shape[-1] != b.shape[0]:
        raise ValueError(f"{op}: the inner sizes differ: a of shape {tuple(a.shape)} has K = {a.shape[-1]} "
                         f"columns, b of shape {tuple(b.shape)} has K = {b.shape[0]} rows; they must be equal")
    if bias is not None and tuple(bias.shape) != (b.shape[1],):
        raise ValueError(f"{op}: bias must have shape (N,) with N = b.shape[1] = {b.shape[1]}; "
                         f"got bias of shape {tuple(bias.shape)}")
    if activation not in ACTIVATIONS:
        accepted = ", ".join(repr(name) for name in (None, *ACTIVATIONS[1:]))
        raise ValueError(f"{op}: unknown activation {activation!r}; accepted: {accepted}")
    check_index_range(op, M=math.prod(a.shape[:-1]), N=b.shape[1], K=b.shape[0])


def matmul(a, b, *, bias=None, activation=None):
    """``act(a @ b + bias)`` with one Triton kernel, differentiable in a, b and bias.

    The activation is applied to the tile before it is stored. Accumulates in float32,
    float32 inputs in full precision unless ``torch.backends.cuda.matmul.allow_tf32`` is
    set, as for torch's own matmul; float64 inputs (on any device) are computed by the
    PyTorch reference instead, differentiable to any order. One dtype for all (float16,
    bfloat16, float32 or float64; a mix is refused: cast one), one device, any strides
    (transposed views included).

    Args:
        a (Tensor): leading dimensions flattened into rows as ``F.linear`` does.
        b (Tensor): the right factor.
        bias (Tensor, optional): keyword only, added to every row.
        activation (str, optional): keyword only, None, "relu" or "gelu" (torch's
            ``gelu(approximate="tanh")``).

    Shape:
        - a: (..., K)
        - b: (K, N)
        - bias: (N,)
        - Output: (..., N)

    Returns:
        Tensor: the product, in the inputs' dtype.

    Example::

        >>> a, b, bias = torch.randn(8, 32), torch.randn(32, 16), torch.randn(16)
        >>> matmul(a, b, bias=bias, activation="relu").shape
        torch.Size([8, 16])
    """
    a, b, bias = autocast_as_matmul(a, b, bias)
    _check_inputs("matmul", a, b, bias, "none" if activation is None else activation, PUBLIC_DTYPES)
    if runs_reference(a, b, bias):
        return by_reference(references.matmul, a, b, bias, activation)
    return MATMUL(a, b, bias, "none" if activation is None else activation)
