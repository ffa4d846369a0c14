"""The routed block (course_lib.routed) against colt5-attention 0.11.2's modules, module
by module, and against itself on the PyTorch references in float64; bad input; the
block under torch.compile. Sizes are tiny: the kernels run in the interpreter on a CPU."""

import pytest
import torch
from colt5_attention import ConditionalRoutedAutoregressiveAttention, ConditionalRoutedFeedForward
from colt5_attention import CoordinateDescentRouter as Colt5Router
from colt5_attention.attend import Attend
from colt5_attention.transformer_block import RMSNorm
from conftest import COMPILE_MODES, TOLERANCES, assert_compiles_whole
from local_attention import LocalMHA

from course_lib.core import references
from course_lib.models import routed
from course_lib.models.recall_task import (IGNORE, RecallModel, RecallTask, colt5_state_dict, colt5_with_layernorm,
                                           light_branch_reach, recall_batch, routed_block, train_recall)
from course_lib.core.runtime import DEVICE

# Against the package in float32: the same operations in another order. Gradients that
# pass back through coordinate descent are divided by eps = 0.03 at every iteration and
# carry more rounding (the kernel's backward is not autograd's through the loop).
FLOAT32 = dict(rtol=1e-4, atol=1e-4)


def padding_mask(batch, seq_len, n_padded):
    """Right padding on the last sequence of the batch, none on the others."""
    mask = torch.ones(batch, seq_len, dtype=torch.bool, device=DEVICE)
    mask[-1, seq_len - n_padded:] = False
    return mask


def grads(outputs, inputs, grad_outputs):
    return torch.autograd.grad(outputs, inputs, grad_outputs)


def assert_same_grads(got, expected):
    """Gradient by gradient; colt5-attention's (1, dim) routing token against our (dim,)."""
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e.reshape(g.shape), **FLOAT32)


# k * fetch_k_ratio below seq_len: where it reaches it every weight is 1, all tie, and the
# package's topk picks any k while ours takes the k highest scores.
@pytest.mark.parametrize("batch, seq_len, dim, k, n_padded", [(2, 24, 16, 5, 4), (3, 17, 8, 12, 0)])
def test_router_picks_what_colt5_picks(batch, seq_len, dim, k, n_padded):
    ours = routed.CoordinateDescentRouter(dim).to(DEVICE)
    theirs = Colt5Router(dim).to(DEVICE)
    theirs.load_state_dict(colt5_state_dict(ours.state_dict()))
    x = torch.randn(batch, seq_len, dim, device=DEVICE, requires_grad=True)
    mask = padding_mask(batch, seq_len, n_padded)
    got, expected = ours(x, num_tokens=k, mask=mask, sequence_order=True), theirs(x, num_tokens=k, mask=mask)
    # The same tokens. Ours come in score order and the package's in weight order, which
    # ties where weights reach 1 (or underflow to 0): compare them in sequence order.
    order = expected.indices.argsort(dim=-1)
    expected = type(expected)(*(t if t is None else t.gather(1, order) if t.dim() == 2 else
                                t.gather(1, order[..., None].expand(-1, -1, t.shape[-1])) for t in expected))
    assert torch.equal(got.indices, expected.indices)
    assert torch.equal(got.mask, expected.routed_mask)
    torch.testing.assert_close(got.scores, expected.scores, **FLOAT32)
    torch.testing.assert_close(got.tokens, expected.routed_tokens, **FLOAT32)
    # The straight-through scores are 1 (0 on padding), but their gradient is the router's.
    grad_scores = torch.randn_like(got.scores)
    assert_same_grads(grads(got.scores, (x, ours.routing_token), grad_scores),
                      grads(expected.scores, (x, theirs.routing_token), grad_scores))


def test_feed_forward_is_colt5s_with_layernorm():
    batch, seq_len, dim, k = 2, 19, 16, 6
    ours = routed.RoutedFeedForward(dim, num_heavy_tokens=k).to(DEVICE)
    theirs = colt5_with_layernorm(ConditionalRoutedFeedForward(dim, num_heavy_tokens=k)).to(DEVICE)
    theirs.load_state_dict(colt5_state_dict(ours.state_dict()))
    x = torch.randn(batch, seq_len, dim, device=DEVICE, requires_grad=True)
    mask = padding_mask(batch, seq_len, 3)
    got, expected = ours(x, mask), theirs(x, mask=mask)
    torch.testing.assert_close(got, expected, **FLOAT32)
    grad_y = torch.randn_like(got)
    assert_same_grads(grads(got, (x, *ours.parameters()), grad_y), grads(expected, (x, *theirs.parameters()), grad_y))


