"""megatron's process groups, laid out as :class:`verl.core.parallel_dims.ParallelDims` lays out ranks.

``ParallelDims`` orders ranks ``pp`` outermost, then data parallel (``dp_replicate``, ``dp_shard``), ``cp``,
and ``tp`` innermost. megatron's default ``order="tp-cp-ep-dp-pp"`` lists dimensions innermost first: the
same layout (TP peers are neighbours, pipeline stages are the slowest-varying index). So
``initialize_model_parallel`` with the ParallelDims sizes builds exactly the mesh's groups;
:func:`initialize_megatron_parallel` checks that, group by group, instead of trusting it.

Data parallelism for megatron is one flat dimension (``dp_replicate x dp_shard``): megatron shards the
optimizer over it (distributed optimizer) rather than FSDP-sharding parameters.
"""

from __future__ import annotations

import torch.distributed as dist

from verl.core.parallel_dims import ParallelDims

#: megatron's rank order, innermost dimension first; the same as ParallelDims.MESH_ORDER reversed.
MEGATRON_ORDER = "tp-cp-ep-dp-pp"


def megatron_parallel_dims(world_size: int, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1) -> ParallelDims:
    """The mesh of a megatron layout: data parallelism is whatever TP x PP x CP leave."""
    return ParallelDims(world_size=world_size, tp=tp, pp=pp, cp=cp, ep=ep)


def initialize_megatron_parallel(dims: ParallelDims, vpp: int | None = None) -> None:
    """megatron's ``parallel_state`` for ``dims`` over the default process group (already initialised),
    checked against the ``ParallelDims`` mesh. Idempotent for the same layout."""
    from megatron.core import parallel_state as mpu

    if mpu.model_parallel_is_initialized():
        if (mpu.get_tensor_model_parallel_world_size(), mpu.get_pipeline_model_parallel_world_size()) != (
            dims.tp,
            dims.pp,
        ):
            raise RuntimeError(
                "megatron's parallel state is already initialised with a different layout "
                f"(tp={mpu.get_tensor_model_parallel_world_size()}, pp={mpu.get_pipeline_model_parallel_world_size()}) "
                f"than asked (tp={dims.tp}, pp={dims.pp}); one process runs one megatron layout"
            )
        return
    mpu.initialize_model_parallel(
        tensor_model_parallel_size=dims.tp,
        pipeline_model_parallel_size=dims.pp,
        virtual_pipeline_model_parallel_size=vpp,
        context_parallel_size=dims.cp,
        expert_model_parallel_size=dims.ep,
        order=MEGATRON_ORDER,
    )
    check_groups_match(dims)


def mesh_group_ranks(dims: ParallelDims, rank: int) -> dict[str, list[int]]:
    """For ``rank``: the ranks of its tp, cp, dp and pp groups in the ParallelDims layout (computed from
    the layout, no collective)."""
    sizes = {"pp": dims.pp, "dp": dims.dp, "cp": dims.cp, "tp": dims.tp}  # outermost first
    names = list(sizes)
    coords, rest = {}, rank
    for name in reversed(names):  # innermost varies fastest
        coords[name], rest = rest % sizes[name], rest // sizes[name]

    def rank_of(c: dict[str, int]) -> int:
        r = 0
        for name in names:
            r = r * sizes[name] + c[name]
        return r

    return {name: [rank_of({**coords, name: i}) for i in range(sizes[name])] for name in names}


def check_groups_match(dims: ParallelDims) -> None:
    """Raise if megatron's groups for this rank differ from the ParallelDims layout."""
    from megatron.core import parallel_state as mpu

    expected = mesh_group_ranks(dims, dist.get_rank())
    actual = {
        "tp": dist.get_process_group_ranks(mpu.get_tensor_model_parallel_group()),
        "pp": dist.get_process_group_ranks(mpu.get_pipeline_model_parallel_group()),
        "dp": dist.get_process_group_ranks(mpu.get_data_parallel_group()),
        "cp": dist.get_process_group_ranks(mpu.get_context_parallel_group()),
    }
    wrong = {name: (actual[name], expected[name]) for name in expected if sorted(actual[name]) != expected[name]}
    if wrong:
        raise RuntimeError(
            f"megatron's process groups differ from the ParallelDims layout on rank {dist.get_rank()}: "
            + ", ".join(f"{name}: megatron {a} vs mesh {e}" for name, (a, e) in wrong.items())
        )


def destroy_megatron_parallel() -> None:
    from megatron.core import parallel_state as mpu

    mpu.destroy_model_parallel()
