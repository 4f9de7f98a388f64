"""Where a full megatron tensor lives on a TP x PP layout, and how to cut it and put it back together.

Tensor parallelism (``Rule.split``):
- ``none``: replicated on every TP rank (norms).
- ``qkv``: column-parallel by whole query groups: TP contiguous chunks of the fused tensor (rows).
- ``gate_up``: column-parallel, gate and up split separately; rank r holds ``[gate_r; up_r]``.
- ``row``: row-parallel linear (``linear_proj``, ``linear_fc2``): split along the input dimension (dim 1).
- ``vocab``: vocabulary-parallel embedding / output layer: TP contiguous chunks of the padded rows.

Expert parallelism: the routed experts of each MoE layer are split evenly over the EP ranks, EP rank ``e``
holding experts ``e * E/ep ...`` as its ``local_experts.0 ...`` (:func:`expert_owner`); everything else is
replicated over EP. An expert's matrices are split like a dense MLP's over the expert tensor-parallel
ranks, which this engine keeps equal to the TP ranks (megatron's default ``expert_tensor_parallel_size``).

Pipeline parallelism: the layers are split evenly over stages (and, with virtual stages, into
``pp * vpp`` contiguous chunks, chunk ``v * pp + p`` on stage p as its v-th model chunk, megatron's
interleaved order). The embedding is on the first stage, the final norm and output layer on the last; a
tied output layer exists as its own tensor only on a last stage that is not also the first.
"""

from __future__ import annotations

import torch

from verl.engines.megatron.convert import EMBEDDING, FINAL_NORM, LAYER_PREFIX, OUTPUT_BIAS, OUTPUT_LAYER, Rule
from verl.engines.megatron.model_config import ModelShape


def split_for_rank(rule: Rule, full: torch.Tensor, tp_rank: int, tp: int) -> torch.Tensor:
    """``tp_rank``'s shard of the full megatron tensor of ``rule`` (a copy, contiguous)."""
    if rule.split == "none" or tp == 1:
        return full.clone()
    if rule.split in ("qkv", "vocab"):
        return _chunk(full, tp, 0, rule)[tp_rank].clone()
    if rule.split == "row":
        return _chunk(full, tp, 1, rule)[tp_rank].contiguous()
    if rule.split == "gate_up":
        gate, up = full.chunk(2, dim=0)
        return torch.cat([_chunk(gate, tp, 0, rule)[tp_rank], _chunk(up, tp, 0, rule)[tp_rank]], dim=0)
    raise ValueError(f"unknown split kind {rule.split!r}")