def test_layernorm_and_rmsnorm_differ_by_the_mean():
    """The documented difference: colt5-attention's RMSNorm is x / rms(x) * gamma, the
    course's LayerNorm (x - mean) / std * gamma + beta. On rows of zero mean (and beta
    0) they agree; elsewhere LayerNorm is RMSNorm of the centred row."""
    dim = 32
    ours, theirs = routed.Norm(dim).to(DEVICE), RMSNorm(dim).to(DEVICE)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        theirs.gamma.copy_(ours.weight)
    x = torch.randn(4, 5, dim, device=DEVICE) + 3.0
    centred = x - x.mean(dim=-1, keepdim=True)
    # LayerNorm's eps (1e-5) against a variance near 1: a relative difference of 5e-6.
    torch.testing.assert_close(ours(x), theirs(centred), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ours(centred), theirs(centred), rtol=1e-4, atol=1e-4)
    assert (ours(x) - theirs(x)).abs().max() > 0.5  # a mean of 3 is not normalised away by RMSNorm


@pytest.mark.parametrize("seq_len, window, padded", [(21, 8, 0), (16, 4, 5), (7, 8, 0)])
def test_light_attention_is_local_attentions_local_mha(seq_len, window, padded):
    batch, dim, heads, dim_head = 2, 16, 2, 4
    ours = routed.LocalCausalAttention(dim, window_size=window, heads=heads, dim_head=dim_head).to(DEVICE)
    theirs = LocalMHA(dim=dim, dim_head=dim_head, heads=heads, window_size=window, prenorm=True, causal=True,
                      exact_windowsize=False, use_rotary_pos_emb=False).to(DEVICE)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(batch, seq_len, dim, device=DEVICE, requires_grad=True)
    mask = padding_mask(batch, seq_len, padded) if padded else None
    got, expected = ours(x, mask), theirs(x, mask=mask)
    torch.testing.assert_close(got, expected, **FLOAT32)
    grad_y = torch.randn_like(got)
    assert_same_grads(grads(got, (x, *ours.parameters()), grad_y), grads(expected, (x, *theirs.parameters()), grad_y))


def test_autoregressive_attention_shares_our_light_branch_and_attend():
    """colt5-attention's autoregressive attention routes per window (module docstring);
    its light branch and its causal Attend are ours."""
    dim, heads, dim_head, window, k = 16, 2, 4, 8, 6
    package = ConditionalRoutedAutoregressiveAttention(
        dim, num_heavy_tokens_q=2, num_heavy_tokens_kv=k, light_window_size=window, light_heads=heads,
        light_dim_head=dim_head, heavy_heads=heads, heavy_dim_head=dim_head,
    ).to(DEVICE)
    ours = routed.RoutedAttention(dim, num_heavy_tokens=k, light_window_size=window, light_heads=heads,
                                        light_dim_head=dim_head, heavy_heads=heads, heavy_dim_head=dim_head).to(DEVICE)
    ours.light_attn.load_state_dict(package.light_attn.state_dict())
    x = torch.randn(2, 20, dim, device=DEVICE)
    torch.testing.assert_close(ours.light_attn(x), package.light_attn(x), **FLOAT32)

    q, key, v = (torch.randn(2, heads, k, dim_head, device=DEVICE, requires_grad=True) for _ in range(3))
    got, expected = routed.causal_attention(q, key, v), Attend(causal=True)(q, key, v)
    torch.testing.assert_close(got, expected, **FLOAT32)
    grad_y = torch.randn_like(got)
    assert_same_grads(grads(got, (q, key, v), grad_y), grads(expected, (q, key, v), grad_y))


