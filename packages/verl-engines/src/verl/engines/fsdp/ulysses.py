"""Ulysses sequence parallelism (verl's ``ulysses_sequence_parallel_size``) on the packed layout.

The ``sp`` ranks of a sequence-parallel group hold the same micro-batch; each runs the model on one
contiguous ``1/sp`` slice of the packed row (:func:`split_for_rank`). Everything but attention works
token by token, so only attention needs the rest of the row: around it an all-to-all turns
``[heads, T/sp]`` into ``[heads/sp, T]`` (every rank sees the whole row for its share of the heads), the
packed varlen attention runs (including prompt-shared segments: it reads the whole row's position ids),
and a second all-to-all turns the output back. Each rank then computes the log-probs (or values) of the
response tokens predicted in its slice; :class:`SequenceShard` gathers them into the whole micro-batch's
order, so the loss is the same on every rank of the group.

Gradients: the gather's backward keeps each rank's own part (no sum), so each rank's parameter gradients
are the loss's gradient through its own tokens, and FSDP's sum over the group (it shards over the
sequence-parallel ranks too, :meth:`~verl.core.parallel_dims.ParallelDims.sharded`) adds them up to the
gradient of the whole micro-batch, which is what one rank computes without sequence parallelism.

Heads: ``num_attention_heads`` must be a multiple of ``sp``; key/value heads too, or (GQA with fewer
key/value heads than ranks) a divisor of ``sp``: each key/value head is then repeated (as verl does) so
that every rank gets one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

from verl.engines.fsdp.packing import ModelInputs
from verl.engines.fsdp.varlen_attention import varlen_sdpa_attention, varlen_sdpa_mask

ULYSSES_SDPA = "verl_ulysses_varlen_sdpa"
#: The attribute that tells an attention module which sequence-parallel group it runs in.
GROUP_ATTRIBUTE = "_verl_ulysses_group"


class UlyssesConfigError(ValueError):
    """Sequence parallelism cannot run with these settings; the message names the setting and the fix."""


def check_supported(sp: int, *, use_remove_padding: bool, attn_implementation: str) -> None:
    if sp < 1:
        raise UlyssesConfigError(f"ulysses_sequence_parallel_size={sp} must be at least 1 (1: off)")
    if sp == 1:
        return
    if not use_remove_padding:
        raise UlyssesConfigError(
            f"ulysses_sequence_parallel_size={sp} splits the packed row of a micro-batch and needs "
            "use_remove_padding=true (as in verl); turn packing on or set ulysses_sequence_parallel_size=1"
        )
    if attn_implementation != "sdpa":
        raise UlyssesConfigError(
            f"ulysses_sequence_parallel_size={sp} runs on the engine's packed sdpa attention; "
            f"attn_implementation={attn_implementation!r} is not supported with it: use 'sdpa' or set "
            "ulysses_sequence_parallel_size=1"
        )


def check_heads(hf_config, sp: int) -> None:
    """Refuse a model whose attention heads cannot be split over ``sp`` ranks."""
    heads = getattr(hf_config, "num_attention_heads", None)
    if heads is None:
        raise UlyssesConfigError(
            f"{type(hf_config).__name__} has no num_attention_heads: sequence parallelism does not know how to "
            "split its attention; set ulysses_sequence_parallel_size=1"
        )
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    if heads % sp:
        raise UlyssesConfigError(
            f"ulysses_sequence_parallel_size={sp} must divide the model's {heads} attention heads (each rank "
            "computes attention for heads/sp of them); pick a divisor of the head count"
        )
    if kv_heads % sp and sp % kv_heads:
        raise UlyssesConfigError(
            f"the model's {kv_heads} key/value heads can neither be split over ulysses_sequence_parallel_size="
            f"{sp} ranks nor repeated to fill them (sp must be a multiple or a divisor of the key/value heads)"
        )


def attach_group(model: torch.nn.Module, group) -> None:
    """Tell every submodule (attention layers among them) the sequence-parallel group: the attention
    function receives its module, so the group travels with the model, also into activation
    checkpointing's recomputation during backward."""
    for module in model.modules():
        object.__setattr__(module, GROUP_ATTRIBUTE, group)


