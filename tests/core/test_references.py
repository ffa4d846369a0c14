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