@pytest.mark.parametrize("n_padded", [0, 3])
def test_routed_attention_is_dense_attention_among_routed_tokens(n_padded):
    """Gathered in sequence order, causal_softmax over k tokens, scattered back: the same
    as masked dense attention over the whole sequence (references.routed_causal_attention)."""
    batch, heads, seq_len, dim_head, k = 2, 2, 15, 4, 6
    q, key, v = (torch.randn(batch, heads, seq_len, dim_head, device=DEVICE, dtype=torch.float64)
                 for _ in range(3))
    indices = torch.rand(batch, seq_len, device=DEVICE).topk(k, dim=-1).indices  # in score order
    real = padding_mask(batch, seq_len, n_padded)
    routed_mask = torch.zeros(batch, seq_len, dtype=torch.bool, device=DEVICE).scatter(1, indices, True)
    expected = references.routed_causal_attention(q, key, v, routed_mask, real)

    order = indices.sort(dim=-1)
    def gather(t):
        return t.gather(2, order.values[:, None, :, None].expand(-1, heads, -1, dim_head))
    out = routed.causal_attention(*(gather(t).float() for t in (q, key, v)),
                                  key_mask=real.gather(1, order.values))
    zeros = out.new_zeros(batch, seq_len, dim_head)
    got = torch.stack([routed.add_tokens(zeros, out[:, h], order.values) for h in range(heads)], dim=1)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


def make_blocks(dtype, dim=16, k=6, window=8):
    settings = dict(num_heavy_tokens=k, light_window_size=window, heads=2, dim_head=8)
    ours = routed.RoutedBlock(dim, **settings).to(DEVICE)
    with torch.no_grad():  # non-trivial norms, so that their gradients show
        for module in ours.modules():
            if isinstance(module, routed.Norm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.5, 0.5)
    reference = routed.RoutedBlock(dim, ops=routed.REFERENCE_OPS, **settings).to(DEVICE, torch.float64)
    ours = ours.to(dtype)
    reference.load_state_dict(ours.state_dict())
    return ours, reference


# float32 only: in 16-bit, routing weights below the smallest subnormal round to 0, and
# which of several zero-weight tokens fill the last routed places is a tie that another
# rounding breaks differently (the kernels' 16-bit accuracy is tested on their own).
@pytest.mark.parametrize("dtype", [torch.float32])
def test_block_matches_its_float64_reference(dtype):
    ours, reference = make_blocks(dtype)
    x = torch.randn(2, 20, 16, device=DEVICE, dtype=dtype, requires_grad=True)
    mask = padding_mask(2, 20, 3)
    x64 = x.detach().double().requires_grad_()
    got, expected = ours(x, mask), reference(x64, mask)
    # The same tokens routed: the outputs would differ wholesale otherwise.
    routed_ours = ours.attn.router(x.detach(), num_tokens=6, mask=mask).indices.sort(dim=-1).values
    routed_reference = reference.attn.router(x64.detach(), num_tokens=6, mask=mask).indices.sort(dim=-1).values
    assert torch.equal(routed_ours, routed_reference), "the router picked other tokens than its reference"
    # A block is a few dozen roundings deep: its errors are those of a sum of that length.
    rtol, atol = TOLERANCES[dtype]
    torch.testing.assert_close(got.double(), expected, rtol=rtol * 10, atol=atol * 10)
    grad_y = torch.randn_like(got)
    got_grads = grads(got, (x, *ours.parameters()), grad_y)
    expected_grads = grads(expected, (x64, *reference.parameters()), grad_y.double())
    for name, g, e in zip(["x"] + [n for n, _ in ours.named_parameters()], got_grads, expected_grads):
        torch.testing.assert_close(g.double(), e, rtol=rtol * 10, atol=atol * 10 * g.shape[-1] ** 0.5,
                                   msg=lambda m, name=name: f"gradient of {name}: {m}")


@pytest.mark.parametrize("n_padded", [0, 5])
def test_sequence_order_routes_the_same_tokens_by_position(n_padded):
    """sequence_order=True: the tokens, weights and mask of score order, sorted by position."""
    router = routed.CoordinateDescentRouter(8).to(DEVICE)
    x = torch.randn(2, 19, 8, device=DEVICE, requires_grad=True)
    mask = padding_mask(2, 19, n_padded)
    best_first = router(x, num_tokens=7, mask=mask)
    by_position = router(x, num_tokens=7, mask=mask, sequence_order=True)
    order = best_first.indices.argsort(dim=-1)
    assert torch.equal(by_position.indices, best_first.indices.gather(1, order))
    assert torch.all(by_position.indices[:, 1:] > by_position.indices[:, :-1])
    torch.testing.assert_close(by_position.scores, best_first.scores.gather(1, order), rtol=0, atol=0)
    torch.testing.assert_close(by_position.tokens, routed.gather_tokens(best_first.tokens, order), rtol=0, atol=0)
    assert torch.equal(by_position.mask, best_first.mask.gather(1, order))


