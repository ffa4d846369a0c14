"""Checkers of chapter 6, routed block: one function an exercise."""

import torch

from ...core import references
from ...core.runtime import DEVICE
from ..checking import ExerciseError, compare, run_student_code
from .common import Exercise, hidden_case, random_size, matches

__all__ = ["check_scatter_back", "check_routed_causal_mask", "check_route"]
# The chapter's exercises, in order, for the instructors' notes.
EXERCISES = (
    Exercise('6.1', 'scatter the routed tokens back', 'check_scatter_back', kernel=False, skills='gather and scatter', difficulty=1, minutes=10),
    Exercise('6.2', 'keep causality under routing', 'check_routed_causal_mask', kernel=False, skills='causal masks of routed tokens', difficulty=2, minutes=15),
    Exercise('6.3', "the router's padding mask", 'check_route', kernel=False, skills='masking padding before top-k', difficulty=2, minutes=15),
)



def _scatter_reference(routed, indices, seq_len):
    """A loop a reader can check by eye: token r of row b goes to position indices[b, r]."""
    out = torch.zeros(routed.shape[0], seq_len, routed.shape[-1], dtype=torch.float64, device=routed.device)
    for b in range(routed.shape[0]):
        for r in range(indices.shape[1]):
            out[b, indices[b, r]] = routed[b, r].double()
    return out


def check_scatter_back(scatter_back):
    """Exercise 6.1: ``scatter_back(routed, indices, seq_len)`` puts the routed tokens
    (b, k, d) back at their positions indices (b, k) of a (b, seq_len, d) of zeros,
    differentiably."""
    name = "Exercise 6.1 (scatter_back)"
    hidden = hidden_case(lambda: (lambda n: (random_size(1, 3), n, random_size(1, n), random_size(1, 9)))(random_size(2, 24)))
    for batch, seq_len, k, dim in [(1, 5, 2, 3), (3, 11, 4, 8), (2, 16, 16, 5)] + hidden:
        what = f"{name}, {batch} sequences of {seq_len} tokens, {k} routed, dim {dim}"
        indices = torch.rand(batch, seq_len, device=DEVICE).topk(k, dim=-1).indices  # distinct, in no order
        routed = torch.randn(batch, k, dim, device=DEVICE, requires_grad=True)
        got = run_student_code(name, scatter_back, routed, indices, seq_len)
        expected = _scatter_reference(routed.detach(), indices, seq_len)
        if isinstance(got, torch.Tensor) and got.shape == expected.shape and not torch.equal(got.detach().double(), expected):
            one_batch = _scatter_reference(routed.detach()[:1].expand_as(routed), indices[:1].expand_as(indices), seq_len)
            if batch > 1 and torch.equal(got.detach().double(), one_batch):
                raise ExerciseError(f"{what}: every sequence received the first sequence's tokens; the indices of "
                                    "row b place the tokens of row b (index along dim 1, batch by batch)")
            unrouted = expected.abs().sum(-1) == 0
            if got.detach()[unrouted].abs().max() > 0:
                raise ExerciseError(f"{what}: positions the router did not pick are not zero; start from zeros "
                                    "and write only the k routed positions")
        compare(what, got, expected, rtol=0, atol=0)
        if not got.requires_grad:
            raise ExerciseError(f"{what}: the result does not require grad: gradients could not reach the heavy "
                                "branch. Use an out-of-place operation (Tensor.scatter), not .data or a loop over .item()")
        grad_out = torch.randn(batch, seq_len, dim, device=DEVICE)
        (grad_routed,) = torch.autograd.grad(got, routed, grad_out)
        compare(f"{what}: the gradient of routed", grad_routed, grad_out.gather(1, indices[..., None].expand(-1, -1, dim)),
                rtol=0, atol=0)
    print("Exercise 6.1 passed: 3 shapes, values and gradients.")


def check_routed_causal_mask(routed_causal_mask):
    """Exercise 6.2: ``routed_causal_mask(positions)`` for routed positions (b, k), in
    the router's order (not sorted), returns the (b, k, k) bool mask, True where routed
    query i must not see routed key j: the key stands later in the sequence."""
    name = "Exercise 6.2 (routed_causal_mask)"
    hidden = hidden_case(lambda: (lambda n: (random_size(1, 3), n, random_size(1, n)))(random_size(2, 24)))
    for batch, seq_len, k in [(1, 6, 3), (3, 20, 7), (2, 9, 9)] + hidden:
        what = f"{name}, {batch} sequences of {seq_len} tokens, {k} routed"
        positions = torch.rand(batch, seq_len, device=DEVICE).topk(k, dim=-1).indices
        steps = positions.diff(dim=-1)
        monotonic = (steps > 0).all(-1) | (steps < 0).all(-1)
        if k > 2:  # else a transposed mask and one by place in the list could be the same: swap two
            positions[monotonic, :2] = positions[monotonic, :2].flip(-1)
        got = run_student_code(name, routed_causal_mask, positions)
        if not isinstance(got, torch.Tensor) or got.dtype != torch.bool:
            raise ExerciseError(f"{what}: expected a torch.bool tensor (a comparison gives one), got "
                                f"{got.dtype if isinstance(got, torch.Tensor) else type(got).__name__}")
        expected = positions[:, None, :] > positions[:, :, None]
        if got.shape == expected.shape and not torch.equal(got, expected):
            order_mask = references.causal_mask(k, DEVICE).expand_as(expected)
            hint = None
            if torch.equal(got, order_mask):
                hint = ("this is the causal mask of the routed tokens' places in the list, but a top-k lists them "
                        "by score, not by position: compare the positions themselves")
            elif torch.equal(got, expected.transpose(1, 2)):
                hint = "the mask is transposed: row i is the query, column j the key"
            elif torch.equal(got, expected | torch.eye(k, dtype=torch.bool, device=DEVICE)):
                hint = "a routed query must see itself: hide keys strictly later (>), not later or equal"
            elif torch.equal(got, ~expected):
                hint = "True and False are swapped: True marks the keys to hide"
            if hint:
                raise ExerciseError(f"{what}: wrong mask\n  hint: {hint}")
        compare(what, got.to(torch.float64) if isinstance(got, torch.Tensor) else got, expected.to(torch.float64),
                rtol=0, atol=0)
    print("Exercise 6.2 passed: 3 shapes, positions in the router's order.")


