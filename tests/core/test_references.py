import pytest
import torch

from course_lib.core import references


def test_weighted_sum_backward_matches_autograd():
    x = torch.randn(4, 3, 6, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(6, dtype=torch.float64, requires_grad=True)
    grad_y = torch.randn(4, 3, dtype=torch.float64)
    references.weighted_sum(x, weight).backward(grad_y)
    grad_x, grad_weight = references.weighted_sum_backward(x.detach(), weight.detach(), grad_y)
    torch.testing.assert_close(grad_x, x.grad)
    torch.testing.assert_close(grad_weight, weight.grad)


def test_weighted_sum_is_a_matrix_vector_product():
    x = torch.randn(5, 7, dtype=torch.float64)
    weight = torch.randn(7, dtype=torch.float64)
    torch.testing.assert_close(references.weighted_sum(x, weight), x @ weight)


@pytest.mark.parametrize("stable", [False, True])
@pytest.mark.parametrize("affine", [True, False])
def test_layernorm_by_torch_computes_the_specification(stable, affine):
    x = torch.randn(6, 33, dtype=torch.float64) * 3 + 1
    gamma, beta = (torch.randn(33, dtype=torch.float64), torch.randn(33, dtype=torch.float64)) if affine else (None,) * 2
    torch.testing.assert_close(references.layernorm_by_torch(x, gamma, beta, 1e-5, stable),
                               references.layernorm(x, gamma, beta, 1e-5, stable))
    # the widest dtype wins, as the specification's arithmetic promotes
    assert references.layernorm_by_torch(x.float(), gamma, beta).dtype == (torch.float64 if affine else torch.float32)


@pytest.mark.parametrize("with_minus_inf", [False, True])
def test_softmax_paths_agree_to_second_order(with_minus_inf):
    # Where every row has a finite maximum, a plain CPU tensor takes torch.softmax alone, and
    # a tensor under torch.func's transforms the guarded path: the same values and derivatives.
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(5, 9, dtype=torch.float64, generator=generator)
    weights = torch.randn(5, 9, dtype=torch.float64, generator=generator)
    if with_minus_inf:  # keys no query sees, each row keeping a finite maximum
        x[1, ::2] = float("-inf")
        x[3, 4] = float("-inf")

    def loss(t):
        return (references.softmax(t) * weights).sum()

    torch.testing.assert_close(torch.func.vmap(references.softmax)(x), references.softmax(x), rtol=0, atol=0)
    torch.testing.assert_close(torch.func.grad(loss)(x), torch.autograd.functional.jacobian(loss, x))
    torch.testing.assert_close(torch.func.hessian(loss)(x), torch.autograd.functional.hessian(loss, x))