def test_add_tokens_adds_the_routed_rows_and_keeps_the_others():
    torch.manual_seed(0)
    out, heavy = torch.randn(2, 9, 4, device=DEVICE), torch.randn(2, 3, 4, device=DEVICE)
    indices = torch.tensor([[7, 0, 3], [1, 8, 2]], device=DEVICE)
    expected = out.clone()
    for b in range(2):
        expected[b].index_add_(0, indices[b], heavy[b])
    torch.testing.assert_close(routed.add_tokens(out, heavy, indices), expected, rtol=0, atol=0)


def test_routed_query_never_sees_a_later_token():
    """Causality under routing: with the routing fixed, changing the tokens after
    position t leaves the outputs up to t unchanged."""
    ours, _ = make_blocks(torch.float32)
    attn = ours.attn
    x = torch.randn(1, 20, 16, device=DEVICE)
    picked = attn.router(x, num_tokens=6, sequence_order=True)
    later = x.clone()
    cut = int(picked.indices[0, 3])  # a routed position with routed tokens on both sides
    later[:, cut + 1:] = torch.randn_like(later[:, cut + 1:])
    changed = picked._replace(tokens=routed.gather_tokens(later, picked.indices))
    before, after = attn.heavy_attention(picked), attn.heavy_attention(changed)
    torch.testing.assert_close(before[:, :4], after[:, :4])
    assert (before[:, 4:] - after[:, 4:]).abs().max() > 1e-3  # the test can see a change
    torch.testing.assert_close(attn.light_attn(x)[:, :cut + 1], attn.light_attn(later)[:, :cut + 1])


@pytest.mark.parametrize("call, error, match", [
    (lambda b, x, m: b(x[0]), ValueError, r"x must have shape \(batch, seq, 16\)"),
    (lambda b, x, m: b(x[..., :8]), ValueError, r"x must have shape"),
    (lambda b, x, m: b(x.double()), TypeError, r"x has dtype torch.float64; accepted: the module's dtype"),
    (lambda b, x, m: b(x, m[:, :5]), ValueError, r"mask must have shape \(batch, seq\) = \(2, 20\)"),
    (lambda b, x, m: b(x, m.int()), TypeError, r"mask must be a bool tensor"),
    (lambda b, x, m: b(x[:, :4]), ValueError, r"num_heavy_tokens = 6 is larger than the sequence \(4 tokens\)"),
    (lambda b, x, m: b.ff.router(x, num_tokens=0), ValueError, r"num_tokens must be at least 1"),
    (lambda b, x, m: b.ff.router(x, num_tokens=2.5), TypeError, r"num_tokens must be an int"),
    (lambda b, x, m: routed.RoutedBlock(16, num_heavy_tokens=0), ValueError, r"num_heavy_tokens must be at least 1"),
    (lambda b, x, m: routed.RoutedFeedForward(16, num_heavy_tokens="4"), TypeError,
     r"num_heavy_tokens must be an int"),
    (lambda b, x, m: routed.LocalCausalAttention(16, window_size=0), ValueError, r"window_size must be at least 1"),
    (lambda b, x, m: routed.RoutedBlock(16, num_heavy_tokens=4, heads=0), ValueError, r"heads must be at least 1"),
    (lambda b, x, m: routed.RoutedBlock(16, num_heavy_tokens=4, dim_head=2.0), TypeError, r"dim_head must be an int"),
    (lambda b, x, m: routed.RoutedAttention(16, num_heavy_tokens=4, heavy_heads=-1), ValueError,
     r"heavy_heads must be at least 1"),
    (lambda b, x, m: routed.RoutedFeedForward(16, num_heavy_tokens=4, light_ff_mult=0.01), ValueError,
     r"light_ff_mult = 0.01 gives a hidden width int\(16 \* 0.01\) < 1"),
    (lambda b, x, m: routed.RoutedFeedForward(16, num_heavy_tokens=4, heavy_ff_mult="4"), TypeError,
     r"heavy_ff_mult must be a number"),
    (lambda b, x, m: b.attn.light_attn(x[..., :8]), ValueError, r"LocalCausalAttention: x must have shape"),
    (lambda b, x, m: b.attn.light_attn(x, m[:1]), ValueError, r"LocalCausalAttention: mask must have shape"),
    (lambda b, x, m: b.ff(x.double()), TypeError, r"x has dtype torch.float64"),
    (lambda b, x, m: routed.CoordinateDescentRouter(16, fetch_k_ratio=None), TypeError,
     r"fetch_k_ratio must be a number of at least 1, got None"),
    (lambda b, x, m: routed.CoordinateDescentRouter(16, fetch_k_ratio=0.5), ValueError,
     r"fetch_k_ratio must be a finite number of at least 1, got 0.5"),
])
def test_bad_input_names_the_argument(call, error, match):
    block, _ = make_blocks(torch.float32)
    x = torch.randn(2, 20, 16, device=DEVICE)
    with pytest.raises(error, match=match):
        call(block, x, padding_mask(2, 20, 3))