def merge_shards(rule: Rule, shards: list[torch.Tensor]) -> torch.Tensor:
    """Inverse of :func:`split_for_rank`: the full tensor from every TP rank's shard, in rank order."""
    if rule.split == "none" or len(shards) == 1:
        return shards[0]
    if rule.split in ("qkv", "vocab"):
        return torch.cat(shards, dim=0)
    if rule.split == "row":
        return torch.cat(shards, dim=1)
    if rule.split == "gate_up":
        halves = [shard.chunk(2, dim=0) for shard in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    raise ValueError(f"unknown split kind {rule.split!r}")


def _chunk(tensor: torch.Tensor, parts: int, dim: int, rule: Rule) -> tuple[torch.Tensor, ...]:
    if tensor.shape[dim] % parts:
        raise ValueError(
            f"{rule.megatron}: dimension {dim} of size {tensor.shape[dim]} does not split over {parts} TP ranks"
        )
    return tensor.chunk(parts, dim=dim)


# -- pipeline stages ----------------------------------------------------------------------------------


def stage_layers(num_layers: int, pp: int, pp_rank: int, vpp: int | None = None, vp_stage: int = 0) -> range:
    """The global layer indices model chunk ``vp_stage`` of pipeline stage ``pp_rank`` holds."""
    chunks = pp * (vpp or 1)
    if num_layers % chunks:
        raise ValueError(
            f"{num_layers} layers do not split evenly over pipeline_model_parallel_size={pp}"
            + (f" x virtual_pipeline_model_parallel_size={vpp}" if vpp else "")
        )
    per_chunk = num_layers // chunks
    start = (vp_stage * pp + pp_rank) * per_chunk
    return range(start, start + per_chunk)


def is_first_chunk(pp_rank: int, vp_stage: int = 0) -> bool:
    return pp_rank == 0 and vp_stage == 0


def is_last_chunk(pp_rank: int, pp: int, vpp: int | None = None, vp_stage: int = 0) -> bool:
    return pp_rank == pp - 1 and vp_stage == (vpp or 1) - 1


def experts_per_rank(shape: ModelShape, ep: int) -> int:
    if shape.moe is None:
        return 0
    if shape.moe.num_experts % ep:
        raise ValueError(f"expert_model_parallel_size={ep} must divide the model's {shape.moe.num_experts} experts")
    return shape.moe.num_experts // ep


def expert_owner(rule: Rule, shape: ModelShape, ep: int) -> int:
    """The EP rank holding ``rule``'s routed expert (0 for a tensor replicated over EP)."""
    return 0 if rule.expert is None else rule.expert // experts_per_rank(shape, ep)


def held_by_ep_rank(rule: Rule, shape: ModelShape, ep: int, ep_rank: int) -> bool:
    """Whether EP rank ``ep_rank`` has a tensor for ``rule`` (its own experts and everything replicated)."""
    return rule.expert is None or expert_owner(rule, shape, ep) == ep_rank


def local_name(rule: Rule, layers: range, shape: ModelShape | None = None, ep: int = 1) -> str:
    """The name of ``rule``'s tensor inside the model chunk holding ``layers`` (layers are numbered from 0
    in each chunk; a routed expert by its index among its EP rank's experts)."""
    if rule.layer is None:
        return rule.megatron
    suffix = rule.megatron[len(f"{LAYER_PREFIX}{rule.layer}.") :]
    if rule.expert is not None:
        if shape is None:
            raise ValueError(f"{rule.megatron}: naming an expert's local tensor needs the model shape")
        local = rule.expert % experts_per_rank(shape, ep)
        suffix = suffix.replace(f"local_experts.{rule.expert}.", f"local_experts.{local}.", 1)
    return f"{LAYER_PREFIX}{rule.layer - layers.start}.{suffix}"


def held_by_chunk(
    rule: Rule, shape: ModelShape, pp_rank: int, pp: int, vpp: int | None = None, vp_stage: int = 0
) -> bool:
    """Whether the model chunk ``vp_stage`` of stage ``pp_rank`` has a tensor for ``rule``."""
    first, last = is_first_chunk(pp_rank, vp_stage), is_last_chunk(pp_rank, pp, vpp, vp_stage)
    if rule.layer is not None:
        return rule.layer in stage_layers(shape.num_layers, pp, pp_rank, vpp, vp_stage)
    if rule.megatron == EMBEDDING:
        return first
    if rule.megatron == FINAL_NORM:
        return last
    if rule.megatron == OUTPUT_BIAS:
        return last
    if rule.megatron == OUTPUT_LAYER:
        # Tied on one stage: the output layer *is* the embedding, there is no second tensor.
        return last and not (shape.tie_embeddings and first)
    raise ValueError(f"no stage rule for {rule.megatron}")


def owner_stage(rule: Rule, shape: ModelShape, pp: int, vpp: int | None = None) -> tuple[int, int]:
    """(pp_rank, vp_stage) whose tensor is the exported one for ``rule`` (a tied output layer: the
    embedding's stage)."""
    for vp_stage in range(vpp or 1):
        for pp_rank in range(pp):
            if held_by_chunk(rule, shape, pp_rank, pp, vpp, vp_stage):
                return pp_rank, vp_stage
    raise ValueError(f"no pipeline stage holds {rule.megatron}")


def rank_state_dict(
    full: dict[str, torch.Tensor],
    rules: list[Rule],
    shape: ModelShape,
    *,
    tp_rank: int,
    tp: int,
    pp_rank: int,
    pp: int,
    vpp: int | None = None,
    vp_stage: int = 0,
    ep_rank: int = 0,
    ep: int = 1,
) -> dict[str, torch.Tensor]:
    """One model chunk's state dict (local names, this TP rank's shards, this EP rank's experts) from the
    full megatron tensors."""
    layers = stage_layers(shape.num_layers, pp, pp_rank, vpp, vp_stage)
    return {
        local_name(rule, layers, shape, ep): split_for_rank(rule, full[rule.megatron], tp_rank, tp)
        for rule in rules
        if held_by_chunk(rule, shape, pp_rank, pp, vpp, vp_stage) and held_by_ep_rank(rule, shape, ep, ep_rank)
    }
