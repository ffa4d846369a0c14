"""float64 through every public function: computed by the PyTorch references
(core.references), on any device, so torch.autograd's gradcheck and gradgradcheck pass
through the package (core/validation.py's runs_reference)."""

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

import course_lib
from course_lib.core.runtime import DEVICE


def double(*shape, generator):
    return torch.randn(*shape, generator=generator, dtype=torch.float64).requires_grad_()


def case(make):
    """make(generator) -> (function, inputs); fresh inputs from one seed."""
    return lambda: make(torch.Generator().manual_seed(0))


MASK = torch.tensor([[True, True, False, True, True, True], [True, False, True, True, True, False]])
CASES = {
    "weighted_sum": case(lambda g: (course_lib.weighted_sum, (double(3, 5, generator=g), double(5, generator=g)))),
    "softmax": case(lambda g: (course_lib.softmax, (double(3, 5, generator=g),))),
    "softmax dim=0": case(lambda g: (lambda x: course_lib.softmax(x, dim=0), (double(3, 5, generator=g),))),
    "softmax causal": case(lambda g: (lambda x: course_lib.softmax(x, causal=True), (double(2, 4, 4, generator=g),))),
    "causal_softmax": case(lambda g: (course_lib.causal_softmax, (double(2, 4, 4, generator=g),))),
    "causal_softmax diagonal": case(lambda g: (lambda x: course_lib.causal_softmax(x, diagonal=2),
                                               (double(2, 3, 5, generator=g),))),
    "layernorm": case(lambda g: (course_lib.layernorm, (double(3, 5, generator=g), double(5, generator=g),
                                                        double(5, generator=g)))),
    "layernorm stable": case(lambda g: (lambda x, gamma: course_lib.layernorm(x, gamma, stable=True),
                                        (double(3, 5, generator=g), double(5, generator=g)))),
    "layer_norm": case(lambda g: (lambda x, w, b: course_lib.layer_norm(x, (5,), w, b),
                                  (double(3, 5, generator=g), double(5, generator=g), double(5, generator=g)))),
    "LayerNorm": case(lambda g: (course_lib.LayerNorm(5, dtype=torch.float64), (double(3, 5, generator=g),))),
    "coor_descent": case(lambda g: (lambda s, k: course_lib.coor_descent(s, n_iters=4, k=k, eps=0.5, mask=MASK),
                                    (double(2, 6, generator=g), torch.tensor([2.0, 3.0], dtype=torch.float64,
                                                                             requires_grad=True)))),
    "local_causal_attention": case(lambda g: (lambda q, k, v: course_lib.local_causal_attention(q, k, v, 3),
                                              tuple(double(1, 2, 7, 4, generator=g) for _ in "qkv"))),
    "local_causal_attention scale": case(lambda g: (
        lambda q, k, v: course_lib.local_causal_attention(q, k, v, 3, scale=0.3),
        tuple(double(1, 2, 7, 4, generator=g) for _ in "qkv"))),
    "matmul": case(lambda g: (lambda a, b, bias: course_lib.matmul(a, b, bias=bias, activation="gelu"),
                              (double(2, 3, 5, generator=g), double(5, 4, generator=g), double(4, generator=g)))),
}


@pytest.mark.parametrize("name", CASES)
def test_gradcheck_and_gradgradcheck_pass_in_float64(name):
    function, inputs = CASES[name]()
    assert gradcheck(function, inputs)
    assert gradgradcheck(function, inputs)


def test_the_routed_block_passes_gradcheck_in_float64():
    # Without the straight-through trick, whose weights of exactly 1 have no numerical gradient.
    torch.manual_seed(0)
    block = course_lib.RoutedBlock(8, num_heavy_tokens=3, light_window_size=4, heads=2, dim_head=4,
                                   router_kwargs=dict(straight_through=False, n_iters=5)).double()
    x = double(1, 8, 8, generator=torch.Generator().manual_seed(0))
    assert gradcheck(block, (x,))
    assert gradgradcheck(block, (x,))


def test_float64_computes_what_the_kernels_compute():
    x = torch.randn(4, 9, device=DEVICE)
    torch.testing.assert_close(course_lib.softmax(x.double()), course_lib.softmax(x).double())
    torch.testing.assert_close(course_lib.layernorm(x.double(), None), course_lib.layernorm(x, None).double(),
                               atol=1e-5, rtol=1e-5)


def test_float64_runs_under_torch_func():
    x = torch.randn(3, 4, 5, dtype=torch.float64)
    torch.testing.assert_close(torch.func.vmap(course_lib.softmax)(x), x.softmax(-1))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.float8_e4m3fn, torch.complex64])
def test_other_dtypes_are_still_refused_saying_what_is_accepted(dtype):
    x = torch.zeros(3, 5, device=DEVICE).to(dtype)
    with pytest.raises(TypeError, match=rf"softmax: x has dtype {dtype}; accepted: float32, float16, bfloat16, float64"):
        course_lib.softmax(x)


def test_mixing_float64_with_another_dtype_is_refused():
    x, weight = torch.randn(3, 5, device=DEVICE), torch.randn(5, device=DEVICE)
    with pytest.raises(TypeError, match="weighted_sum: weight has dtype torch.float32 but x has torch.float64"):
        course_lib.weighted_sum(x.double(), weight)
    with pytest.raises(TypeError, match="matmul: b has dtype torch.float64 but a has torch.float32"):
        course_lib.matmul(x, weight[:, None].double())