def check_route(route):
    """Exercise 6.3: ``route(s, mask, num_tokens)`` returns (indices, weights) of the
    routed tokens as CoordinateDescentRouter picks them from scores s (b, n) with the
    padding mask (b, n): coordinate descent with the mask, the top num_tokens, the
    straight-through weights, 0 on padding."""
    from ...models import routed as routed_block

    name = "Exercise 6.3 (route)"
    hidden = hidden_case(lambda: (lambda n: (random_size(2, 3), n, random_size(1, n), random_size(0, n - 1)))(random_size(4, 24)))
    for batch, seq_len, k, n_padded in [(2, 12, 4, 3), (3, 20, 6, 8), (2, 8, 6, 4)] + hidden:
        what = f"{name}, {batch} sequences of {seq_len} tokens, {n_padded} padded at the end of the last, {k} routed"
        s = torch.randn(batch, seq_len, device=DEVICE, requires_grad=True)
        mask = torch.ones(batch, seq_len, dtype=torch.bool, device=DEVICE)
        mask[-1, seq_len - n_padded:] = False
        result = run_student_code(name, route, s, mask, k)
        if not isinstance(result, tuple) or len(result) != 2:
            raise ExerciseError(f"{what}: return a tuple (indices, weights)")
        indices, weights = result
        s64 = s.detach().double().requires_grad_()
        expected_indices, expected_weights, _ = routed_block.top_k_routing(s64, k, mask, ops=routed_block.REFERENCE_OPS)
        if not isinstance(indices, torch.Tensor) or indices.shape != expected_indices.shape:
            raise ExerciseError(f"{what}: indices should be a ({batch}, {k}) tensor, got "
                                f"{tuple(indices.shape) if isinstance(indices, torch.Tensor) else type(indices).__name__}")
        picked, expected_picked = indices.sort(dim=-1), expected_indices.sort(dim=-1)
        for b in range(batch):
            # Padded tokens fill a sequence shorter than k; which of them is a tie (weight 0).
            real, expected_real = (p[mask[b].gather(0, p)].tolist() for p in (picked.values[b], expected_picked.values[b]))
            if real != expected_real:
                hint = ""
                if len(real) < len(expected_real):
                    hint = ("\n  hint: padding was routed in place of real tokens; pass mask to coor_descent so "
                            "padded scores take no part")
                raise ExerciseError(f"{what}: sequence {b} routes the real positions {real}, "
                                    f"expected {expected_real}{hint}")
        got = weights.gather(1, picked.indices)
        expected = expected_weights.gather(1, expected_picked.indices)
        padded_weights = got.detach()[~mask.gather(1, picked.values)]
        if padded_weights.numel() and padded_weights.abs().max() > 0:
            raise ExerciseError(f"{what}: a padded token routed to fill a short sequence has weight "
                                f"{padded_weights.abs().max().item():.3g}; its weight must be 0 (mask it after the "
                                "straight-through step)")
        compare(f"{what}: the weights", got, expected, rtol=1e-5, atol=1e-5)
        if not weights.requires_grad:
            raise ExerciseError(f"{what}: the weights do not require grad: the router could not learn. Straight-"
                                "through keeps the gradient: weights + (1 - weights).detach()")
        grad_weights = torch.randn(batch, k, device=DEVICE)
        (grad_s,) = torch.autograd.grad(got, s, grad_weights)
        (expected_grad_s,) = torch.autograd.grad(expected, s64, grad_weights.double())
        try:
            compare(f"{what}: the gradient of s", grad_s, expected_grad_s, rtol=1e-3, atol=1e-3)
        except ExerciseError as error:
            # Routing without the mask may pick the same tokens (straight-through weights are all 1),
            # but padding then competes in coordinate descent and the gradient shows it.
            unmasked_s = s.detach().double().requires_grad_()
            unmasked_indices, unmasked, _ = routed_block.top_k_routing(unmasked_s, k, None,
                                                                       ops=routed_block.REFERENCE_OPS)
            unmasked = unmasked.masked_fill(~mask.gather(1, unmasked_indices), 0.0)
            unmasked = unmasked.gather(1, unmasked_indices.sort(dim=-1).indices)
            (unmasked_grad,) = torch.autograd.grad(unmasked, unmasked_s, grad_weights.double())
            hint = ("\n  hint: this is the gradient of routing without the mask: padding took part in coordinate "
                    "descent. Pass mask to coor_descent" if matches(grad_s, unmasked_grad, rtol=1e-3, atol=1e-3) else "")
            raise ExerciseError(f"{error}{hint}") from None
    print("Exercise 6.3 passed: 3 shapes with padding, the routed positions, their weights and the gradient of s.")
