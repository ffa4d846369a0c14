"""One way to make an operator (course_lib/core/operator.py): every kernel's operators,
called directly as public API, check their inputs as the Python functions do, and the
backward each kernel states once serves eager autograd and torch.compile alike."""

import inspect
import re
import sys

import pytest
import torch

from course_lib.core.operator import KernelOp
from course_lib.core.runtime import DEVICE
from course_lib.registry import KERNELS

ops = torch.ops.course_lib


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, device=DEVICE, dtype=dtype)


def test_every_kernel_module_makes_its_operators_with_differentiable_op():
    """One KernelOp a kernel module, made by @differentiable_op over the forward and bound to
    its name, so that the public function's call names the code that launches the kernels."""
    for kernel in KERNELS:
        if not kernel.module.startswith("kernels."):
            continue
        package = kernel.load()
        # LayerNorm's and coor_descent's live in modules of their subpackages
        modules = [m for name, m in sys.modules.items()
                   if name == package.__name__ or name.startswith(package.__name__ + ".")]
        found = {name: id(value) for m in modules for name, value in vars(m).items() if isinstance(value, KernelOp)}
        assert len(found) == 1 and len(set(found.values())) == 1, kernel.name
        (name,) = found
        sources = [inspect.getsource(m) for m in modules]
        assert any(re.search(rf"^@differentiable_op\((.|\n)*?\)\ndef {name}\(", source, re.MULTILINE)
                   for source in sources), f"{kernel.name}: {name} is not a forward under @differentiable_op"


BAD_CALLS = [
    # forward operators
    (lambda: ops.weighted_sum(randn(3, 5), randn(4)), ValueError, r"weighted_sum: weight must have shape \(D,\)"),
    (lambda: ops.softmax(torch.ones(3, 4, dtype=torch.int32, device=DEVICE), False, 0), TypeError,
     r"softmax: x has dtype torch.int32"),
    (lambda: ops.softmax(randn(3, 4), True, 0.5), RuntimeError, r"type 'int' for argument 'diagonal'"),
    (lambda: ops.layernorm(randn(3, 5), randn(4), None, 1e-5), ValueError, r"layernorm: gamma must have shape"),
    (lambda: ops.layernorm(randn(3, 5), None, None, -1.0), ValueError, r"eps must be a non-negative number"),
    (lambda: ops.coor_descent(randn(3, 5), None, None, 0.5, 0, 0.1, None, 1.0), ValueError,
     r"coor_descent: n_iters must be at least 1"),
    (lambda: ops.coor_descent(randn(3, 5), None, randn(2), 0.0, 5, 0.1, None, 1.0), ValueError,
     r"coor_descent: logk must have shape \(3,\)"),
    (lambda: ops.coor_descent(randn(3, 5), None, None, 3.0, 5, 0.1, None, 1.0), ValueError,
     r"logk_value must be log k with 0 < k"),
    (lambda: ops.local_attention(randn(1, 2, 8, 16), randn(1, 2, 8, 16), randn(1, 2, 8, 16), 0), ValueError,
     r"window must be at least 1"),
    (lambda: ops.local_attention(randn(1, 2, 8, 16), randn(1, 2, 4, 16), randn(1, 2, 8, 16), 4), ValueError,
     r"q, k and v must have one shape"),
    # backward operators: what the forward saved, checked before any kernel reads it
    (lambda: ops.weighted_sum_backward(randn(3, 5), randn(5), randn(2)), ValueError,
     r"weighted_sum_backward: grad_y must have shape \(3,\)"),
    (lambda: ops.softmax_backward(randn(3, 4), randn(3, 5), False, 0), ValueError,
     r"softmax_backward: grad_y must have shape \(3, 4\)"),
    (lambda: ops.layernorm_backward(randn(3, 5), randn(3, 5), None, False, randn(2), randn(3), torch.float32),
     ValueError, r"layernorm_backward: mean must have shape \(3,\)"),
    (lambda: ops.layernorm_backward(randn(3, 5), randn(3, 5), None, False, randn(6)[::2], randn(3), torch.float32),
     ValueError, r"mean must be contiguous"),
    (lambda: ops.coor_descent_backward(randn(3, 5), None, None, 0.5, 4, 0.1, None, 1.0,
                                       randn(3, 2, dtype=torch.float64), randn(3), randn(3, 5)),
     ValueError, r"coor_descent_backward: a must have shape \(3, 4\)"),
    (lambda: ops.local_attention_backward(randn(1, 2, 8, 16), randn(1, 2, 8, 16), randn(1, 2, 8, 16),
                                          randn(1, 2, 8, 16), randn(1, 2, 8, 16), randn(2, 7), 4),
     ValueError, r"local_attention_backward: lse must have shape \(2, 8\)"),
]


@pytest.mark.parametrize("call, error, match", BAD_CALLS, ids=lambda v: getattr(v, "pattern", None) or "")
def test_operators_called_directly_refuse_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_operators_called_directly_compute_what_the_functions_do():
    import course_lib

    x, w = randn(6, 9), randn(9)
    torch.testing.assert_close(ops.weighted_sum(x, w), course_lib.weighted_sum(x, w))
    torch.testing.assert_close(ops.softmax(x, True, 3), course_lib.causal_softmax(x, diagonal=3))
    y, mean, rstd = ops.layernorm(x, w, None, 1e-5)
    torch.testing.assert_close(y, course_lib.layernorm(x, w))
    grad_y = randn(6, 9)
    grad_x, grad_gamma, grad_beta = ops.layernorm_backward(grad_y, x, w, False, mean, rstd, torch.float32)
    x_leaf, w_leaf = x.clone().requires_grad_(), w.clone().requires_grad_()
    expected = torch.autograd.grad(course_lib.layernorm(x_leaf, w_leaf), (x_leaf, w_leaf), grad_y)
    torch.testing.assert_close(grad_x, expected[0])
    torch.testing.assert_close(grad_gamma, expected[1])
    assert grad_beta.numel() == 0  # no beta: an empty tensor, as the schema returns tensors only


def test_the_function_keeps_no_input_alive_that_the_backward_does_not_need():
    """softmax's backward needs only its output: the scores it was given, an activation
    as large as the output, are free once the caller drops them."""
    import gc
    import weakref

    import course_lib

    leaf = randn(4, 64, 64).requires_grad_()
    scores = leaf * 2.0  # computed, as attention scores are; multiplying by a number saves neither
    watched = weakref.ref(scores)
    probabilities = course_lib.causal_softmax(scores)
    del scores
    gc.collect()
    assert watched() is None
    probabilities.sum().backward()
    assert leaf.grad is not None
