"""Chapter 7's recall task (course_lib/models/recall_task.py): bad sizes named, the
baselines causal, every architecture trains. Its batches and the routed block's training
are tested with the block, in tests/models/test_routed.py."""

import pytest
import torch

from course_lib.core.runtime import DEVICE
from course_lib.models.recall_task import ARCHITECTURES, RecallModel, RecallTask, recall_batch, recall_block, train_recall


@pytest.mark.parametrize("field", RecallTask._fields)
def test_a_task_with_nothing_of_one_kind_is_refused_by_name(field):
    with pytest.raises(ValueError, match=rf"recall_batch: RecallTask.{field} must be at least 1, got 0"):
        recall_batch(RecallTask()._replace(**{field: 0}), 2, torch.Generator().manual_seed(0))


def test_sizes_must_be_ints():
    with pytest.raises(TypeError, match="RecallTask.n_pairs must be an int, got float"):
        recall_batch(RecallTask(n_pairs=2.0), 2, torch.Generator().manual_seed(0))


def test_a_sequence_too_short_for_its_pairs_says_what_it_needs():
    with pytest.raises(ValueError, match=r"needs seq_len >= 4 \* n_pairs and n_keys >= n_pairs"):
        recall_batch(RecallTask(seq_len=12, n_pairs=4), 2, torch.Generator().manual_seed(0))


# The two baselines chapter 7 trains beside the routed block: both causal.
@pytest.mark.parametrize("architecture", ["light", "dense"])
def test_the_baseline_blocks_are_causal(architecture):
    block = recall_block(architecture, "course_lib", 16, num_heavy_tokens=4, seq_len=29, light_window_size=8,
                         heads=2, dim_head=8).to(DEVICE)
    x = torch.randn(2, 29, 16, device=DEVICE)
    for t in (0, 11, 27):
        changed = x.clone()
        changed[:, t + 1:] = torch.randn_like(changed[:, t + 1:]) * 3
        with torch.no_grad():
            before, after = block(x), block(changed)
        torch.testing.assert_close(after[:, :t + 1], before[:, :t + 1], rtol=1e-6, atol=1e-6)
        assert not torch.allclose(after[:, t + 1:], before[:, t + 1:])


def test_a_model_of_each_architecture_trains():
    task = RecallTask(seq_len=32, n_pairs=2, n_noise=8, n_keys=4, n_values=4)
    sizes = dict(steps=2, batch=4, dim=16, depth=1, num_heavy_tokens=8, light_window_size=8, heads=2, dim_head=8)
    for architecture in ARCHITECTURES:
        run = train_recall("course_lib", task, architecture=architecture, **sizes)
        assert len(run.losses) == 2 and 0.0 <= run.accuracy <= 1.0
    light = RecallModel("course_lib", task, architecture="light", dim=16, depth=1, heads=2, dim_head=8)
    assert not any("router" in name for name, _ in light.named_modules())


def test_an_unknown_architecture_is_named():
    with pytest.raises(ValueError, match="architecture must be one of routed, light, dense; got 'moe'"):
        RecallModel("course_lib", RecallTask(), architecture="moe")
    with pytest.raises(ValueError, match="not colt5_attention's"):
        RecallModel("colt5_attention", RecallTask(), architecture="dense")


SMALL_TASK = RecallTask(seq_len=32, n_pairs=2)


@pytest.mark.parametrize("call, error, match", [
    (lambda g: recall_batch(SMALL_TASK, -1, g), ValueError, "recall_batch: batch must be at least 1, got -1"),
    (lambda g: recall_batch(SMALL_TASK, 2.0, g), TypeError, "recall_batch: batch must be an int, got float"),
    (lambda g: recall_batch(SMALL_TASK, True, g), TypeError, "recall_batch: batch must be an int, got bool"),
    (lambda g: recall_batch((32, 2), 2, g), TypeError, "recall_batch: task must be a RecallTask, got tuple"),
    (lambda g: recall_batch(SMALL_TASK, 2, 0), TypeError, "recall_batch: generator must be a torch.Generator or None"),
    (lambda g: RecallModel("reference", RecallTask(seq_len=0)), ValueError,
     "RecallModel: RecallTask.seq_len must be at least 1, got 0"),
    (lambda g: train_recall("reference", SMALL_TASK, steps=-1), ValueError, "train_recall: steps must be at least 0"),
    (lambda g: train_recall("reference", SMALL_TASK, batch=0), ValueError, "train_recall: batch must be at least 1"),
    (lambda g: train_recall("reference", SMALL_TASK, seed=1.5), TypeError, "train_recall: seed must be an int"),
    (lambda g: RecallModel("reference", SMALL_TASK, num_heavy_tokens=100), ValueError,
     r"RecallModel: num_heavy_tokens \(100\) must be at most the task's seq_len \(32\)"),
], ids=["negative batch", "float batch", "bool batch", "tuple task", "int generator", "no sequence", "negative steps",
        "empty batch", "float seed", "more heavy tokens than tokens"])
def test_task_helpers_refuse_bad_arguments_naming_them(call, error, match):
    with pytest.raises(error, match=match):
        call(torch.Generator().manual_seed(0))


def test_model_refuses_tokens_it_has_no_embedding_for():
    model = RecallModel("reference", SMALL_TASK, dim=16, num_heavy_tokens=4, light_window_size=4, heads=2, dim_head=8)
    with pytest.raises(ValueError, match=r"tokens hold 40 positions, more than the task's seq_len \(32\)"):
        model(torch.zeros(1, 40, dtype=torch.long))
    for dtype in (torch.float32, torch.bool, torch.uint8, torch.complex64):
        with pytest.raises(ValueError, match=f"tokens must be an int64 or int32 tensor \\(batch, n\\), got {dtype}"):
            model(torch.zeros(1, 4, dtype=dtype))
