"""Two simulated nodes (``ray.cluster_utils.Cluster``): one group placed across both, joined through
``init_ray(address=...)`` like a real cluster, with the driver's VERL_* environment reaching the workers."""

from __future__ import annotations

import os

import pytest
import ray
import torch
import torch.distributed as dist
from ray.cluster_utils import Cluster

from verl.core.controller import Dispatch, PlacementError, ResourcePool, Worker, WorkerGroup, init_ray, register
from verl.core.protocol import DataProto

CPUS_PER_NODE = 1


class NodeReport(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def report(self) -> dict:
        t = torch.tensor([float(self.rank)])
        dist.all_reduce(t)  # across both nodes
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "local_rank": self.local_rank,
            "local_world_size": self.local_world_size,
            "sum_of_ranks": t.item(),
            "marker": os.environ.get("VERL_TEST_CONTROLLER_MARKER"),
        }

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def negate(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"x": -data.batch["x"]})


@pytest.fixture(scope="module")
def two_nodes():
    if ray.is_initialized():
        ray.shutdown()  # the shared local session; the next module starts it again
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": CPUS_PER_NODE, "include_dashboard": False})
    cluster.add_node(num_cpus=CPUS_PER_NODE)
    cluster.wait_for_nodes()
    # Set after the nodes started, so only init_ray's runtime environment can bring it to the workers.
    os.environ["VERL_TEST_CONTROLLER_MARKER"] = "from-the-driver"
    try:
        init_ray(address=cluster.address)
        yield cluster
    finally:
        del os.environ["VERL_TEST_CONTROLLER_MARKER"]
        ray.shutdown()
        cluster.shutdown()


def test_one_group_spans_two_nodes(two_nodes):
    pool = ResourcePool(process_on_nodes=[CPUS_PER_NODE, CPUS_PER_NODE])
    group = WorkerGroup(pool, NodeReport)
    try:
        reports = group.report()
        nodes = [r["node_id"] for r in reports]
        assert len(set(nodes)) == 2
        assert [s.node_id for s in group.sites] == nodes
        assert [r["local_rank"] for r in reports] == [0, 0]
        assert {r["local_world_size"] for r in reports} == {1}
        assert {r["sum_of_ranks"] for r in reports} == {1.0}
        assert {r["marker"] for r in reports} == {"from-the-driver"}
        out = group.negate(DataProto.from_dict({"x": torch.arange(5.0)}))
        torch.testing.assert_close(out.batch["x"], -torch.arange(5.0))
    finally:
        group.shutdown()
        pool.shutdown()


def test_an_entry_larger_than_any_node_fails_at_once(two_nodes):
    with pytest.raises(PlacementError, match="largest node has 1 CPU"):
        ResourcePool(process_on_nodes=[2]).slots()
