"""A task that needs routing, and a small encoder of routed blocks that learns it.

Associative recall: a long sequence of noise holds a few (key, value) pairs; at its end
the keys come again, each followed by a blank where its value was, and the model must
fill in the value at each repeated key. The pair may be thousands of tokens back, far
outside the light branch's window: only the heavy branch can fetch it, and only if the
router picks the pair's tokens. Noise and keys are drawn from separate ranges of the
vocabulary, so whether a token matters can be read off the token itself, which a router
can learn.

The answers are blanked in the input, so a model may look at the whole sequence, as a
routed block does (its top-k routing sees every token): the task is an encoder's, and a
router that sees later tokens learns nothing it should not.

The same function trains the model on course_lib's kernels, on the PyTorch references,
or on the colt5-attention package's modules, and trains the two baselines the routed
block is judged against: the light branch alone, and dense causal attention.
"""

import json
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..core.benchmarking import RESULTS_DIR
from .routed import (COURSE_OPS, REFERENCE_OPS, LocalCausalAttention, Norm, RoutedBlock, check_count, feed_forward,
                     merge_heads, split_heads)
from ..core.runtime import DEVICE
from ..core.validation import not_a_tensor

IMPLS = ("course_lib", "reference", "colt5_attention")
# What each block of a RecallModel is: the routed block, its light branch alone (local
# attention and the narrow feed-forward: what the model can do without routing), or a
# dense block (causal attention over every token and a wide feed-forward: what routing
# tries to approach at a fraction of the cost).
ARCHITECTURES = ("routed", "light", "dense")
IGNORE = -100  # target of the positions that carry no loss (cross_entropy's ignore_index)


class RecallTask(NamedTuple):
    """Sizes of the associative-recall task: the vocabulary holds noise, keys, values and
    the blank, in that order.

    Args:
        seq_len (int): tokens in a sequence (at least 4 * n_pairs).
        n_pairs (int): (key, value) pairs hidden in a sequence, and asked for at its end.
        n_noise, n_keys, n_values (int): how many noise, key and value tokens there are.

    Shape:
        - A batch of it (:func:`recall_batch`): tokens and targets (batch, seq_len)

    Returns:
        RecallTask: a named tuple; ``vocab`` and ``blank`` derive from it.

    Example::

        >>> task = RecallTask(seq_len=64, n_pairs=2)
        >>> task.vocab
        65
    """

    seq_len: int = 256
    n_pairs: int = 4
    n_noise: int = 32
    n_keys: int = 16
    n_values: int = 16

    @property
    def blank(self):
        """The token that stands where a recalled value was."""
        return self.n_noise + self.n_keys + self.n_values

    @property
    def vocab(self):
        return self.blank + 1


def _check_task(op, task):
    """Each size of ``task`` a positive int: a task of no pairs, keys, values or noise has
    nothing to recall or nothing to hide the pairs in."""
    if not isinstance(task, RecallTask):
        raise TypeError(f"{op}: task must be a RecallTask, got {type(task).__name__}")
    for name in RecallTask._fields:
        check_count(op, f"RecallTask.{name}", getattr(task, name))