@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_block_compiles_whole(mode):
    block, _ = make_blocks(torch.float32)
    x = torch.randn(2, 20, 16, device=DEVICE, requires_grad=True)
    assert_compiles_whole(block, x, mode=mode, op="coor_descent")


def test_recall_batch_blanks_each_answer_and_hides_its_value_behind_its_key():
    task = RecallTask(seq_len=40, n_pairs=3)
    tokens, targets = recall_batch(task, 5, torch.Generator().manual_seed(1))
    body = task.seq_len - 2 * task.n_pairs
    for row_tokens, row_targets in zip(tokens.tolist(), targets.tolist()):
        pairs = {row_tokens[i]: row_tokens[i + 1] for i in range(body)
                 if task.n_noise <= row_tokens[i] < task.n_noise + task.n_keys}
        assert len(pairs) == task.n_pairs
        assert sum(token >= task.n_noise for token in row_tokens[:body]) == 2 * task.n_pairs  # nothing else stands out
        asked = [(p, row_targets[p]) for p in range(task.seq_len) if row_targets[p] != IGNORE]
        assert [p for p, _ in asked] == list(range(body, task.seq_len, 2))
        assert all(pairs[row_tokens[p]] == value and row_tokens[p + 1] == task.blank for p, value in asked)
        # An answer stands in the tokens only in its pair, before the query: nothing to leak.
        assert all(row_tokens.index(value) < p and row_tokens[p:].count(value) == 0 for p, value in asked)


def test_light_branch_reach_counts_the_pairs_a_query_window_sees():
    """128 tokens, 2 pairs, windows of 8: both queries (positions 124 and 126) see back to
    112. The first pair lies in 0..61, out of reach; the second has its key at 62 + an
    even offset in 0..60 (31 places), reached when its value (key + 1) is at 112 or
    later, offsets 50..60 (6 places); each query asks for either pair with probability
    1/2. So the reach is 6 / 62. Windows as long as the sequence see every pair."""
    task = RecallTask(seq_len=128, n_pairs=2)
    reach = light_branch_reach(task, light_window_size=8, sequences=20000)
    assert abs(reach - 6 / 62) < 0.01, reach
    assert light_branch_reach(task, light_window_size=128, sequences=100) == 1.0


