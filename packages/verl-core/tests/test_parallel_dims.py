"""ParallelDims: the sizes every engine's process groups come from, and the errors of impossible layouts."""

import pytest

from verl.core.parallel_dims import ParallelDims, ParallelLayoutError


def test_dp_shard_takes_what_the_other_dimensions_leave():
    dims = ParallelDims(world_size=16, tp=2, pp=2)
    assert dims.dp_shard == 4 and dims.dp == 4
    assert dims.sizes() == {"pp": 2, "dp_shard": 4, "tp": 2}


def test_hybrid_sharding_and_unused_dimensions():
    dims = ParallelDims(world_size=8, dp_replicate=2, dp_shard=4)
    assert dims.dp == 8
    assert dims.sizes() == {"dp_replicate": 2, "dp_shard": 4}
    assert ParallelDims(world_size=1).sizes() == {"dp_shard": 1}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"world_size": 6, "tp": 4}, "cannot be split"),
        ({"world_size": 8, "dp_shard": 3}, "must equal the number of ranks"),
        ({"world_size": 8, "tp": 0}, "tp=0 must be at least 1"),
        ({"world_size": 8, "ep": 3}, "ep=3 must divide dp_shard x cp = 8"),
    ],
)
def test_impossible_layouts_are_named(kwargs, message):
    with pytest.raises(ParallelLayoutError, match=message):
        ParallelDims(**kwargs)
