"""benchmarks/floor.py: each floor launches the computation of course_lib's function, on the
inputs host.py gives both (profile_step.KERNELS): the same values, forward and backward.
Timing them takes a GPU; here the interpreter checks what they compute."""

import pytest
import torch

from benchmarks import floor
from benchmarks.profile_step import KERNELS, floor_function
from course_lib.core.runtime import DEVICE

# Small shapes of each kernel's inputs (profile_step.KERNELS makes the others from them),
# widths not powers of two, and several row groups in the backwards.
SHAPES = {"weighted_sum": (70, 48), "softmax": (9, 40), "causal_softmax": (3, 24, 24), "layernorm": (70, 40),
          "coor_descent": (5, 64)}


def test_every_kernel_of_host_py_has_a_floor():
    assert set(floor.FLOORS) == set(KERNELS) == set(SHAPES)


@pytest.mark.parametrize("kernel", SHAPES)
def test_the_floor_computes_what_course_lib_does(kernel):
    ours, _, input_shapes = KERNELS[kernel]
    inputs = [torch.randn(shape, device=DEVICE, requires_grad=True) for shape in input_shapes(SHAPES[kernel])]
    floor_inputs = [t.detach().clone().requires_grad_() for t in inputs]
    expected, got = ours(*inputs), floor_function(kernel, *floor_inputs)(*floor_inputs)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    grad_y = torch.randn_like(expected)
    expected.backward(grad_y)
    got.backward(grad_y)
    for name, want, have in zip(("first input", "second", "third"), inputs, floor_inputs):
        torch.testing.assert_close(have.grad, want.grad, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}'s grad: {m}")


def test_rows_wider_than_a_block_are_refused():
    with pytest.raises(ValueError, match="floor softmax: rows of 65536 take course_lib's looped kernels"):
        floor.softmax(torch.empty(1, 65536, device=DEVICE))
