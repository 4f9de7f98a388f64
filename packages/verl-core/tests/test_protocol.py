import pickle

import numpy as np
import pytest
import torch

from verl.core.protocol import DataProto


def make(n=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return DataProto.from_dict(
        tensors={"ids": torch.randint(0, 100, (n, 4), generator=g), "mask": torch.ones(n, 4)},
        non_tensors={"uid": [f"u{i}" for i in range(n)], "gt": [{"x": i} for i in range(n)]},
        meta_info={"temperature": 0.7},
    )


def assert_same(a: DataProto, b: DataProto):
    assert len(a) == len(b)
    assert sorted(a.batch.keys()) == sorted(b.batch.keys())
    for k in a.batch.keys():
        assert torch.equal(a.batch[k], b.batch[k])
    assert a.non_tensor_batch.keys() == b.non_tensor_batch.keys()
    for k in a.non_tensor_batch:
        assert list(a.non_tensor_batch[k]) == list(b.non_tensor_batch[k])
    assert a.meta_info == b.meta_info


def test_from_dict_and_len_and_inconsistent_sizes():
    d = make()
    assert len(d) == 5
    assert d.non_tensor_batch["uid"].dtype == object
    with pytest.raises(ValueError, match="disagree on the batch size"):
        DataProto.from_dict({"a": torch.zeros(2), "b": torch.zeros(3)})
    with pytest.raises(ValueError, match="has 3 rows, the batch has 2"):
        DataProto.from_dict({"a": torch.zeros(2)}, {"x": [1, 2, 3]})


def test_indexing_keeps_tensors_and_non_tensors_in_step():
    d = make()
    sub = d[[4, 0]]
    assert torch.equal(sub.batch["ids"], d.batch["ids"][[4, 0]])
    assert list(sub.non_tensor_batch["uid"]) == ["u4", "u0"]
    assert list(d[1:3].non_tensor_batch["uid"]) == ["u1", "u2"]
    assert list(d[torch.tensor([True, False, True, False, False])].non_tensor_batch["uid"]) == ["u0", "u2"]
    assert len(d[2]) == 1 and d[-1].non_tensor_batch["uid"][0] == "u4"


def test_split_chunk_concat_round_trip():
    d = make(7)
    assert [len(p) for p in d.split(3)] == [3, 3, 1]
    assert_same(DataProto.concat(d.split(3)), d)
    with pytest.raises(ValueError, match="pad with pad_to_divisor"):
        d.chunk(2)
    padded, pad = d.pad_to_divisor(4)
    assert (len(padded), pad) == (8, 1)
    chunks = padded.chunk(4)
    assert all(len(c) == 2 for c in chunks)
    assert_same(DataProto.concat(chunks).unpad(pad), d)
    # padding rows repeat real rows
    assert torch.equal(padded.batch["ids"][7], d.batch["ids"][0])
    assert d.pad_to_divisor(7) == (d, 0)


def test_repeat_interleaved_and_tiled():
    d = make(2)
    inter = d.repeat(3, interleave=True)
    assert list(inter.non_tensor_batch["uid"]) == ["u0", "u0", "u0", "u1", "u1", "u1"]
    tiled = d.repeat(2, interleave=False)
    assert list(tiled.non_tensor_batch["uid"]) == ["u0", "u1", "u0", "u1"]
    assert torch.equal(inter.batch["ids"][2], d.batch["ids"][0])


def test_select_pop_union_rename_reorder():
    d = make()
    s = d.select(batch_keys=["ids"], non_tensor_batch_keys=["uid"])
    assert list(s.batch.keys()) == ["ids"] and list(s.non_tensor_batch) == ["uid"]
    popped = d.pop(batch_keys=["mask"], non_tensor_batch_keys=["gt"])
    assert "mask" not in d.batch.keys() and "gt" not in d.non_tensor_batch
    d.union(popped)
    assert "mask" in d.batch.keys() and "gt" in d.non_tensor_batch
    other = make()
    other.batch["ids"] = other.batch["ids"] + 1
    with pytest.raises(ValueError, match="tensor 'ids' differs"):
        d.union(other)
    d.rename("mask", "attention_mask")
    assert "attention_mask" in d.batch.keys()
    with pytest.raises(KeyError, match="no field 'nope'"):
        d.rename("nope", "x")
    before = d.batch["ids"].clone()
    d.reorder(torch.tensor([4, 3, 2, 1, 0]))
    assert torch.equal(d.batch["ids"], before.flip(0))
    assert list(d.non_tensor_batch["uid"]) == ["u4", "u3", "u2", "u1", "u0"]


def test_non_tensor_only_and_empty_errors():
    d = DataProto.from_dict(non_tensors={"x": np.array([1, 2, 3], dtype=object)})
    assert len(d) == 3 and len(d.split(2)) == 2
    with pytest.raises(ValueError, match="empty batch"):
        DataProto().pad_to_divisor(2)
    with pytest.raises(ValueError, match="nothing to concatenate"):
        DataProto.concat([])
    with pytest.raises(KeyError, match="no tensors to pop"):
        d.pop(batch_keys=["ids"])
    assert d.keys() == ["x"] and d.pop(non_tensor_batch_keys=["x"]).keys() == ["x"]


def test_pickle_round_trip():
    d = make()
    assert_same(pickle.loads(pickle.dumps(d)), d)


def test_ray_object_store_round_trip():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        d = make(64)

        @ray.remote
        def double(batch: DataProto) -> DataProto:
            batch.batch["mask"] = batch.batch["mask"] * 2
            return batch

        back = ray.get(double.remote(ray.put(d)))
        assert torch.equal(back.batch["mask"], d.batch["mask"] * 2)
        assert torch.equal(back.batch["ids"], d.batch["ids"])
        assert list(back.non_tensor_batch["gt"]) == list(d.non_tensor_batch["gt"])
        assert back.meta_info == d.meta_info
    finally:
        ray.shutdown()


def test_tensors_is_the_batch_or_an_error_naming_the_fields():
    data = DataProto.from_dict({"x": torch.zeros(2, 3)}, non_tensors={"uid": ["a", "b"]})
    assert data.tensors is data.batch
    with pytest.raises(KeyError, match="no tensors.*uid"):
        _ = DataProto.from_dict(non_tensors={"uid": ["a", "b"]}).tensors
