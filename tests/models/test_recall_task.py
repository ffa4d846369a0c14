"""Chapter 6's recall task (course_lib/models/recall_task.py): bad sizes named. Its
batches and training runs are tested with the block, in tests/models/test_routed.py."""

import pytest
import torch

from course_lib.models.recall_task import RecallTask, recall_batch


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
