"""Roles fused into one process per slot, and a model-parallel layout: world 4 = dp 2 x tp 2.

The "actor" role builds tensor-parallel groups and reports its data-parallel coordinates; the "ref" role
in the same processes stays purely data parallel. Both share the process and its process group."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from verl.core.controller import Dispatch, ResourcePool, Worker, WorkerCallError, WorkerGroup, register
from verl.core.protocol import DataProto

WORLD, TP = 4, 2


class TensorParallelActor(Worker):
    def __init__(self, tp: int):
        self.tp = tp
        # Every rank creates every subgroup, in the same order (torch.distributed's rule).
        groups = [dist.new_group(list(range(s, s + tp))) for s in range(0, self.world_size, tp)]
        self.tp_group = groups[self.rank // tp]
        self.tp_rank = self.rank % tp
        self.set_dp_info(dp_rank=self.rank // tp, dp_size=self.world_size // tp, is_collect=self.tp_rank == 0)
        self.calls = 0

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def forward(self, data: DataProto) -> DataProto:
        self.calls += 1
        # Both ranks of a tensor-parallel group must hold the same shard: compare through the tp group.
        mine = torch.tensor([data.batch["x"].sum().item(), float(len(data))])
        theirs = [torch.zeros(2) for _ in range(self.tp)]
        dist.all_gather(theirs, mine, group=self.tp_group)
        if self.dp_size < self.world_size:  # tensor parallel in use
            assert all(torch.equal(t, mine) for t in theirs), f"tp group saw different shards: {theirs}"
        return DataProto.from_dict(
            {
                "y": data.batch["x"] * 10,
                "rank": torch.full((len(data),), self.rank),
                "dp_rank": torch.full((len(data),), self.dp_rank),
            }
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def forward_async(self, data: DataProto) -> DataProto:
        return self.forward(data)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def process(self) -> tuple:
        return os.getpid(), id(dist.group.WORLD), self.calls

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def use_tensor_parallel(self, enabled: bool) -> None:
        if enabled:
            self.set_dp_info(
                dp_rank=self.rank // self.tp, dp_size=self.world_size // self.tp, is_collect=self.tp_rank == 0
            )
        else:
            self.set_dp_info(dp_rank=self.rank, dp_size=self.world_size, is_collect=True)


class ReferenceModel(Worker):
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref(self, data: DataProto) -> DataProto:
        total = torch.tensor([float(len(data))])
        dist.all_reduce(total)  # the shared default process group serves this role too
        return DataProto.from_dict(
            {"y": data.batch["y"] + 1, "rank": torch.full((len(data),), self.rank), "seen": total.expand(len(data))}
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def process(self) -> tuple:
        return os.getpid(), id(dist.group.WORLD), self.dp_size


@pytest.fixture(scope="module")
def fused(ray_local):
    pool = ResourcePool(process_on_nodes=[WORLD])
    wg = WorkerGroup.colocated(pool, {"actor": (TensorParallelActor, (), {"tp": TP}), "ref": ReferenceModel})
    yield wg
    wg.shutdown()
    pool.shutdown()


def _batch(n: int) -> DataProto:
    return DataProto.from_dict({"x": torch.arange(n, dtype=torch.float32)})


def test_roles_share_each_process_and_its_process_group(fused):
    actor = fused.actor.process()
    ref = fused.ref.process()
    assert [a[:2] for a in actor] == [r[:2] for r in ref]
    assert len({a[0] for a in actor}) == WORLD
    assert sorted(fused.roles) == ["actor", "ref"]
    assert [r[2] for r in ref] == [WORLD] * WORLD  # ref stays purely data parallel


@pytest.mark.parametrize("n", [2, 5, 8])
def test_dp_dispatch_sends_each_shard_to_a_whole_tp_group_and_collects_one(fused, n):
    before = [c for _, _, c in fused.actor.process()]
    out = fused.actor.forward(_batch(n))
    assert len(out) == n
    torch.testing.assert_close(out.batch["y"], torch.arange(n, dtype=torch.float32) * 10)
    per_shard = -(-n // (WORLD // TP))
    assert out.batch["dp_rank"].tolist() == [i // per_shard for i in range(n)]
    assert set(out.batch["rank"].tolist()) <= {0, 2}  # collected from tp rank 0 of each group
    after = [c for _, _, c in fused.actor.process()]
    assert [a - b for a, b in zip(after, before)] == [1] * WORLD  # every rank computed


def test_a_future_of_dp_two_feeds_a_role_of_dp_four(fused):
    pending = fused.actor.forward_async(_batch(7))
    out = fused.ref.compute_ref(pending)  # resharded remotely: 7 rows, padded to 8 for dp 4
    torch.testing.assert_close(out.batch["y"], torch.arange(7, dtype=torch.float32) * 10 + 1)
    assert out.batch["rank"].tolist() == [0, 0, 1, 1, 2, 2, 3]
    assert set(out.batch["seen"].tolist()) == {8.0}


def test_a_layout_changed_behind_the_drivers_back_is_refused_until_refreshed(fused):
    fused.actor.forward(_batch(4))  # the driver has cached dp 2 x tp 2
    fused.actor.use_tensor_parallel(False)
    try:
        with pytest.raises(WorkerCallError, match="set_dp_info was called after the group cached"):
            fused.actor.forward(_batch(4))
        fused.refresh_dp_layout()
        out = fused.actor.forward(_batch(4))
        assert out.batch["dp_rank"].tolist() == [0, 1, 2, 3]
    finally:
        fused.actor.use_tensor_parallel(True)
        fused.refresh_dp_layout()