def recall_batch(task, batch, generator=None, device="cpu"):
    """A batch of the task: (tokens, targets).

    The first part is noise with ``n_pairs`` (key, value) pairs at random places; the
    last 2 * n_pairs tokens repeat the keys in another order, each followed by the blank
    token. targets holds the value at each repeated key's position and IGNORE everywhere
    else: a value appears in the tokens only in its pair, before the query asking for it.

    Args:
        task (RecallTask): the sizes.
        batch (int): sequences in the batch.
        generator (torch.Generator, optional): a CPU generator, which draws every random
            number (one seed, the same batches on every device); by default torch's global
            one (``torch.manual_seed`` seeds it).
        device: where the tensors go.

    Shape:
        - tokens, targets: (batch, seq_len)

    Returns:
        tuple of Tensor: tokens and targets, both int64.

    Example::

        >>> task = RecallTask(seq_len=64, n_pairs=2)
        >>> tokens, targets = recall_batch(task, 8, torch.Generator().manual_seed(0))
        >>> tokens.shape
        torch.Size([8, 64])
    """
    op = "recall_batch"
    _check_task(op, task)
    check_count(op, "batch", batch)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"{op}: generator must be a torch.Generator or None, got {type(generator).__name__}")
    n_noise, n_keys, n_pairs, seq_len = task.n_noise, task.n_keys, task.n_pairs, task.seq_len
    body = seq_len - 2 * n_pairs
    if body < 2 * n_pairs or n_pairs > n_keys:
        raise ValueError(f"recall_batch: seq_len {seq_len} too short or n_keys {n_keys} too few "
                         f"for {n_pairs} pairs: it needs seq_len >= 4 * n_pairs and n_keys >= n_pairs")
    tokens = torch.randint(0, n_noise, (batch, seq_len), generator=generator)
    targets = torch.full((batch, seq_len), IGNORE)
    rows = torch.arange(batch)[:, None]
    keys = torch.rand(batch, n_keys, generator=generator).argsort(dim=-1)[:, :n_pairs] + n_noise
    values = torch.randint(0, task.n_values, (batch, n_pairs), generator=generator) + n_noise + n_keys
    # Pair slots: the body cut into n_pairs stretches of even length, one pair at an
    # even offset inside each, so pairs never overlap.
    stretch = body // n_pairs
    offsets = 2 * torch.randint(0, stretch // 2, (batch, n_pairs), generator=generator)
    key_positions = torch.arange(n_pairs) * stretch + offsets
    tokens[rows, key_positions] = keys
    tokens[rows, key_positions + 1] = values
    order = torch.rand(batch, n_pairs, generator=generator).argsort(dim=-1)
    query_positions = body + 2 * torch.arange(n_pairs)
    tokens[rows, query_positions] = keys.gather(1, order)
    tokens[rows, query_positions + 1] = task.blank
    targets[rows, query_positions] = values.gather(1, order)
    return tokens.to(device), targets.to(device)


def _with_float32_scores(coor_descent):
    """colt5-attention's Triton router takes log k in the scores' dtype, which Triton
    refuses for bfloat16 ("Expected dtype ['fp32', 'fp64'] but got bf16"): the smallest
    change that lets a bfloat16 block run it gives it float32 scores, and returns the
    routing weights in the scores' dtype."""
    def float32_scores(s, **settings):
        return coor_descent(s.float(), **settings).to(s.dtype)
    return float32_scores


class Colt5Block(nn.Module):
    """The colt5-attention package's routed attention and feed-forward, added as
    RoutedBlock adds its branches. Its queries are routed per window of the light
    branch's size: ``queries_per_window`` of them, by default num_heavy_tokens spread
    over the windows."""

    def __init__(self, dim, *, num_heavy_tokens, seq_len, light_window_size, heads, dim_head, use_triton,
                 router_kwargs=None, queries_per_window=None):
        super().__init__()
        from colt5_attention import ConditionalRoutedAutoregressiveAttention, ConditionalRoutedFeedForward

        queries_per_window = queries_per_window or max(1, num_heavy_tokens * light_window_size // seq_len)
        router_kwargs = router_kwargs or {}
        self.attn = ConditionalRoutedAutoregressiveAttention(
            dim, num_heavy_tokens_q=queries_per_window, num_heavy_tokens_kv=num_heavy_tokens,
            light_window_size=light_window_size, light_heads=heads, light_dim_head=dim_head, heavy_heads=heads,
            heavy_dim_head=dim_head, use_triton=use_triton, router_kwargs=router_kwargs,
        )
        self.ff = ConditionalRoutedFeedForward(dim, num_heavy_tokens=num_heavy_tokens, use_triton=use_triton,
                                               router_kwargs=router_kwargs)
        if use_triton:
            from colt5_attention.transformer_block import CoordinateDescentRouter

            for router in self.modules():
                if isinstance(router, CoordinateDescentRouter):
                    router.coor_descent = _with_float32_scores(router.coor_descent)

    def forward(self, x, mask=None):
        x = x + self.attn(x)
        return x + self.ff(x, mask=mask)


def routed_block(impl, dim, *, num_heavy_tokens, seq_len, light_window_size=128, heads=8, dim_head=64,
                 router_kwargs=None, colt5_queries_per_window=None):
    """One routed block of ``impl`` (one of IMPLS); colt5_attention's router runs its
    Triton kernel on a GPU and its PyTorch code elsewhere. ``router_kwargs`` go to every
    router of the block (both implementations take the same names: eps, n_iters, ...).
    ``colt5_queries_per_window``: the queries the package routes in each light window
    (Colt5Block's default if None); only the package has that setting."""
    if impl == "colt5_attention":
        return Colt5Block(dim, num_heavy_tokens=num_heavy_tokens, seq_len=seq_len,
                          light_window_size=light_window_size, heads=heads, dim_head=dim_head,
                          use_triton=torch.cuda.is_available(), router_kwargs=router_kwargs,
                          queries_per_window=colt5_queries_per_window)
    if impl not in IMPLS:
        raise ValueError(f"routed_block: impl must be one of {', '.join(IMPLS)}; got {impl!r}")
    if colt5_queries_per_window is not None:
        raise ValueError(f"routed_block: colt5_queries_per_window is colt5_attention's setting; {impl} routes "
                         "its queries over the whole sequence")
    ops = COURSE_OPS if impl == "course_lib" else REFERENCE_OPS
    return RoutedBlock(dim, num_heavy_tokens=num_heavy_tokens, light_window_size=light_window_size, heads=heads,
                       dim_head=dim_head, router_kwargs=router_kwargs, ops=ops)


class LightBlock(nn.Module):
    """The routed block's light branch alone: causal local attention and the narrow
    feed-forward, added as RoutedBlock adds its branches."""

    def __init__(self, dim, *, light_window_size, heads, dim_head, ops):
        super().__init__()
        self.attn = LocalCausalAttention(dim, window_size=light_window_size, heads=heads, dim_head=dim_head, ops=ops)
        self.ff = feed_forward(dim, 0.5, ops)

    def forward(self, x, mask=None):
        x = x + self.attn(x, mask)
        return x + self.ff(x)


class DenseBlock(nn.Module):
    """A dense pre-norm transformer block: causal attention of every token over every
    earlier token (PyTorch's scaled_dot_product_attention) and the heavy branch's wide
    feed-forward for every token."""

    def __init__(self, dim, *, heads, dim_head, ops):
        super().__init__()
        self.heads = heads
        self.norm = Norm(dim, ops)
        self.to_qkv = nn.Linear(dim, 3 * heads * dim_head, bias=False)
        self.to_out = nn.Linear(heads * dim_head, dim, bias=False)
        self.ff = feed_forward(dim, 4, ops)

    def forward(self, x, mask=None):
        q, k, v = (split_heads(t, self.heads) for t in self.to_qkv(self.norm(x)).chunk(3, dim=-1))
        x = x + self.to_out(merge_heads(F.scaled_dot_product_attention(q, k, v, is_causal=True)))
        return x + self.ff(x)


def recall_block(architecture, impl, dim, *, num_heavy_tokens, seq_len, light_window_size, heads, dim_head,
                 router_kwargs=None, colt5_queries_per_window=None):
    """One block of a RecallModel: ``architecture`` one of ARCHITECTURES; the light and
    dense blocks take their norms from ``impl``'s kernels and have no router."""
    if architecture not in ARCHITECTURES:
        raise ValueError(f"RecallModel: architecture must be one of {', '.join(ARCHITECTURES)}; got {architecture!r}")
    if architecture == "routed":
        return routed_block(impl, dim, num_heavy_tokens=num_heavy_tokens, seq_len=seq_len,
                            light_window_size=light_window_size, heads=heads, dim_head=dim_head,
                            router_kwargs=router_kwargs, colt5_queries_per_window=colt5_queries_per_window)
    if impl == "colt5_attention":
        raise ValueError(f"RecallModel: the {architecture} block is built from course_lib or reference ops, "
                         "not colt5_attention's")
    ops = COURSE_OPS if impl == "course_lib" else REFERENCE_OPS
    if architecture == "light":
        return LightBlock(dim, light_window_size=light_window_size, heads=heads, dim_head=dim_head, ops=ops)
    return DenseBlock(dim, heads=heads, dim_head=dim_head, ops=ops)


class RecallModel(nn.Module):
    """Embeddings (token and position), ``depth`` blocks (routed, light or dense), a norm,
    the logits: the model chapter 7 trains on the recall task.

    Args:
        impl (str): what the blocks are built from: ``"course_lib"`` (the Triton kernels,
            :class:`RoutedBlock` on COURSE_OPS), ``"reference"`` (the same block on the
            pure-PyTorch references, REFERENCE_OPS) or ``"colt5_attention"`` (the
            colt5-attention package's modules, which must be installed).
        task (RecallTask): the task: its vocabulary and seq_len size the embeddings.
        dim (int): the tokens' width.
        depth (int): blocks.
        num_heavy_tokens (int): tokens each router sends to the heavy branch.
        light_window_size (int): the light attention's window.
        heads, dim_head (int): attention heads and their width.
        router_kwargs (dict, optional): settings of every router (n_iters, eps, ...).
        colt5_queries_per_window (int, optional): colt5_attention's setting only.
        architecture (str): ``"routed"``, ``"light"`` (the light branch alone) or
            ``"dense"`` (causal attention over every token).

    Shape:
        - tokens: (batch, n) int64 or int32, n at most task.seq_len
        - Output: (batch, n, task.vocab) logits

    Returns:
        RecallModel: the module; call it on tokens for the logits.

    Example::

        >>> task = RecallTask(seq_len=64, n_pairs=2)
        >>> model = RecallModel("reference", task, dim=32, num_heavy_tokens=8)
        >>> tokens, _ = recall_batch(task, 4, torch.Generator().manual_seed(0))
        >>> model(tokens).shape
        torch.Size([4, 64, 65])
    """

    def __init__(self, impl, task, *, dim=64, depth=2, num_heavy_tokens=32, light_window_size=16, heads=4,
                 dim_head=16, router_kwargs=None, colt5_queries_per_window=None, architecture="routed"):
        super().__init__()
        _check_task("RecallModel", task)
        if architecture == "routed" and isinstance(num_heavy_tokens, int) and num_heavy_tokens > task.seq_len:
            raise ValueError(f"RecallModel: num_heavy_tokens ({num_heavy_tokens}) must be at most the task's "
                             f"seq_len ({task.seq_len}): a routed block picks them among its tokens")
        self.seq_len = task.seq_len
        self.token_embedding = nn.Embedding(task.vocab, dim)
        self.position_embedding = nn.Embedding(task.seq_len, dim)
        self.blocks = nn.ModuleList(
            recall_block(architecture, impl, dim, num_heavy_tokens=num_heavy_tokens, seq_len=task.seq_len,
                         light_window_size=light_window_size, heads=heads, dim_head=dim_head,
                         router_kwargs=router_kwargs, colt5_queries_per_window=colt5_queries_per_window)
            for _ in range(depth)
        )
        ops = COURSE_OPS if impl == "course_lib" else REFERENCE_OPS
        self.norm = Norm(dim, ops)
        self.to_logits = nn.Linear(dim, task.vocab)

    def forward(self, tokens):
        """tokens: (batch, n) integers below the task's vocab, n at most its seq_len (the
        values are not read back to be checked: that would wait for the GPU every step)."""
        if not isinstance(tokens, torch.Tensor):
            raise not_a_tensor("RecallModel", "tokens", tokens)
        if not isinstance(tokens, torch.Tensor) or tokens.ndim != 2 or tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"RecallModel: tokens must be an int64 or int32 tensor (batch, n), got "
                             f"{tokens.dtype if isinstance(tokens, torch.Tensor) else type(tokens).__name__} "
                             f"{tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else ''}")
        if tokens.shape[1] > self.seq_len:
            raise ValueError(f"RecallModel: tokens hold {tokens.shape[1]} positions, more than the task's "
                             f"seq_len ({self.seq_len}) the position embedding has")
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        return self.to_logits(self.norm(x))


class TrainingRun(NamedTuple):
    losses: list  # one a step
    accuracy: float  # of the values predicted on a fresh batch after training


def recall_loss_and_accuracy(model, tokens, targets):
    logits = model(tokens)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE)
    answered = targets != IGNORE
    accuracy = (logits.argmax(dim=-1)[answered] == targets[answered]).float().mean().item()
    return loss, accuracy


