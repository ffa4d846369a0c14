"""What every public function refuses, and how: other layouts, other devices,
forward-mode tangents (computed by the references) and second-order gradients (course_lib/core/validation.py)."""

import sys

import pytest
import torch
from torch.autograd import forward_ad

from course_lib import (LayerNorm, causal_softmax, coor_descent, layernorm, local_causal_attention, softmax,
                        weighted_sum)
from course_lib import matmul as course_matmul
from course_lib.core.runtime import DEVICE, ON_GPU


def _coor_descent(s, mask=None):
    return coor_descent(s, n_iters=4, k=2, mask=mask)


def _module(x):
    return LayerNorm(7, device=DEVICE)(x)


# (name, function, its tensor arguments by name): every public callable, small inputs.
CASES = [
    ("weighted_sum", weighted_sum, lambda: {"x": torch.randn(5, 7), "weight": torch.randn(7)}),
    ("softmax", softmax, lambda: {"x": torch.randn(5, 7)}),
    ("causal_softmax", causal_softmax, lambda: {"x": torch.randn(2, 6, 6)}),
    ("layernorm", layernorm, lambda: {"x": torch.randn(5, 7), "gamma": torch.randn(7), "beta": torch.randn(7)}),
    ("LayerNorm", _module, lambda: {"x": torch.randn(5, 7)}),
    ("coor_descent", _coor_descent, lambda: {"s": torch.randn(5, 7), "mask": torch.rand(5, 7) > 0.2}),
]
IDS = [name for name, _, _ in CASES]


def inputs_of(make):
    return {name: t.to(DEVICE) for name, t in make().items()}


def differentiable(inputs):
    return [t for t in inputs.values() if t.is_floating_point()]


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr"])
@pytest.mark.parametrize("op, fn, make", CASES, ids=IDS)
def test_rejects_sparse_tensors_naming_the_argument(op, fn, make, layout):
    for name, tensor in inputs_of(make).items():
        if layout == "sparse_csr" and tensor.ndim != 2:
            continue
        inputs = inputs_of(make)
        inputs[name] = tensor.to_sparse_csr() if layout == "sparse_csr" else tensor.to_sparse()
        with pytest.raises(TypeError, match=rf"{op}: {name} has layout torch.{layout}; only dense tensors"):
            fn(**inputs)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
@pytest.mark.parametrize("layout", [torch.strided, torch.jagged], ids=["strided", "jagged"])
@pytest.mark.parametrize("op, fn, make", CASES, ids=IDS)
def test_rejects_nested_tensors_naming_the_argument(op, fn, make, layout):
    name, tensor = next(iter(inputs_of(make).items()))
    inputs = inputs_of(make)
    inputs[name] = torch.nested.nested_tensor([tensor, tensor[:1]], layout=layout)
    with pytest.raises(TypeError, match=rf"{op}: {name} (is a nested tensor|has layout torch.jagged); only dense"):
        fn(**inputs)


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
@pytest.mark.parametrize("op, fn, make", CASES, ids=IDS)
def test_rejects_quantized_tensors_naming_the_argument(op, fn, make):
    inputs = inputs_of(make)
    name = next(iter(inputs))
    inputs[name] = torch.quantize_per_tensor(inputs[name].cpu(), 0.1, 0, torch.qint8)
    with pytest.raises(TypeError, match=rf"{op}: {name} is quantized \(torch.qint8\)"):
        fn(**inputs)


