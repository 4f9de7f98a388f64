"""Build this rank's megatron model chunks from a HF folder and move weights in and out of them.

Needs megatron's ``parallel_state`` initialised (:mod:`verl.engines.megatron.parallel`) and, on the CPU,
the platform's megatron environment entered (:mod:`verl.engines.megatron.environment`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from verl.engines.megatron import convert, sharding
from verl.engines.megatron.layer_spec import SpecName, layer_spec
from verl.engines.megatron.model_config import ModelShape, build_gpt_model, padded_vocab_size, transformer_config

#: megatron-lm's default ``make_vocab_size_divisible_by``.
VOCAB_DIVISIBLE_BY = 128


@dataclass
class Layout:
    """This rank's place in the TP x PP (x EP) layout."""

    tp: int
    tp_rank: int
    pp: int
    pp_rank: int
    vpp: int | None = None
    ep: int = 1
    ep_rank: int = 0

    @classmethod
    def current(cls, vpp: int | None = None) -> Layout:
        from megatron.core import parallel_state as mpu

        return cls(
            tp=mpu.get_tensor_model_parallel_world_size(),
            tp_rank=mpu.get_tensor_model_parallel_rank(),
            pp=mpu.get_pipeline_model_parallel_world_size(),
            pp_rank=mpu.get_pipeline_model_parallel_rank(),
            vpp=vpp,
            ep=mpu.get_expert_model_parallel_world_size(),
            ep_rank=mpu.get_expert_model_parallel_rank(),
        )

    @property
    def chunks(self) -> int:
        return self.vpp or 1

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1


def build_model_chunks(
    shape: ModelShape,
    layout: Layout,
    spec: SpecName,
    *,
    params_dtype: torch.dtype = torch.float32,
    use_cpu_initialization: bool = False,
    vocab_divisible_by: int = VOCAB_DIVISIBLE_BY,
    **config_overrides,
) -> tuple[list[torch.nn.Module], int]:
    """This rank's model chunks (one per virtual stage) and the padded vocabulary size."""
    config = transformer_config(
        shape,
        tp=layout.tp,
        pp=layout.pp,
        vpp=layout.vpp,
        ep=layout.ep,
        params_dtype=params_dtype,
        use_cpu_initialization=use_cpu_initialization,
        **config_overrides,
    )
    spec_module = layer_spec(
        spec, qk_layernorm=shape.qk_layernorm, num_experts=shape.moe.num_experts if shape.moe else None
    )
    padded = padded_vocab_size(shape.vocab_size, vocab_divisible_by, layout.tp)
    chunks = []
    for vp_stage in range(layout.chunks):
        chunks.append(
            build_gpt_model(
                shape,
                config,
                spec_module,
                padded_vocab=padded,
                pre_process=sharding.is_first_chunk(layout.pp_rank, vp_stage),
                post_process=sharding.is_last_chunk(layout.pp_rank, layout.pp, layout.vpp, vp_stage),
                vp_stage=vp_stage if layout.vpp else None,
            )
        )
    return chunks, padded


def load_hf_weights(
    chunks: list[torch.nn.Module],
    hf_state: dict[str, torch.Tensor],
    shape: ModelShape,
    layout: Layout,
    padded_vocab: int,
    spec: SpecName = "local",
) -> None:
    """Copy the HF weights into this rank's chunks (its TP shards of its stage's layers); every
    parameter of every chunk must be written."""

    def assign(param: torch.nn.Parameter, value: torch.Tensor) -> None:
        param.copy_(value)

    scatter_hf_tensors(chunks, hf_state, shape, layout, padded_vocab, assign, spec)