def train_recall(impl, task=RecallTask(), *, steps=200, batch=32, lr=3e-3, seed=0, device=DEVICE, dtype=torch.float32,
                 eval_batch=None, **model_kwargs):
    """Train a RecallModel of ``impl`` for ``steps`` AdamW steps on fresh batches.

    One seed sets the model's initial weights and every batch, so impls trained at the
    same seed see the same data.

    Args:
        impl (str): ``"course_lib"``, ``"reference"`` or ``"colt5_attention"``, as
            :class:`RecallModel` takes it.
        task (RecallTask): the task.
        steps, batch (int): AdamW steps, and sequences a step.
        lr (float): the learning rate.
        seed (int): the model's initial weights and every batch.
        device, dtype: where and in which dtype the model trains.
        eval_batch (int, optional): sequences of the accuracy's batch (``batch`` if None).
        **model_kwargs: go to RecallModel: sizes, ``architecture``, ``router_kwargs``.

    Shape:
        - Each step's batch: tokens and targets (batch, task.seq_len)

    Returns:
        TrainingRun: ``losses``, the loss of every step, and ``accuracy``, on a fresh
        batch after training.

    Example::

        >>> run = train_recall("reference", RecallTask(seq_len=64, n_pairs=2), steps=5, batch=4,
        ...                    dim=32, num_heavy_tokens=8)
        >>> len(run.losses)
        5
    """
    op = "train_recall"
    check_count(op, "steps", steps, least=0)
    check_count(op, "batch", batch)
    if eval_batch is not None:
        check_count(op, "eval_batch", eval_batch)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise TypeError(f"{op}: seed must be an int from 0 to 2**63 - 1, got {type(seed).__name__} {seed!r}")
    torch.manual_seed(seed)
    model = RecallModel(impl, task, **model_kwargs).to(device=device, dtype=dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        tokens, targets = recall_batch(task, batch, generator, device)
        loss, _ = recall_loss_and_accuracy(model, tokens, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())  # no .item() here: waiting for the GPU every step would idle it
    with torch.no_grad():
        _, accuracy = recall_loss_and_accuracy(model, *recall_batch(task, eval_batch or batch, generator, device))
    return TrainingRun(torch.stack(losses).tolist() if losses else [], accuracy)


def light_branch_reach(task, light_window_size, sequences=4000, seed=0):
    """The fraction of the recalled pairs whose value stands within the light attention
    of the query that asks for it (the query's window or the one before), over
    ``sequences`` sequences of ``recall_batch``. A model that solves exactly those and
    guesses the rest reaches an accuracy of reach + (1 - reach) / n_values."""
    tokens, targets = recall_batch(task, sequences, torch.Generator().manual_seed(seed))
    query_positions = (targets[0] != IGNORE).nonzero().flatten()  # the same in every sequence
    reach_from = (query_positions // light_window_size - 1) * light_window_size
    in_body = tokens[:, :task.seq_len - 2 * task.n_pairs]
    reached = 0
    for query, start in zip(query_positions.tolist(), reach_from.tolist()):
        key_position = (in_body == tokens[:, query, None]).int().argmax(dim=1)  # keys are distinct: one match
        reached += (key_position + 1 >= start).sum().item()
    return reached / (sequences * len(query_positions))


# ------------------------------------------------------------------ chapter 7's runs
# Chapter 7 trains three models from four seeds each, 3000 steps a run: too long to
# repeat whenever the notebook runs. benchmarks/train_recall.py trains them and stores
# their curves under results/training/, one file a GPU, which the chapter plots beside a
# short run of its own.

CHAPTER_TASK = RecallTask(seq_len=128, n_pairs=2)
CHAPTER_SETTINGS = dict(steps=3000, batch=32, eval_batch=1024, lr=3e-3, dim=64, depth=2, num_heavy_tokens=16,
                        light_window_size=8, heads=4, dim_head=16)
# The routed block (course_lib's kernels, router eps 1.0: soft weights over many tokens,
# so the loss reaches many router scores) beside its two baselines. One run is one
# sample: a rounding that decides a near tie in a top-k differently sends a run down
# another path, so each model is trained from four seeds (initial weights and batches).
CHAPTER_MODELS = {
    "routed": dict(impl="course_lib", router_kwargs=dict(eps=1.0)),
    "light only": dict(impl="course_lib", architecture="light"),
    "dense": dict(impl="course_lib", architecture="dense"),
}
CHAPTER_SEEDS = (0, 1, 2, 3)
CHAPTER_RUNS = {f"{model}, seed {seed}": dict(arguments, seed=seed)
                for model, arguments in CHAPTER_MODELS.items() for seed in CHAPTER_SEEDS}
TRAINING_RESULTS_DIR = RESULTS_DIR / "training"


def load_training_runs(results_dir=TRAINING_RESULTS_DIR):
    """Every stored file of chapter 7's runs, in file name order: {file stem: document}.

    A document holds the GPU, torch and Triton, the task and settings, and for each run
    its arguments, the loss of every step, the recall accuracy and the seconds it took.
    A folder without files gives {} (the chapter then says so)."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(results_dir.glob("*.json"))}


def colt5_with_layernorm(module):
    """A colt5-attention module with every RMSNorm replaced by a LayerNorm (the course's
    normalisation), so that the rest of it can be compared with course_lib's."""
    from colt5_attention.transformer_block import RMSNorm

    for name, child in module.named_children():
        if isinstance(child, RMSNorm):
            setattr(module, name, nn.LayerNorm(child.gamma.shape[0], device=child.gamma.device))
        else:
            colt5_with_layernorm(child)
    return module


def colt5_state_dict(state):
    """A course_lib module's state dict in colt5-attention's names: its routing token is (1, dim)."""
    return {name: t[None] if name.endswith("routing_token") else t for name, t in state.items()}
