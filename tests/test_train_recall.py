"""benchmarks/train_recall.py: chapter 7's training runs, stored and merged, on a tiny task."""

import json

import pytest

from benchmarks import train_recall
from course_lib.models.recall_task import CHAPTER_RUNS, RecallTask, load_training_runs

TINY_TASK = RecallTask(seq_len=32, n_pairs=2, n_noise=8, n_keys=4, n_values=4)
TINY_SETTINGS = dict(steps=2, batch=4, eval_batch=6, dim=16, depth=1, num_heavy_tokens=8, light_window_size=8,
                     heads=2, dim_head=8)


@pytest.fixture(scope="module")
def documents():
    """Two files, as a GPU host with minutes a command writes them: the first two runs, then the rest."""
    names = list(CHAPTER_RUNS)
    return [train_recall.train_runs(part, TINY_TASK, TINY_SETTINGS) for part in (names[:2], names[2:])]


def test_every_run_of_the_chapter_trains_and_is_stored(documents, tmp_path):
    paths = [train_recall.write(document, tmp_path / f"part{i}.json") for i, document in enumerate(documents)]
    merged = train_recall.write(train_recall.merge(reversed(paths)), tmp_path / "training" / "cpu.json")
    stored = load_training_runs(merged.parent)["cpu"]
    assert list(stored["runs"]) == list(CHAPTER_RUNS)  # the chapter's order, whatever the files' order
    assert stored["task"] == TINY_TASK._asdict() and stored["settings"] == TINY_SETTINGS
    assert 0.0 <= stored["light_branch_reach"] <= 1.0
    for name, run in stored["runs"].items():
        assert run["arguments"] == json.loads(json.dumps(CHAPTER_RUNS[name]))
        assert len(run["losses"]) == TINY_SETTINGS["steps"] and all(loss > 0 for loss in run["losses"])
        assert 0.0 <= run["accuracy"] <= 1.0 and run["seconds"] > 0


def test_merge_refuses_runs_of_other_settings(documents, tmp_path):
    other = dict(documents[1], settings=dict(TINY_SETTINGS, steps=3))
    paths = [train_recall.write(document, tmp_path / f"{i}.json") for i, document in enumerate((documents[0], other))]
    with pytest.raises(SystemExit, match="one GPU, torch, triton, task and settings"):
        train_recall.merge(paths)


def test_no_stored_runs_is_an_empty_answer(tmp_path):
    assert load_training_runs(tmp_path) == {}


def test_the_command_line_merges_and_names_what_it_cannot_train(documents, tmp_path, capsys):
    paths = [train_recall.write(document, tmp_path / f"{i}.json") for i, document in enumerate(documents)]
    train_recall.main(["--merge", *map(str, paths), "--out", str(tmp_path / "merged.json")])
    assert f"wrote {tmp_path / 'merged.json'}" in capsys.readouterr().out
    assert list(load_training_runs(tmp_path)["merged"]["runs"]) == list(CHAPTER_RUNS)
    # Run names are checked before anything trains, the GPU included.
    with pytest.raises(SystemExit, match=r"unknown runs \['routed, seed 9'\]; choose from"):
        train_recall.main(["--only", "routed, seed 0; routed, seed 9"])