def scatter_hf_tensors(
    chunks: list[torch.nn.Module],
    hf_state: dict[str, torch.Tensor],
    shape: ModelShape,
    layout: Layout,
    padded_vocab: int,
    assign: Callable[[torch.nn.Parameter, torch.Tensor], None],
    spec: SpecName = "local",
) -> None:
    """For every parameter of this rank's chunks, ``assign(param, value)`` (under no_grad) with this
    rank's shard of the full HF-named tensors ``hf_state`` (weights, or an optimizer state in the same
    layout). Every parameter must get a value and every converted tensor must have a parameter."""
    full = convert.hf_to_megatron(hf_state, shape, padded_vocab, spec)
    rules = convert.conversion_rules(shape, spec)
    for vp_stage, chunk in enumerate(chunks):
        state = sharding.rank_state_dict(
            full,
            rules,
            shape,
            tp_rank=layout.tp_rank,
            tp=layout.tp,
            pp_rank=layout.pp_rank,
            pp=layout.pp,
            vpp=layout.vpp,
            vp_stage=vp_stage,
            ep_rank=layout.ep_rank,
            ep=layout.ep,
        )
        params = dict(_unwrap(chunk).named_parameters())
        missing = sorted(set(params) - set(state))
        unexpected = sorted(set(state) - set(params))
        if missing or unexpected:
            raise RuntimeError(
                f"HF -> megatron mapping mismatch on pp stage {layout.pp_rank} chunk {vp_stage}: "
                f"parameters without a source {missing}, converted tensors without a parameter {unexpected}"
            )
        with torch.no_grad():
            for name, param in params.items():
                if param.shape != state[name].shape:
                    raise RuntimeError(
                        f"{name}: megatron has {tuple(param.shape)}, converted {tuple(state[name].shape)}"
                    )
                assign(param, state[name])


def hf_names(shape: ModelShape, spec: SpecName = "local") -> list[str]:
    """The HF names :func:`gather_hf_weights` yields, in its order."""
    return [name for rule in convert.conversion_rules(shape, spec) if rule.export for name in rule.hf]


def _unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The GPTModel inside megatron's wrappers (DDP, Float16Module)."""
    while isinstance(getattr(module, "module", None), torch.nn.Module):
        module = module.module  # type: ignore[assignment]
    return module


def gather_hf_weights(
    chunks: list[torch.nn.Module],
    shape: ModelShape,
    layout: Layout,
    spec: SpecName = "local",
    device: torch.device | str = "cpu",
    tensor_of: Callable[[torch.nn.Parameter], torch.Tensor] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, full tensor) one megatron parameter at a time on every rank: the owning stage's TP
    ranks all-gather their shards, the stage broadcasts the full tensor over the pipeline group (and a
    routed expert's EP rank over the expert-parallel group). Every rank of the model-parallel group must
    iterate to the end (collectives). ``tensor_of`` picks what is gathered per parameter (default: its
    value; ``lambda p: p.main_grad`` gathers DDP's gradients)."""
    from megatron.core import parallel_state as mpu

    tp_group, pp_group = mpu.get_tensor_model_parallel_group(), mpu.get_pipeline_model_parallel_group()
    for rule in convert.conversion_rules(shape, spec):
        if not rule.export:
            continue
        owner, vp_stage = sharding.owner_stage(rule, shape, layout.pp, layout.vpp)
        ep_owner = sharding.expert_owner(rule, shape, layout.ep)
        full: torch.Tensor | None = None
        if owner == layout.pp_rank and sharding.held_by_ep_rank(rule, shape, layout.ep, layout.ep_rank):
            layers = sharding.stage_layers(shape.num_layers, layout.pp, owner, layout.vpp, vp_stage)
            name = sharding.local_name(rule, layers, shape, layout.ep)
            local = dict(_unwrap(chunks[vp_stage]).named_parameters())[name]
            shard = (tensor_of(local) if tensor_of is not None else local).detach()
            if layout.tp > 1 and rule.split != "none":
                group = mpu.get_expert_tensor_parallel_group() if rule.expert is not None else tp_group
                parts = [torch.empty_like(shard) for _ in range(layout.tp)]
                dist.all_gather(parts, shard.contiguous(), group=group)
                full = sharding.merge_shards(rule, parts)
            else:
                full = shard.clone() if layout.pp > 1 or layout.ep > 1 else shard
        if layout.ep > 1 and rule.expert is not None and owner == layout.pp_rank:
            full = _broadcast(full, ep_owner, mpu.get_expert_model_parallel_group(), device)
        if layout.pp > 1:
            full = _broadcast(full, owner, pp_group, device)
        assert full is not None
        yield from convert.unfuse(rule, full, shape)


def _broadcast(tensor: torch.Tensor | None, src_index: int, group, device) -> torch.Tensor:
    """``tensor`` from the ``src_index``-th rank of ``group`` on all of them (receivers pass None and learn
    the shape first: it differs per parameter)."""
    ranks = dist.get_process_group_ranks(group)
    meta: list[Any] = [tuple(tensor.shape), tensor.dtype] if tensor is not None else [None, None]
    dist.broadcast_object_list(meta, src=ranks[src_index], group=group)
    if tensor is None:
        tensor = torch.empty(meta[0], dtype=meta[1], device=device)
    dist.broadcast(tensor, src=ranks[src_index], group=group)
    return tensor
