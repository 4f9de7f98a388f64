"""megatron's rank layout (order "tp-cp-ep-dp-pp") is ParallelDims' (pp outermost, tp innermost): the
groups megatron's RankGenerator builds are the groups ``mesh_group_ranks`` computes from ParallelDims,
for every rank of several layouts. (Each spawned megatron rank also checks its real groups at start.)"""

from __future__ import annotations

import pytest

from verl.engines.megatron.parallel import MEGATRON_ORDER, megatron_parallel_dims, mesh_group_ranks

pytestmark = pytest.mark.megatron


@pytest.mark.parametrize(("world", "tp", "pp", "cp"), [(8, 2, 2, 1), (8, 2, 1, 2), (16, 2, 2, 2), (4, 1, 4, 1)])
def test_megatron_groups_are_the_parallel_dims_groups(world, tp, pp, cp):
    from megatron.core.parallel_state import RankGenerator

    dims = megatron_parallel_dims(world, tp=tp, pp=pp, cp=cp)
    gen = RankGenerator(tp=tp, ep=1, dp=dims.dp, pp=pp, cp=cp, order=MEGATRON_ORDER)
    for name in ("tp", "pp", "dp", "cp"):
        megatron_groups = {tuple(g) for g in gen.get_ranks(name)}
        ours = {tuple(mesh_group_ranks(dims, rank)[name]) for rank in range(world)}
        assert ours == megatron_groups, name
