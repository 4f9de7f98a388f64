"""One 4-process group on real Ray actors with a real gloo process group: every dispatch mode runs a
collective, data-parallel dispatch of awkward batch sizes, failures on one rank, and chained
non-blocking calls whose data never comes back through the driver."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import ray
import torch
import torch.distributed as dist

from verl.core.controller import (
    Dispatch,
    Execute,
    GroupFuture,
    RankCall,
    ResourcePool,
    Worker,
    WorkerCallError,
    WorkerGroup,
    register,
    register_dispatch_mode,
)
from verl.core.controller.dispatch import Dispatched
from verl.core.protocol import DataProto

WORLD = 4
DRIVER_PID = os.getpid()  # shipped by value to the workers with this module


# -- a custom dispatch mode, added by registration ------------------------------------------------------
def _dispatch_rank_index(layout, args, kwargs):
    """Rank i gets ``args[0] * i``."""
    return Dispatched([RankCall((args[0] * i,)) for i in range(len(layout))])


def _collect_sum(layout, state, outputs):
    return sum(outputs)


register_dispatch_mode("scaled_by_rank_sum", _dispatch_rank_index, _collect_sum, override=True)


# -- an object that refuses to be unpickled in the driver ------------------------------------------------
def _rebuild_poison(driver_pid: int) -> DriverPoison:
    if os.getpid() == driver_pid:
        raise RuntimeError("a worker's data was deserialized in the driver")
    return DriverPoison(driver_pid)


class DriverPoison:
    def __init__(self, driver_pid: int):
        self.driver_pid = driver_pid

    def __reduce__(self):
        return (_rebuild_poison, (self.driver_pid,))


class MainWorker(Worker):
    def __init__(self, offset: float):
        self.offset = offset
        self.rank_zero_calls = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def setup_report(self) -> dict:
        return {
            "env": {
                k: os.environ[k]
                for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
            },
            "dist": (dist.get_rank(), dist.get_world_size(), dist.get_backend()),
            "worker": (self.rank, self.world_size, self.dp_rank, self.dp_size),
            "threads": torch.get_num_threads(),
        }

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce_plus_rank(self, x: float) -> float:
        t = torch.tensor([x + self.rank])
        dist.all_reduce(t)
        return t.item()

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def all_gather_items(self, item: int) -> list:
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, item)
        return gathered

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def broadcast_from_last(self, x: int) -> int:
        t = torch.tensor([x * 10 + self.rank])
        dist.broadcast(t, src=self.world_size - 1)
        return int(t.item()) + self.rank  # rank 0 returns the broadcast value unchanged

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def only_on_rank_zero(self) -> int:
        self.rank_zero_calls += 1
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def rank_zero_call_counts(self) -> int:
        return self.rank_zero_calls

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def shift(self, data: DataProto, n_samples: int = 1) -> DataProto:
        """Adds the offset; runs a collective over the shard sizes so each rank proves it has the same count."""
        sizes = [None] * self.world_size
        dist.all_gather_object(sizes, len(data))
        assert len(set(sizes)) == 1, f"data-parallel shards must have equal sizes after padding: {sizes}"
        data = data.repeat(n_samples, interleave=True)
        return DataProto.from_dict(
            {"y": data.batch["x"] + self.offset, "rank": torch.full((len(data),), self.rank)},
            non_tensors={"tag": data.non_tensor_batch["tag"]},
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, execute_mode=Execute.RANK_ZERO)
    def tag_rows_alone(self, data: DataProto) -> DataProto:
        return DataProto.from_dict(
            {"rank": torch.full((len(data),), self.rank), "dp_size": torch.full((len(data),), self.dp_size)}
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def shard_metrics(self, data: DataProto) -> dict:
        total = torch.tensor([float(len(data))])
        dist.all_reduce(total)
        return {"rows": len(data), "padded_total": int(total.item()), "dp_rank": self.dp_rank}

    @register(dispatch_mode="scaled_by_rank_sum")
    def times_world(self, x: int) -> int:
        t = torch.tensor([x])
        dist.all_reduce(t)
        return int(t.item())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_on_rank_one(self) -> int:
        if self.rank == 1:
            raise ValueError("boom on rank 1")
        return self.rank

    # -- chaining: the data these produce must never be deserialized in the driver ---------------------
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def produce(self, data: DataProto, driver_pid: int) -> DataProto:
        poison = np.array([DriverPoison(driver_pid) for _ in range(len(data))], dtype=object)
        return DataProto.from_dict(
            {"x": data.batch["x"] * 2, "rank": torch.full((len(data),), self.rank)},
            non_tensors={"poison": poison, "tag": data.non_tensor_batch["tag"]},
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def consume(self, data: DataProto) -> DataProto:
        assert all(isinstance(p, DriverPoison) for p in data.non_tensor_batch["poison"])
        return DataProto.from_dict(
            {
                "x": data.batch["x"] + 1,
                "producer_rank": data.batch["rank"],
                "rank": torch.full((len(data),), self.rank),
            },
            non_tensors={"tag": data.non_tensor_batch["tag"]},
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def consume_whole(self, data: DataProto) -> tuple:
        assert all(isinstance(p, DriverPoison) for p in data.non_tensor_batch["poison"])
        return len(data), float(data.batch["x"].sum())

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, blocking=False)
    def produce_per_rank(self, value: int, driver_pid: int) -> tuple:
        return (value + self.rank, DriverPoison(driver_pid))

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def consume_per_rank(self, item: tuple) -> int:
        value, poison = item
        assert isinstance(poison, DriverPoison)
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, value)
        return sum(gathered)


@pytest.fixture(scope="module")
def group(ray_local):
    pool = ResourcePool(process_on_nodes=[WORLD])
    wg = WorkerGroup(pool, MainWorker, 0.5)
    yield wg
    wg.shutdown()
    pool.shutdown()


def _batch(n: int) -> DataProto:
    return DataProto.from_dict(
        {"x": torch.arange(n, dtype=torch.float32)}, non_tensors={"tag": [f"row{i}" for i in range(n)]}
    )


def test_each_rank_is_set_up_with_env_process_group_and_threads(group):
    reports = group.setup_report()
    ports = {r["env"]["MASTER_PORT"] for r in reports}
    assert len(ports) == 1 and int(ports.pop()) > 0
    for rank, report in enumerate(reports):
        assert report["env"]["RANK"] == str(rank)
        assert report["env"]["WORLD_SIZE"] == str(WORLD)
        assert report["env"]["LOCAL_RANK"] == str(rank)  # one node
        assert report["env"]["LOCAL_WORLD_SIZE"] == str(WORLD)
        assert report["env"]["MASTER_ADDR"] == group.sites[0].node_ip
        assert report["dist"] == (rank, WORLD, "gloo")
        assert report["worker"] == (rank, WORLD, rank, WORLD)
        cores = len(os.sched_getaffinity(0))
        assert report["threads"] == max(1, cores // WORLD)  # the CPU platform's split of the cores


def test_one_to_all_runs_a_collective_on_every_rank(group):
    assert group.all_reduce_plus_rank(1.0) == [4 * 1.0 + 0 + 1 + 2 + 3] * WORLD


def test_all_to_all_gives_each_rank_its_item(group):
    assert group.all_gather_items([10, 11, 12, 13]) == [[10, 11, 12, 13]] * WORLD
    with pytest.raises(ValueError, match="has 3 items for 4 ranks"):
        group.all_gather_items([1, 2, 3])


def test_rank_zero_dispatch_runs_everywhere_and_returns_rank_zeros_result(group):
    # The broadcast only completes if every rank takes part; rank 0's value comes back.
    assert group.broadcast_from_last(7) == 7 * 10 + (WORLD - 1)


def test_execute_rank_zero_runs_only_rank_zero(group):
    before = group.rank_zero_call_counts()
    assert group.only_on_rank_zero() == [0]
    after = group.rank_zero_call_counts()
    assert [a - b for a, b in zip(after, before)] == [1, 0, 0, 0]


def test_execute_rank_zero_gives_a_dp_method_the_whole_batch(group):
    out = group.tag_rows_alone(_batch(5))
    assert out.batch["rank"].tolist() == [0] * 5
    assert out.batch["dp_size"].tolist() == [WORLD] * 5  # the worker's own layout is untouched


@pytest.mark.parametrize("n", [1, 3, 4, 6, 9])
def test_dp_compute_proto_pads_splits_and_concatenates_in_order(group, n):
    out = group.shift(_batch(n))
    assert len(out) == n
    torch.testing.assert_close(out.batch["y"], torch.arange(n, dtype=torch.float32) + 0.5)
    assert list(out.non_tensor_batch["tag"]) == [f"row{i}" for i in range(n)]
    per_shard = -(-n // WORLD)  # ceil: shards are equal after padding
    assert out.batch["rank"].tolist() == [i // per_shard for i in range(n)]


def test_dp_compute_proto_removes_padding_from_n_samples_per_row(group):
    n, samples = 5, 3
    out = group.shift(_batch(n), n_samples=samples)
    assert len(out) == n * samples
    torch.testing.assert_close(out.batch["y"], torch.arange(n, dtype=torch.float32).repeat_interleave(samples) + 0.5)


def test_dp_compute_metric_returns_one_result_per_dp_rank(group):
    metrics = group.shard_metrics(_batch(6))
    assert [m["dp_rank"] for m in metrics] == [0, 1, 2, 3]
    assert [m["rows"] for m in metrics] == [2, 2, 2, 2]  # 6 rows padded to 8
    assert all(m["padded_total"] == 8 for m in metrics)


def test_a_registered_custom_dispatch_mode_is_usable(group):
    assert Dispatch.SCALED_BY_RANK_SUM == "scaled_by_rank_sum"
    # rank i receives 3 * i; each all-reduces to 3 * (0+1+2+3) = 18; the collect sums the four answers.
    assert group.times_world(3) == 18 * WORLD


def test_an_exception_on_rank_one_reaches_the_driver_with_its_traceback(group):
    with pytest.raises(WorkerCallError) as info:
        group.fail_on_rank_one()
    error = info.value
    assert error.rank == 1 and error.role == "MainWorker"
    message = str(error)
    assert "rank 1" in message and group.sites[1].node_ip in message and str(group.sites[1].pid) in message
    assert "fail_on_rank_one" in error.remote_traceback and "boom on rank 1" in error.remote_traceback
    assert isinstance(error.__cause__, ValueError)
    # Nothing collective was broken: the group keeps working.
    assert group.all_reduce_plus_rank(0.0) == [6.0] * WORLD


def test_the_poison_used_below_really_refuses_the_driver():
    with pytest.raises(RuntimeError, match="deserialized in the driver"):
        pickle.loads(pickle.dumps(DriverPoison(os.getpid())))


@pytest.mark.parametrize("n", [4, 7])
def test_dp_future_feeds_the_next_dp_call_shard_by_shard(group, n):
    future = group.produce(_batch(n), driver_pid=DRIVER_PID)
    assert isinstance(future, GroupFuture)
    out = group.consume(future)
    assert len(out) == n
    torch.testing.assert_close(out.batch["x"], torch.arange(n, dtype=torch.float32) * 2 + 1)
    # Same data-parallel layout: each shard went straight from producer rank d to consumer rank d.
    assert torch.equal(out.batch["producer_rank"], out.batch["rank"])
    assert list(out.non_tensor_batch["tag"]) == [f"row{i}" for i in range(n)]


def test_dp_future_feeds_a_one_to_all_call_materialized_remotely(group):
    future = group.produce(_batch(5), driver_pid=DRIVER_PID)
    assert group.consume_whole(future) == [(5, float(sum(range(5)) * 2))] * WORLD


def test_per_rank_future_feeds_the_next_all_to_all_call_rank_to_rank(group):
    future = group.produce_per_rank([1, 2, 3, 4], driver_pid=[DRIVER_PID] * WORLD)
    assert group.consume_per_rank(future) == [sum(v + r for r, v in enumerate([1, 2, 3, 4]))] * WORLD


def test_submit_returns_a_future_whose_get_collects(group):
    future = group.shift.submit(_batch(3))
    out = future.get()
    assert future.done()
    torch.testing.assert_close(out.batch["y"], torch.arange(3, dtype=torch.float32) + 0.5)


def test_an_object_ref_to_a_dataproto_is_split_remotely(group):
    out = group.shift(ray.put(_batch(6)))
    torch.testing.assert_close(out.batch["y"], torch.arange(6, dtype=torch.float32) + 0.5)
