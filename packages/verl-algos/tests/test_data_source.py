import os

import pytest

from verl.algos.data.source import ResumableBatchOrder, resolve_files


def test_builtin_task_is_generated_once_with_disjoint_splits(tmp_path):
    import pyarrow.parquet as pq

    train = resolve_files(["builtin:arithmetic"], "train", {"seed": 1}, str(tmp_path))
    val = resolve_files(["builtin:arithmetic"], "test", {"seed": 1}, str(tmp_path))
    assert os.path.dirname(train[0]) == os.path.dirname(val[0])
    mtime = os.path.getmtime(train[0])
    assert resolve_files(["builtin:arithmetic"], "train", {"seed": 1}, str(tmp_path)) == train
    assert os.path.getmtime(train[0]) == mtime  # cached, not regenerated
    other = resolve_files(["builtin:arithmetic"], "train", {"seed": 2}, str(tmp_path))
    assert other != train  # different options, different folder
    questions = lambda path: {row["prompt"][0]["content"] for row in pq.read_table(path).to_pylist()}  # noqa: E731
    assert not questions(train[0]) & questions(val[0])


def test_missing_file_and_unknown_task_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_files([str(tmp_path / "nope.parquet")], "train", {}, str(tmp_path))
    with pytest.raises(ValueError, match="built-in tasks: arithmetic"):
        resolve_files(["builtin:chess"], "train", {}, str(tmp_path))


def test_batch_order_resumes_exactly():
    full = ResumableBatchOrder(dataset_size=10, batch_size=3, seed=7)
    uninterrupted = [full.next_batch() for _ in range(7)]
    first = ResumableBatchOrder(dataset_size=10, batch_size=3, seed=7)
    head = [first.next_batch() for _ in range(4)]
    resumed = ResumableBatchOrder(dataset_size=10, batch_size=3, seed=7)
    resumed.load_state_dict(first.state_dict())
    assert head + [resumed.next_batch() for _ in range(3)] == uninterrupted
    # three batches per epoch, epochs reshuffle, indices within an epoch never repeat
    assert sorted(sum(uninterrupted[:3], [])) == sorted(set(sum(uninterrupted[:3], [])))
    assert uninterrupted[:3] != uninterrupted[3:6]


def test_batch_larger_than_dataset_is_an_error():
    with pytest.raises(ValueError, match="fewer than data.train_batch_size=8"):
        ResumableBatchOrder(dataset_size=5, batch_size=8)