# -- all-to-all ----------------------------------------------------------------------------------------
def _all_to_all(x: torch.Tensor, group, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    sp = dist.get_world_size(group)
    # Chunks to send go first along dim 0 so all_to_all_single sends chunk i to rank i.
    send = torch.stack(x.chunk(sp, dim=scatter_dim)).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return torch.cat(recv.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    """Scatter ``scatter_dim``, gather ``gather_dim``; the backward is the same exchange reversed."""

    @staticmethod
    def forward(ctx, x, group, scatter_dim: int, gather_dim: int):
        ctx.group, ctx.dims = group, (scatter_dim, gather_dim)
        return _all_to_all(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad, ctx.group, gather_dim, scatter_dim), None, None, None


def all_to_all(x: torch.Tensor, group, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    return _AllToAll.apply(x, group, scatter_dim, gather_dim)


def _gather_position_ids(local: torch.Tensor, group) -> torch.Tensor:
    pieces = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, local.contiguous(), group=group)
    return torch.cat(pieces, dim=-1)


# -- attention -----------------------------------------------------------------------------------------
def ulysses_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Packed varlen attention over the whole row for ``heads/sp`` heads. ``query``/``key``/``value``
    arrive as ``[1, heads, T/sp, dim]`` (this rank's tokens); returns ``[1, T/sp, heads, dim]``."""
    group = getattr(module, GROUP_ATTRIBUTE, None)
    if group is None:
        raise RuntimeError(
            f"{ULYSSES_SDPA} runs only in a model prepared by the FSDP engine with ulysses_sequence_parallel_size "
            "> 1 (its attention modules carry the sequence-parallel group)"
        )
    position_ids = kwargs.get("position_ids")
    if attention_mask is not None or position_ids is None:
        raise RuntimeError("sequence parallelism runs on the packed layout only (position ids, no attention mask)")
    sp = dist.get_world_size(group)
    if key.shape[1] < sp:  # GQA with fewer key/value heads than ranks: one (repeated) head per rank
        key, value = repeat_kv(key, sp // key.shape[1]), repeat_kv(value, sp // value.shape[1])
    query, key, value = (all_to_all(t, group, scatter_dim=1, gather_dim=2) for t in (query, key, value))
    kwargs["position_ids"] = _gather_position_ids(position_ids, group)
    out, _ = varlen_sdpa_attention(module, query, key, value, None, dropout=dropout, scaling=scaling, **kwargs)
    # out: [1, T, heads/sp, dim] -> [1, T/sp, heads, dim]
    return all_to_all(out, group, scatter_dim=1, gather_dim=2), None


def register_ulysses_sdpa() -> str:
    """Make :data:`ULYSSES_SDPA` a transformers attention implementation (idempotent); returns its name."""
    AttentionInterface.register(ULYSSES_SDPA, ulysses_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ULYSSES_SDPA, varlen_sdpa_mask)
    return ULYSSES_SDPA


# -- splitting a micro-batch and gathering its outputs ---------------------------------------------------
class _GatherKeepingOwnGrad(torch.autograd.Function):
    """All-gather of ``[n_r, ...]`` pieces of known sizes; the backward returns this rank's slice of the
    gradient (not a sum over ranks: every rank computes the same loss from the gathered tensor)."""

    @staticmethod
    def forward(ctx, local, group, counts: list[int], rank: int):
        ctx.span = (sum(counts[:rank]), counts[rank])
        width = max(max(counts), 1)
        padded = local.new_zeros((width, *local.shape[1:]))
        padded[: local.shape[0]] = local
        pieces = [torch.empty_like(padded) for _ in counts]
        dist.all_gather(pieces, padded.contiguous(), group=group)
        return torch.cat([piece[:count] for piece, count in zip(pieces, counts)])

    @staticmethod
    def backward(ctx, grad):
        start, count = ctx.span
        return grad[start : start + count], None, None, None


@dataclass
class SequenceShard:
    """One rank's slice of a packed micro-batch and how its per-token outputs rejoin the others'."""

    local: ModelInputs  # this rank's tokens; ``keep``/``targets``: the predictions made in them
    group: object
    rank: int
    counts: list[int]  # predictions per rank
    inverse: torch.Tensor  # rank-major order -> the micro-batch's order of ``keep``
    anchored: bool  # this rank predicts nothing: one dummy position keeps it in the backward

    def gather(self, values: torch.Tensor) -> torch.Tensor:
        """[n_local, ...] outputs of :attr:`local` -> [N, ...] outputs of the whole micro-batch."""
        own = values[:0] if self.anchored else values
        return _GatherKeepingOwnGrad.apply(own, self.group, self.counts, self.rank)[self.inverse]


def split_for_rank(inputs: ModelInputs, group) -> SequenceShard:
    """This rank's contiguous slice of the packed row (padded with a short dummy sequence to a multiple of
    the group size) and of the predictions."""
    return split(inputs, group, dist.get_world_size(group), dist.get_rank(group))


def split(inputs: ModelInputs, group, sp: int, rank: int) -> SequenceShard:
    """:func:`split_for_rank` for rank ``rank`` of ``sp`` (no collective: the bookkeeping alone)."""
    if inputs.attention_mask is not None or inputs.keep.dtype == torch.bool:
        raise ValueError("sequence parallelism splits the packed layout; use_remove_padding must be on")
    ids, pos = inputs.input_ids, inputs.position_ids
    pad = -ids.shape[1] % sp
    if pad:  # positions restarting at 0: a sequence of its own that attends to nothing else
        ids = torch.cat([ids, ids.new_zeros(1, pad)], dim=1)
        pos = torch.cat([pos, torch.arange(pad, dtype=pos.dtype, device=pos.device)[None]], dim=1)
    width = ids.shape[1] // sp
    owner = torch.div(inputs.keep, width, rounding_mode="floor")
    mine = owner == rank
    local_keep, local_targets = inputs.keep[mine] - rank * width, inputs.targets[mine]
    anchored = local_keep.numel() == 0
    if anchored:  # a rank without predictions must still run backward (the all-to-alls are collective)
        local_keep, local_targets = local_keep.new_zeros(1), inputs.targets.new_zeros(1)
    span = slice(rank * width, (rank + 1) * width)
    local = ModelInputs(ids[:, span], pos[:, span], None, local_keep, local_targets, inputs.response_valid)
    order = torch.sort(owner, stable=True).indices
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    counts = torch.bincount(owner, minlength=sp).tolist()
    return SequenceShard(local, group, rank, counts, inverse, anchored)
