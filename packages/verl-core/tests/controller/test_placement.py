"""Resource pools: split placement (roles on different pools, data flowing between them), groups sharing
a pool's bundles, and the errors for pools the cluster cannot hold."""

from __future__ import annotations

import os

import pytest
import ray
import torch
import torch.distributed as dist

from verl.core.controller import Dispatch, PlacementError, ResourcePool, Worker, WorkerGroup, register
from verl.core.protocol import DataProto


class Where(Worker):
    """Reports where it runs; scales a batch data-parallel."""

    def __init__(self, factor: float):
        self.factor = factor

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def where(self) -> dict:
        ctx = ray.get_runtime_context()
        return {
            "pid": os.getpid(),
            "placement_group": ctx.get_placement_group_id(),
            "cpu": ctx.get_assigned_resources().get("CPU"),
            "world": dist.get_world_size(),
        }

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def scale(self, data: DataProto) -> DataProto:
        total = torch.tensor([float(len(data))])
        dist.all_reduce(total)
        return DataProto.from_dict({"x": data.batch["x"] * self.factor, "padded_total": total.expand(len(data))})


@pytest.fixture(scope="module")
def pools(ray_local):
    shared = ResourcePool(process_on_nodes=[1], max_colocate_count=2)
    other = ResourcePool(process_on_nodes=[2])
    policy = WorkerGroup(shared, Where, 2.0, group_name="policy")
    critic = WorkerGroup(shared, Where, 3.0, group_name="critic")
    reward = WorkerGroup(other, Where, 5.0, group_name="reward")
    yield {"shared": shared, "other": other, "policy": policy, "critic": critic, "reward": reward}
    for group in (policy, critic, reward):
        group.shutdown()
    shared.shutdown()
    other.shutdown()


def test_split_placement_runs_roles_on_separate_pools_and_passes_data_between_them(pools):
    policy, reward = pools["policy"], pools["reward"]
    policy_where, reward_where = policy.where(), reward.where()
    assert {w["placement_group"] for w in policy_where}.isdisjoint({w["placement_group"] for w in reward_where})
    assert [w["world"] for w in policy_where] == [1] and [w["world"] for w in reward_where] == [2, 2]
    # dp 1 -> dp 2: the pending result is split remotely and each shard goes to the other pool's processes.
    out = reward.scale(policy.scale(DataProto.from_dict({"x": torch.arange(3.0)}))).get()
    torch.testing.assert_close(out.batch["x"], torch.arange(3.0) * 10)
    assert out.batch["padded_total"].tolist() == [4.0, 4.0, 4.0]  # 3 rows padded to 4 for dp 2


def test_groups_on_one_pool_share_its_bundles(pools):
    policy, critic = pools["policy"].where(), pools["critic"].where()
    assert [p["placement_group"] for p in policy] == [c["placement_group"] for c in critic]
    assert {p["pid"] for p in policy}.isdisjoint({c["pid"] for c in critic})
    assert {p["cpu"] for p in policy + critic} == {0.5}  # each takes 1 / max_colocate_count of a bundle


def test_a_pool_refuses_more_groups_than_max_colocate_count(pools):
    with pytest.raises(PlacementError, match="max_colocate_count=2"):
        WorkerGroup(pools["shared"], Where, 1.0)


def test_a_pool_larger_than_the_cluster_fails_at_once(ray_local):
    cpus = int(ray.cluster_resources()["CPU"])
    with pytest.raises(PlacementError, match=f"needs {cpus + 1} CPU but the Ray cluster has {cpus}"):
        ResourcePool(process_on_nodes=[cpus + 1]).slots()


def test_processes_sharing_a_node_are_counted_across_pools(pools):
    """The node's worker processes, for each one's torch threads: the shared pool's one process for each of
    its two groups, and the other pool's two."""
    from verl.core.controller.resource_pool import processes_on_node

    node = ray.get_runtime_context().get_node_id()
    assert processes_on_node(node) == 1 * 2 + 2
    assert processes_on_node("another-node") == 0
