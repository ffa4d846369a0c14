"""Pure-PyTorch references: the specification every kernel is tested against.

They favour clarity over speed. Tests call them on float64 copies of the inputs, so the
reference is more precise than the kernel it checks.
"""

import torch


def weighted_sum(x, weight):
    """y[..., ] = sum_d x[..., d] * weight[d]."""
    return (x * weight).sum(dim=-1)


def weighted_sum_backward(x, weight, grad_y):
    """Gradients of ``weighted_sum``: grad_x is an outer product, grad_weight a column sum."""
    grad_x = grad_y[..., None] * weight
    grad_weight = (x * grad_y[..., None]).reshape(-1, x.shape[-1]).sum(dim=0)
    return grad_x, grad_weight