@pytest.mark.parametrize("requires_grad", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("op, fn, make", CASES, ids=IDS)
def test_forward_mode_tangents_are_computed_by_the_references(op, fn, make, requires_grad):
    """A tangent on any argument sends the call to the PyTorch reference, whose forward-mode
    derivative is torch.func.jvp's (a kernel would drop the tangent: a wrong derivative)."""
    for name in [n for n, t in inputs_of(make).items() if t.is_floating_point()]:
        inputs = inputs_of(make)
        for t in differentiable(inputs):
            t.requires_grad_(requires_grad)
        tangent = torch.randn_like(inputs[name])
        with forward_ad.dual_level():
            dual = dict(inputs, **{name: forward_ad.make_dual(inputs[name], tangent)})
            got = forward_ad.unpack_dual(fn(**dual))
        detached = {n: t.detach().double() if t.is_floating_point() else t for n, t in inputs.items()}
        expected = torch.func.jvp(lambda value: fn(**dict(detached, **{name: value})),
                                  (detached[name],), (tangent.double(),))
        assert got.tangent is not None, f"{op}: the tangent of {name} was dropped"
        torch.testing.assert_close(got.primal.double(), expected[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.tangent.double(), expected[1], atol=1e-4, rtol=1e-4)


def test_the_stable_layernorm_module_names_itself_in_the_second_order_error():
    norm = LayerNorm(7, device=DEVICE, stable=True)
    x = torch.randn(5, 7, device=DEVICE, requires_grad=True)
    y = norm(x)
    (first,) = torch.autograd.grad(y, x, torch.randn_like(y), create_graph=True)
    with pytest.raises(RuntimeError, match="^LayerNorm: second-order gradients are not supported"):
        (first ** 2).sum().backward()


def test_the_stable_layernorm_computes_forward_mode_tangents_too():
    x, tangent = torch.randn(5, 7, device=DEVICE), torch.randn(5, 7, device=DEVICE)
    with forward_ad.dual_level():
        got = forward_ad.unpack_dual(layernorm(forward_ad.make_dual(x, tangent), None, stable=True)).tangent
    expected = torch.func.jvp(lambda value: layernorm(value, None, stable=True), (x.double(),), (tangent.double(),))[1]
    torch.testing.assert_close(got.double(), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("op, fn, make", CASES, ids=IDS)
def test_plain_tensors_inside_a_dual_level_still_work(op, fn, make):
    inputs = inputs_of(make)
    expected = fn(**inputs)
    with forward_ad.dual_level():
        assert torch.equal(fn(**inputs), expected)


@pytest.mark.parametrize("constant_grad_output", [True, False], ids=["constant-dy", "dy-with-grad"])
@pytest.mark.parametrize("op, fn, make", CASES, ids=IDS)
def test_second_order_gradients_raise_instead_of_being_detached(op, fn, make, constant_grad_output):
    inputs = inputs_of(make)
    leaves = [t.requires_grad_() for t in differentiable(inputs)]
    y = fn(**inputs)
    grad_y = torch.randn_like(y, requires_grad=not constant_grad_output)
    first = torch.autograd.grad(y, leaves, grad_y, create_graph=True)
    plain = torch.autograd.grad(fn(**inputs), leaves, grad_y.detach())
    for got, expected in zip(first, plain):  # create_graph changes nothing in the values
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    # A gradient penalty: its second-order terms cannot be computed, so this must raise
    # rather than quietly leave them out (torch's once_differentiable would, for a
    # constant dy).
    penalty = sum((g.float() ** 2).sum() for g in first)
    with pytest.raises(RuntimeError, match=f"{op}: second-order gradients are not supported"):
        (y.float().sum() + penalty).backward()


def _local_attention(q, k, v):
    return local_causal_attention(q, k, v, 3)


@pytest.mark.parametrize("op, fn, make", CASES + [
    ("local_causal_attention", _local_attention, lambda: {name: torch.randn(1, 2, 7, 8) for name in "qkv"}),
], ids=IDS + ["local_causal_attention"])
def test_a_gradient_of_a_gradient_toward_each_input_raises_naming_the_function(op, fn, make):
    """autograd.grad of a first gradient toward one chosen input: an error naming the
    function, never None (allow_unused) or an error that names nothing."""
    inputs = inputs_of(make)
    leaves = [t.requires_grad_() for t in differentiable(inputs)]
    y = fn(**inputs)
    first = torch.autograd.grad(y, leaves[0], torch.randn_like(y), create_graph=True)[0]
    for leaf in leaves:
        with pytest.raises(RuntimeError, match=f"{op}: second-order gradients are not supported"):
            torch.autograd.grad((first.float() ** 2).sum(), leaf, allow_unused=True)


def _stable_layernorm(x, gamma, beta):
    return layernorm(x, gamma, beta, stable=True)


@pytest.mark.parametrize("op, fn, make", CASES + [
    ("layernorm", _stable_layernorm, CASES[IDS.index("layernorm")][2]),
    ("local_causal_attention", _local_attention, lambda: {name: torch.randn(1, 2, 7, 8) for name in "qkv"}),
], ids=IDS + ["layernorm-stable", "local_causal_attention"])
def test_a_gradient_of_a_gradient_toward_what_an_input_was_computed_from_raises(op, fn, make):
    """Each input computed from a leaf of its own (an adaptive LayerNorm's β from a
    condition): the error must reach those leaves too, never a None or a result that
    leaves out the second-order terms."""
    inputs = inputs_of(make)
    sources = {name: t.requires_grad_() for name, t in inputs.items() if t.is_floating_point()}
    computed = {name: (sources[name] * 2.0 if name in sources else t) for name, t in inputs.items()}
    y = fn(**computed)
    first = torch.autograd.grad(y, computed[next(iter(sources))], torch.randn_like(y), create_graph=True)[0]
    for name, source in sources.items():
        with pytest.raises(RuntimeError, match=f"{op}: second-order gradients are not supported"):
            torch.autograd.grad((first.float() ** 2).sum(), source, allow_unused=True)


@pytest.mark.parametrize("op, fn, make", CASES, ids=IDS)
def test_torch_func_transforms_compute_with_the_references(op, fn, make):
    """The kernels cannot read a transform's tensors: vmap runs the PyTorch references,
    which give what the function gives on each item."""
    inputs = inputs_of(make)
    names = list(inputs)
    batched = [torch.stack([t, t.flip(0)]) for t in inputs.values()]
    got = torch.func.vmap(lambda *args: fn(**dict(zip(names, args))))(*batched)
    for item in range(2):
        expected = fn(**{name: t[item] for name, t in zip(names, batched)})
        torch.testing.assert_close(got[item], expected, atol=1e-5, rtol=1e-5)


# ------------------------------------------------- the checks every argument goes through


def each_argument(make):
    """(name, inputs) for every tensor argument of a case, fresh inputs each time."""
    for name in inputs_of(make):
        yield name, inputs_of(make)


@pytest.mark.parametrize("op, fn, make", CASES, ids=IDS)
def test_rejects_non_tensors_naming_the_argument(op, fn, make):
    for name, inputs in each_argument(make):
        inputs[name] = inputs[name].tolist()
        with pytest.raises(TypeError, match=rf"{op}: {name} must be a torch.Tensor, got list"):
            fn(**inputs)


# float64 is computed by the references (tests/test_gradcheck.py), and refused mixed with another dtype.
@pytest.mark.parametrize("dtype", [torch.int32, torch.bool])
@pytest.mark.parametrize("op, fn, make", CASES, ids=IDS)
def test_rejects_unsupported_dtypes_naming_the_argument(op, fn, make, dtype):
    for name, inputs in each_argument(make):
        accepted = "bool" if inputs[name].dtype == torch.bool else "float32, float16, bfloat16"
        if inputs[name].dtype == dtype or (accepted == "bool" and dtype != torch.int32):
            continue
        inputs[name] = inputs[name].to(dtype)
        with pytest.raises(TypeError, match=rf"{op}: {name} has dtype {dtype}; accepted: {accepted}"):
            fn(**inputs)


@pytest.mark.parametrize("op, fn, make", CASES, ids=IDS)
def test_rejects_tensors_on_another_device_naming_the_argument(op, fn, make):
    for name, inputs in each_argument(make):
        inputs[name] = inputs[name].to("meta")
        with pytest.raises(ValueError, match=rf"{op}: {name} is on meta, but kernels here run on .*move it with"):
            fn(**inputs)


def lazily_negated(tensor):
    """``-tensor`` as a view whose is_neg() bit is set: memory holding ``tensor``."""
    as_complex = torch.complex(torch.zeros_like(tensor.float()), tensor.float()).conj()
    return as_complex.imag.to(tensor.dtype) if tensor.dtype != torch.float32 else as_complex.imag


@pytest.mark.parametrize("op, fn, make", CASES, ids=IDS)
def test_rejects_lazily_negated_and_zero_tensors_naming_the_argument(op, fn, make):
    for name, inputs in each_argument(make):
        if not inputs[name].is_floating_point() or inputs[name].dtype != torch.float32:
            continue
        inputs[name] = lazily_negated(inputs[name])
        assert inputs[name].is_neg()
        with pytest.raises(ValueError, match=rf"{op}: {name} is a lazily negated view .*{name}.resolve_neg\(\)"):
            fn(**inputs)
    for name, inputs in each_argument(make):
        inputs[name] = torch._efficientzerotensor(inputs[name].shape, dtype=inputs[name].dtype, device=DEVICE)
        with pytest.raises(ValueError, match=rf"{op}: {name} is a zero tensor without memory"):
            fn(**inputs)


@pytest.mark.parametrize("op, fn, make", CASES, ids=IDS)
def test_rejects_wrapper_subclasses_naming_the_argument(op, fn, make):
    from torch.testing._internal.two_tensor import TwoTensor
    for name, inputs in each_argument(make):
        inputs[name] = TwoTensor(inputs[name], inputs[name].clone())
        with pytest.raises(TypeError, match=rf"{op}: {name} is a TwoTensor, a tensor subclass that wraps others"):
            fn(**inputs)


@pytest.mark.parametrize("op, fn, make", CASES, ids=IDS)
def test_a_lazily_negated_incoming_gradient_is_read_as_its_values(op, fn, make):
    inputs = inputs_of(make)
    leaves = [t.requires_grad_() for t in differentiable(inputs)]
    y = fn(**inputs)
    grad_y = torch.randn_like(y)
    expected = torch.autograd.grad(fn(**inputs), leaves, grad_y)
    negated = lazily_negated(-grad_y)
    assert negated.is_neg() and torch.equal(negated, grad_y)
    for got, want in zip(torch.autograd.grad(y, leaves, negated), expected):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("op, fn, make", CASES, ids=IDS)
def test_an_incoming_zero_tensor_gradient_gives_zeros_and_a_wrapper_subclass_is_refused(op, fn, make):
    from torch.testing._internal.two_tensor import TwoTensor
    inputs = inputs_of(make)
    leaves = [t.requires_grad_() for t in differentiable(inputs)]
    y = fn(**inputs)
    for got in torch.autograd.grad(y, leaves, torch._efficientzerotensor(y.shape, dtype=y.dtype, device=DEVICE)):
        assert torch.equal(got, torch.zeros_like(got))
    with pytest.raises(TypeError, match=f"{op}: the gradient flowing into its backward is a TwoTensor"):
        torch.autograd.grad(fn(**inputs), leaves, TwoTensor(torch.ones_like(y), torch.ones_like(y)))


@pytest.mark.parametrize("op, fn, make", CASES, ids=IDS)
def test_rejects_too_few_dimensions(op, fn, make):
    inputs = inputs_of(make)
    name, first = next(iter(inputs.items()))
    least = 2 if op == "causal_softmax" else 1
    inputs[name] = first.reshape(-1)[0] if least == 1 else first[0, 0]
    if "mask" in inputs:
        inputs["mask"] = inputs["mask"].reshape(-1)[0]
    with pytest.raises(ValueError, match=rf"{op}: {name} must have at least {least} dimension"):
        fn(**inputs)


# Before torch 2.13, AOTAutograd hands back the first-order gradients of a compiled
# graph detached when its backward reads no graph input that requires grad, and a
# gradient penalty then loses its second-order terms without a word. The softmax's
# backward reads only its output y and dy, and coordinate descent's a view of s; their
# operators are "anchored" (core.operator): the backward's kernels also take the input
# itself, unread, so AOTAutograd sees one and refuses the penalty.


@pytest.mark.parametrize("op, fn, make", CASES, ids=IDS)
def test_second_order_gradients_raise_under_torch_compile_too(op, fn, make):
    # Compiled, the public functions are custom operators whose backward is another
    # operator: AOTAutograd refuses the gradient penalty with its own error, which is
    # fine; what must never happen is a penalty without its second-order terms.
    torch._dynamo.reset()
    inputs = inputs_of(make)
    leaves = [t.requires_grad_() for t in differentiable(inputs)]
    target = LayerNorm(7, device=DEVICE) if op == "LayerNorm" else fn  # built outside the compiled region
    compiled = torch.compile(lambda **kwargs: target(**kwargs), fullgraph=True, backend="aot_eager")
    y = compiled(**inputs)
    first = torch.autograd.grad(y, leaves, torch.randn_like(y), create_graph=True)
    penalty = sum((g.float() ** 2).sum() for g in first)
    with pytest.raises(RuntimeError, match="does not currently support double backward|second-order gradients"):
        (y.float().sum() + penalty).backward()


HOLES = {  # a region input the backward reads only through what the region computes from it
    "softmax(x * 2)": (lambda x, k: softmax(x * 2), "x"),
    "stable layernorm": (lambda x, k: layernorm(x, None, stable=True), "x"),
    "coor_descent's k": (lambda x, k: coor_descent(x, n_iters=5, k=k), "k"),
}


@pytest.mark.parametrize("case", HOLES)
def test_a_compiled_penalty_toward_an_input_read_only_through_the_region_loses_its_terms(case):
    # AOTAutograd's behaviour (torch 2.11 to 2.13 at least), as for torch.softmax(x * 2);
    # the README names it. With a constant incoming gradient, the first-order gradient
    # has no path back to that input: neither an error nor the second-order terms. If a
    # torch fixes it, this fails, and the README's paragraph goes.
    torch._dynamo.reset()
    fn, target = HOLES[case]
    inputs = {"x": torch.randn(3, 7, device=DEVICE, requires_grad=True),
              "k": (torch.rand(3, device=DEVICE) + 1).requires_grad_()}
    y = torch.compile(fn, fullgraph=True, backend="aot_eager")(*inputs.values())
    first = torch.autograd.grad((y * torch.randn_like(y)).sum(), list(inputs.values()), create_graph=True,
                                allow_unused=True)
    penalty = sum((g ** 2).sum() for g in first if g is not None)
    # Before torch 2.13 the first-order gradients come back detached; from 2.13 attached
    # to a dummy input, not to the inputs: either way no path leads to the target.
    got = torch.autograd.grad(penalty, inputs[target], allow_unused=True)[0] if penalty.requires_grad else None
    assert got is None


@pytest.mark.parametrize("op", ["softmax", "coor_descent"])
def test_an_anchored_backward_operator_checks_its_anchor(op):
    y, dy = torch.rand(3, 5, device=DEVICE), torch.randn(3, 5, device=DEVICE)
    if op == "softmax":
        call = lambda anchor: torch.ops.course_lib.softmax_backward(y, dy, False, 0, anchor=anchor)
    else:
        a, row_max = torch.zeros(3, 2, device=DEVICE, dtype=torch.float64), torch.ones(3, device=DEVICE)
        call = lambda anchor: torch.ops.course_lib.coor_descent_backward(
            y, None, None, 0.0, 2, 0.1, None, 1.0, a, row_max, dy, anchor=anchor)
    expected = call(None)
    for got, want in zip(torch.utils._pytree.tree_leaves(call(torch.randn(7, device=DEVICE))),
                         torch.utils._pytree.tree_leaves(expected)):
        assert torch.equal(got, want)  # never read: an anchor of any shape changes nothing
    with pytest.raises(ValueError, match=rf"{op}_backward: .*anchor is on meta"):
        call(torch.randn(3, device="meta"))
    with pytest.raises(TypeError, match=rf"{op}_backward: anchor has dtype torch.int32"):
        call(torch.zeros(3, device=DEVICE, dtype=torch.int32))


# Outputs are ordinary tensors, in any number of leading dimensions: ``y += residual``
# after the call, as torch's own functions allow. A function whose backward reads its
# output (softmax) refuses the backward afterwards with torch's own error, as torch.softmax does.
SAVES_ITS_OUTPUT = {"softmax", "causal_softmax"}
LEADING_DIMS = {  # every public function, its first argument with two leading dimensions
    "weighted_sum": lambda: {"x": torch.randn(2, 3, 7), "weight": torch.randn(7)},
    "softmax": lambda: {"x": torch.randn(2, 3, 7)},
    "causal_softmax": lambda: {"x": torch.randn(2, 6, 6)},
    "layernorm": lambda: {"x": torch.randn(2, 3, 7), "gamma": torch.randn(7), "beta": torch.randn(7)},
    "LayerNorm": lambda: {"x": torch.randn(2, 3, 7)},
    "coor_descent": lambda: {"s": torch.randn(2, 3, 7), "mask": torch.rand(2, 3, 7) > 0.2},
}


@pytest.mark.parametrize("op, fn, make", CASES + [
    ("local_causal_attention", _local_attention, lambda: {name: torch.randn(1, 2, 7, 8) for name in "qkv"}),
], ids=IDS + ["local_causal_attention"])
def test_a_compiled_output_changed_in_place_gives_the_right_gradients_or_an_error(op, fn, make):
    # Compiled, the backward must never read a changed output as the forward's: it gives
    # eager's gradients, or autograd refuses as it does for torch's own compiled functions.
    torch._dynamo.reset()
    torch.manual_seed(0)
    inputs = inputs_of(make)
    leaves = [t.requires_grad_() for t in differentiable(inputs)]
    target = LayerNorm(7, device=DEVICE) if op == "LayerNorm" else fn
    y = target(**inputs)
    y += 1.0
    grad_y = torch.randn_like(y)
    expected = torch.autograd.grad(y.square(), leaves, grad_y) if op not in SAVES_ITS_OUTPUT else None
    y = torch.compile(lambda **kwargs: target(**kwargs), fullgraph=True, backend="aot_eager")(**inputs)
    y += 1.0
    try:
        got = torch.autograd.grad(y.square(), leaves, grad_y)
    except RuntimeError as error:
        assert "modified by an inplace operation" in str(error)
        return
    assert expected is not None, f"{op}: its backward reads its output, changed in place, and did not refuse"
    for g, want in zip(got, expected):
        torch.testing.assert_close(g, want)


@pytest.mark.parametrize("op, fn, make", [(op, fn, LEADING_DIMS[op]) for op, fn, _ in CASES], ids=IDS)
def test_outputs_may_be_changed_in_place(op, fn, make):
    torch.manual_seed(0)
    inputs = inputs_of(make)
    leaves = [t.requires_grad_() for t in differentiable(inputs)]
    y = fn(**inputs)
    grad_y = torch.randn_like(y)
    expected = torch.autograd.grad(fn(**inputs), leaves, grad_y)
    y += 1.0  # not "a view created inside a custom Function", whatever the leading dimensions
    if op in SAVES_ITS_OUTPUT:
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            torch.autograd.grad(y, leaves, grad_y)
        return
    for got, want in zip(torch.autograd.grad(y, leaves, grad_y), expected):
        torch.testing.assert_close(got, want)


# ------------------------------------------------------------------------------ autocast

def _local_attention_by_torch(q, k, v):
    from course_lib.core import references
    return references.local_causal_attention(q, k, v, 4)


# (course_lib's call, torch's own expression): under autocast both give one dtype and one value.
AUTOCAST_CASES = {
    "softmax": (lambda x, w, m: softmax(x), lambda x, w, m: torch.softmax(x, -1)),
    "causal_softmax": (lambda x, w, m: causal_softmax(x[:7, :7]),
                       lambda x, w, m: torch.softmax(x[:7, :7].masked_fill(torch.ones(7, 7, dtype=torch.bool,
                                                                          device=x.device).triu(1), -torch.inf), -1)),
    "layernorm": (lambda x, w, m: layernorm(x, w, w), lambda x, w, m: torch.nn.functional.layer_norm(x, (24,), w, w)),
    "LayerNorm": (lambda x, w, m: LayerNorm(24, device=x.device)(x),
                  lambda x, w, m: torch.nn.LayerNorm(24, device=x.device)(x)),
    "matmul": (lambda x, w, m: course_matmul(x, m), lambda x, w, m: x @ m),
    "local_causal_attention": (lambda x, w, m: local_causal_attention(*[x[None, None, :, :16]] * 3, 4),
                               lambda x, w, m: _local_attention_by_torch(*[x[None, None, :, :16]] * 3)),
}


@pytest.mark.parametrize("autocast_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("input_dtype", [torch.float32, torch.bfloat16], ids=["x-float32", "x-bf16"])
@pytest.mark.parametrize("name", AUTOCAST_CASES)
def test_under_autocast_each_function_gives_torchs_dtype(name, input_dtype, autocast_dtype):
    """CUDA autocast computes softmax and layer_norm in float32 and matrix products in its
    dtype; CPU autocast only the products: course_lib's functions follow torch's."""
    ours, theirs = AUTOCAST_CASES[name]
    x = torch.randn(9, 24, device=DEVICE).to(input_dtype)
    w, m = torch.randn(24, device=DEVICE), torch.randn(24, 8, device=DEVICE)
    with torch.autocast(DEVICE.type, dtype=autocast_dtype):
        got, expected = ours(x, w, m), theirs(x, w, m)
    assert got.dtype == expected.dtype, f"{name}: {got.dtype} under autocast, torch gives {expected.dtype}"
    tolerance = 2e-2 if expected.dtype != torch.float32 or input_dtype != torch.float32 else 1e-5
    torch.testing.assert_close(got.float(), expected.float(), atol=tolerance, rtol=tolerance)


def test_plain_inputs_says_so_only_of_tensors_the_kernels_take_as_they_are():
    """The public functions' fast path: plain_inputs skips the full checks only where they
    would let the tensors through unchanged; every tensor a check refuses or sends to the
    references, and every context that does, makes it say False."""
    from torch.testing._internal.two_tensor import TwoTensor
    from course_lib.core.validation import plain_inputs

    x = torch.randn(5, 7, device=DEVICE)
    vector = torch.nn.Parameter(torch.randn(7, device=DEVICE))
    assert plain_inputs(x, vector, None)
    assert plain_inputs(x.T, x.bfloat16(), x.half())  # any strides, every kernel dtype
    not_plain = {
        "float64 (the references)": x.double(),
        "an integer tensor": x.int(),
        "a bool tensor": x > 0,
        "on the meta device": x.to("meta"),
        "on the CPU beside a GPU tensor" if ON_GPU else "a CPU tensor, off the kernels' device": x.cpu(),
        "sparse": x.to_sparse(),
        "lazily negated": torch.complex(torch.zeros_like(x), x).conj().imag,
        "a zero tensor": torch._efficientzerotensor(x.shape, device=DEVICE),
        "a wrapper subclass": TwoTensor(x, x.clone()),
        "a NumPy array": x.cpu().numpy(),
    }
    if not ON_GPU:
        del not_plain["a CPU tensor, off the kernels' device"]  # the interpreter's device
    for what, other in not_plain.items():
        assert not plain_inputs(x, other), what
        assert not plain_inputs(other, x), what
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        assert not plain_inputs(x)
    with forward_ad.dual_level():
        assert not plain_inputs(x)
    assert torch.func.vmap(lambda row: torch.tensor(plain_inputs(row)))(x).logical_not().all()


@pytest.mark.parametrize("op, fn, make", CASES, ids=IDS)
def test_the_fast_path_computes_what_the_full_checks_do(op, fn, make, monkeypatch):
    """plain_inputs only shortens the checks: the call takes it, and with it saying False
    everywhere the values and gradients are the same to the bit."""
    from course_lib.core import validation

    inputs = inputs_of(make)
    inputs.pop("mask", None)  # coordinate descent's mask is checked in full
    leaves = [t.requires_grad_() for t in differentiable(inputs)]
    real = validation.plain_inputs
    users = [m for m in list(sys.modules.values()) if getattr(m, "plain_inputs", None) is real]
    answers = []

    def recorded(*tensors):
        answers.append(real(*tensors))
        return answers[-1]

    def outputs():
        y = fn(**inputs)
        return y, torch.autograd.grad(y, leaves, torch.ones_like(y))

    for module in users:
        monkeypatch.setattr(module, "plain_inputs", recorded)
    fast, fast_grads = outputs()
    assert answers and all(answers), answers
    for module in users:
        monkeypatch.setattr(module, "plain_inputs", lambda *tensors: False)
    full, full_grads = outputs()
    torch.testing.assert_close(fast, full, rtol=0, atol=0)
    for got, expected in zip(fast_grads, full_grads):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