def test_training_course_lib_and_reference_follow_one_curve():
    """Same seed, same data, same initial weights: course_lib's kernels and the PyTorch
    references start from one loss (float32 roundings apart) and both learn. After an
    update, a token whose routing weight sits next to another's may be routed by one and
    not the other (a rounding decides a top-k tie), so later losses agree only roughly."""
    task = RecallTask(seq_len=32, n_pairs=2, n_noise=8, n_keys=4, n_values=4)
    settings = dict(steps=3, batch=4, eval_batch=6, dim=16, depth=1, num_heavy_tokens=8, light_window_size=8, heads=2,
                    dim_head=8)
    ours, reference = (train_recall(impl, task, **settings) for impl in ("course_lib", "reference"))
    assert len(ours.losses) == 3 and 0.0 <= ours.accuracy <= 1.0
    torch.testing.assert_close(ours.losses[0], reference.losses[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.tensor(ours.losses), torch.tensor(reference.losses), rtol=5e-2, atol=5e-2)
    assert ours.losses[-1] < ours.losses[0] and reference.losses[-1] < reference.losses[0]


@pytest.mark.parametrize("impl", ["course_lib", "reference", "colt5_attention"])
def test_router_settings_reach_every_router_of_the_model(impl):
    """router_kwargs set every router's coordinate descent, in each implementation (the
    package's router takes the same names), and the default leaves CoLT5's eps = 0.03."""
    task = RecallTask(seq_len=32, n_pairs=2, n_noise=8, n_keys=4, n_values=4)
    sizes = dict(dim=16, depth=2, num_heavy_tokens=8, light_window_size=8, heads=2, dim_head=8)
    for router_kwargs, eps in ((None, 0.03), (dict(eps=1.0, n_iters=7), 1.0)):
        model = RecallModel(impl, task, router_kwargs=router_kwargs, **sizes)
        routers = [m for m in model.modules() if isinstance(m, (routed.CoordinateDescentRouter, Colt5Router))]
        # The feed-forward's router and the attention's (the package's attention has two: queries, keys).
        assert len(routers) == (3 if impl == "colt5_attention" else 2) * sizes["depth"]
        assert all(router.eps == eps for router in routers)
        if router_kwargs:
            assert all(router.n_iters == 7 for router in routers)


def test_the_package_routes_as_many_queries_a_window_as_asked():
    """colt5_queries_per_window sets how many queries the package's attention routes in
    each light window (by default num_heavy_tokens spread over the windows); course_lib's
    blocks route over the whole sequence, and refuse the setting rather than ignore it."""
    sizes = dict(num_heavy_tokens=16, seq_len=128, light_window_size=8, heads=2, dim_head=8)
    default, raised = (routed_block("colt5_attention", 16, colt5_queries_per_window=q, **sizes) for q in (None, 2))
    assert default.attn.num_heavy_tokens_q == 1 and raised.attn.num_heavy_tokens_q == 2
    assert raised.attn.num_heavy_tokens_kv == 16
    for impl in ("course_lib", "reference"):
        with pytest.raises(ValueError, match="colt5_queries_per_window is colt5_attention's setting"):
            routed_block(impl, 16, colt5_queries_per_window=2, **sizes)


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_router_routes_real_tokens_first_and_alike_in_every_dtype(scale):
    """Scores in the tens (a wide model's routing token starts as randn(dim)) leave many
    real tokens' float32 weights at exactly 0 after 20 iterations at eps = 0.03, tied with
    the padding's zeros: selection must still take every real token before any padded
    one, and float32 and float64 must route the same tokens."""
    generator = torch.Generator().manual_seed(7)
    batch, seq_len, k = 4, 64, 24
    s = torch.randn(batch, seq_len, dtype=torch.float64, generator=generator) * scale
    mask = torch.ones(batch, seq_len, dtype=torch.bool)
    mask[:, seq_len - 30:] = False  # 34 real tokens, more than k
    mask[-1, 10:] = False  # 10 real tokens, fewer than k: all of them, then padding
    routed32 = routed.top_k_routing(s.float().to(DEVICE), k, mask.to(DEVICE))
    routed64 = routed.top_k_routing(s, k, mask, ops=routed.REFERENCE_OPS)
    for indices, weights, routed_mask in (routed32, routed64):
        real = routed_mask.cpu()
        assert real[:-1].all(), "a padded token was routed while real tokens remained"
        assert real[-1].sum() == 10 and real[-1, :10].all()  # every real token first
        assert (weights.cpu()[~real] == 0).all()
    for row in range(batch - 1):
        assert set(routed32[0][row].tolist()) == set(routed64[0][row].tolist())
    assert set(routed32[0][-1, :10].tolist()) == set(range(10))


def test_block_on_an_empty_batch_returns_an_empty_batch():
    block, _ = make_blocks(torch.float32)
    x = torch.randn(0, 20, 16, device=DEVICE, requires_grad=True)
    y = block(x)
    y.sum().backward()
    assert y.shape == x.shape and x.grad.shape == x.shape


def test_block_on_an_empty_batch_with_a_mask_returns_an_empty_batch():
    block, _ = make_blocks(torch.float32)
    x = torch.randn(0, 20, 16, device=DEVICE, requires_grad=True)
    y = block(x, torch.ones(0, 20, dtype=torch.bool, device=DEVICE))
    y.sum().backward()
    assert y.shape == x.shape and x.grad.shape == x.shape


# ------------------------------------------------------------------ causality
# Perturbing the tokens after position t must leave every output at positions <= t
# unchanged, for each module the chapter calls causal. The router's top-k is not one:
# which tokens are routed depends on later tokens, so the block is an encoder's.


def perturbed_after(x, t):
    changed = x.detach().clone()
    changed[:, t + 1:] = torch.randn_like(changed[:, t + 1:]) * 3
    return changed


@pytest.mark.parametrize("t", [0, 13, 30])
@pytest.mark.parametrize("ops", [routed.COURSE_OPS, routed.REFERENCE_OPS], ids=["course_lib", "reference"])
def test_the_light_attention_is_causal(ops, t):
    attention = routed.LocalCausalAttention(16, window_size=8, heads=2, dim_head=8, ops=ops).to(DEVICE)
    x = torch.randn(2, 37, 16, device=DEVICE)
    with torch.no_grad():
        before, after = attention(x), attention(perturbed_after(x, t))
    torch.testing.assert_close(after[:, :t + 1], before[:, :t + 1], rtol=1e-6, atol=1e-6)
    assert not torch.allclose(after[:, t + 1:], before[:, t + 1:])  # the perturbation reaches the later outputs


@pytest.mark.parametrize("t", [2, 9])
def test_the_heavy_attention_is_causal_among_the_routed_tokens(t):
    """Given the routing, a routed token's heavy output depends on the routed tokens at or
    before it only."""
    attention = routed.RoutedAttention(16, num_heavy_tokens=12, light_window_size=8, light_heads=2, light_dim_head=8,
                                       heavy_heads=2, heavy_dim_head=8).to(DEVICE)
    x = torch.randn(2, 30, 16, device=DEVICE)
    with torch.no_grad():
        picked = attention.router(x, num_tokens=12, sequence_order=True)
        changed = picked._replace(tokens=perturbed_after(picked.tokens, t))
        before, after = attention.heavy_attention(picked), attention.heavy_attention(changed)
    torch.testing.assert_close(after[:, :t + 1], before[:, :t + 1], rtol=1e-6, atol=1e-6)
    assert not torch.allclose(after[:, t + 1:], before[:, t + 1:])


def test_the_routed_attention_as_a_whole_sees_later_tokens():
    """Why chapter 7 trains an encoder: a later token that outscores an earlier one takes
    its place in the top-k, and the earlier token's output changes."""
    torch.manual_seed(0)
    attention = routed.RoutedAttention(16, num_heavy_tokens=4, light_window_size=8, light_heads=2, light_dim_head=8,
                                       heavy_heads=2, heavy_dim_head=8).to(DEVICE)
    x = torch.randn(1, 24, 16, device=DEVICE)
    with torch.no_grad():
        token = attention.router.routing_token
        changed = x.clone()
        changed[:, 20:] = 10 * token / token.norm()  # later tokens now score highest
        before, after = attention(x), attention(changed)
    assert not torch.allclose(after[:, :20], before[:, :20])


@pytest.mark.parametrize("call, error, match", [
    (lambda s: routed.top_k_routing(s[0], 3), ValueError, r"s must be router scores of shape \(batch, n\), got \(10,\)"),
    (lambda s: routed.top_k_routing(s[None], 3), ValueError, r"s must be router scores of shape \(batch, n\)"),
    (lambda s: routed.top_k_routing(s.tolist(), 3), TypeError, "s must be a torch.Tensor of router scores"),
    (lambda s: routed.top_k_routing(s, 11), ValueError, r"num_tokens = 11 is larger than the sequence \(10 tokens\)"),
    (lambda s: routed.top_k_routing(s, 2.5), TypeError, "num_tokens must be an int, got float"),
    (lambda s: routed.top_k_routing(s, 0), ValueError, "num_tokens must be at least 1, got 0"),
    (lambda s: routed.top_k_routing(s, 2, fetch_k_ratio=0.5), ValueError, "fetch_k_ratio must be a finite number"),
    (lambda s: routed.top_k_routing(s, 2, fetch_k_ratio=float("nan")), ValueError, "fetch_k_ratio must be a finite"),
    (lambda s: routed.top_k_routing(s, 2, mask=torch.ones(2, 9, dtype=torch.bool, device=DEVICE)), ValueError,
     r"mask must have shape \(batch, seq\) = \(2, 10\), got \(2, 9\)"),
    (lambda s: routed.top_k_routing(s, 2, mask=torch.ones(2, 10, dtype=torch.bool, device="meta")), ValueError,
     "mask is on meta but the tokens are on"),
    (lambda s: routed.top_k_routing(s, 2, ops="x"), TypeError, "ops must be COURSE_OPS or REFERENCE_OPS"),
], ids=["1-D", "3-D", "list", "too many", "float count", "none", "ratio below 1", "ratio NaN", "mask shape",
        "mask device", "ops"])
def test_top_k_routing_refuses_bad_arguments_naming_them(call, error, match):
    with pytest.raises(error, match=f"top_k_routing: {match}"):
        call(torch.randn(2, 10, device=DEVICE))


@pytest.mark.parametrize("arguments, error, match", [
    ({"eps": 0}, ValueError, "eps must be positive and finite, got 0"),
    ({"eps": "a"}, TypeError, "eps must be a number, got str"),
    ({"eps_decay": 0}, ValueError, "eps_decay must be positive and finite, got 0"),
    ({"eps_init": float("nan")}, ValueError, "eps_init must be positive and finite, got nan"),
    ({"eps": 1e-39}, ValueError, "eps must be between"),
    ({"straight_through": "no"}, TypeError, "straight_through must be True or False, got 'no'"),
    ({"ops": "x"}, TypeError, "ops must be COURSE_OPS or REFERENCE_OPS"),
], ids=["eps 0", "eps str", "decay 0", "eps_init NaN", "eps subnormal", "straight_through str", "ops str"])
def test_router_refuses_bad_settings_when_built(arguments, error, match):
    """When built, naming the router's own argument, not at the first forward as coor_descent's."""
    with pytest.raises(error, match=f"CoordinateDescentRouter: {match}"):
        routed.CoordinateDescentRouter(8, **arguments)


def test_block_refuses_ops_that_are_not_ops():
    with pytest.raises(TypeError, match="RoutedBlock: ops must be COURSE_OPS or REFERENCE_OPS"):
        routed.RoutedBlock(8, num_heavy_tokens=4, light_window_size=4, heads=2, dim_head=4, ops="x")


def test_block_errors_name_the_block_and_its_own_arguments():
    with pytest.raises(TypeError, match="RoutedBlock: x has layout torch.sparse_coo"):
        routed.RoutedBlock(8, num_heavy_tokens=4, light_window_size=4, heads=2, dim_head=4).to(DEVICE)(
            torch.randn(2, 10, 8, device=DEVICE).to_sparse())
    with pytest.raises(ValueError, match="RoutedBlock: num_heavy_tokens must be at least 1, got 0"):
        routed.RoutedBlock(8, num_heavy_tokens=0)
    with pytest.raises(TypeError, match="RoutedBlock: router_kwargs has 'foo'; the router takes n_iters"):
        routed.RoutedBlock(8, num_heavy_tokens=4, router_kwargs={"foo": 1})


def test_block_runs_under_autocast():
    """Under autocast the light branch comes out of its Linear layers in the autocast dtype and
    the heavy one in float32: adding the heavy rows back casts them to the light rows' dtype."""
    block, _ = make_blocks(torch.float32)
    x = torch.randn(2, 20, 16, device=DEVICE, requires_grad=True)
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        y = block(x)
    y.float().sum().backward()
    assert y.shape == x.shape and x.grad.shape == x.shape and torch.isfinite(x.grad).all()
    torch.testing.assert_close(y.float(), block(x).float(), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("flag", ["straight_through", "sequence_order"])
@pytest.mark.parametrize("value", ["no", None, 1])
def test_top_k_routing_refuses_flags_that_are_not_bools(flag, value):
    with pytest.raises(TypeError, match=f"top_k_routing: {flag} must be True or False"):
        routed.top_k_routing(torch.randn(2, 10, device=DEVICE), 2, **{flag: value})


@pytest.mark.filterwarnings("ignore:Complex modules are a new feature")
def test_router_errors_name_the_router():
    router = routed.CoordinateDescentRouter(4).to(DEVICE)
    with pytest.raises(TypeError, match="CoordinateDescentRouter: sequence_order must be True or False"):
        router(torch.randn(2, 6, 4, device=DEVICE), num_tokens=2, sequence_order=None)
    complex_router = routed.CoordinateDescentRouter(4).to(DEVICE, torch.complex64)
    with pytest.raises(TypeError, match="CoordinateDescentRouter: the module is in torch.complex64, which the kernels"):
        complex_router(torch.zeros(2, 6, 4, device=DEVICE, dtype=torch.complex64), num_tokens=2)
    # float64: the kernels' functions compute with the PyTorch references (tests/test_gradcheck.py).
    double_router = routed.CoordinateDescentRouter(4).to(DEVICE, torch.float64)
    assert double_router(torch.randn(2, 6, 4, device=DEVICE, dtype=torch.float64), num_tokens=2).tokens.shape == (2, 2, 4)
    with pytest.raises(ValueError, match="top_k_routing: n_iters must be at least 1, got 0"):
        routed.top_k_routing(torch.randn(2, 10, device=DEVICE), 2, n_iters=0)
