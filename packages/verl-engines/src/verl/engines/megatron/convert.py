"""Our own Hugging Face <-> megatron weight converter for dense Llama / Qwen2 / Qwen3 (megatron-core ships
none). Pure tensor code: no megatron import, so it is tested without megatron's process groups.

One :class:`Rule` per megatron parameter says which HF tensors make it and how:

| megatron (per layer ``decoder.layers.{i}.``)         | HF (``model.layers.{i}.``)                 | fuse    | TP split |
|------------------------------------------------------|---------------------------------------------|---------|----------|
| ``input_layernorm.weight`` (local spec) /            | ``input_layernorm.weight``                  | copy    | none     |
| ``self_attention.linear_qkv.layer_norm_weight`` (TE) |                                             |         |          |
| ``self_attention.linear_qkv.weight`` / ``.bias``     | ``self_attn.{q,k,v}_proj.weight`` / ``.bias`` | qkv     | qkv      |
| ``self_attention.q_layernorm.weight``                | ``self_attn.q_norm.weight`` (Qwen3)         | copy    | none     |
| ``self_attention.k_layernorm.weight``                | ``self_attn.k_norm.weight`` (Qwen3)         | copy    | none     |
| ``self_attention.linear_proj.weight``                | ``self_attn.o_proj.weight``                 | copy    | row      |
| ``pre_mlp_layernorm.weight`` (local) /               | ``post_attention_layernorm.weight``         | copy    | none     |
| ``mlp.linear_fc1.layer_norm_weight`` (TE)            |                                             |         |          |
| ``mlp.linear_fc1.weight``                            | ``mlp.{gate,up}_proj.weight``               | gate_up | gate_up  |
| ``mlp.linear_fc2.weight``                            | ``mlp.down_proj.weight``                    | copy    | row      |

In an MoE layer (Qwen2-MoE / Qwen3-MoE) the MLP rows above are replaced by (expert ``j``, shared expert
only in Qwen2-MoE; the norm before it is ``pre_mlp_layernorm.weight`` in both specs):

| megatron (per layer)                                  | HF (per layer)                                | fuse    | TP split |
|-------------------------------------------------------|-----------------------------------------------|---------|----------|
| ``mlp.router.weight``                                 | ``mlp.gate.weight``                           | copy    | none     |
| ``mlp.experts.local_experts.{j}.linear_fc1.weight``   | ``mlp.experts.{j}.{gate,up}_proj.weight``     | gate_up | gate_up  |
| ``mlp.experts.local_experts.{j}.linear_fc2.weight``   | ``mlp.experts.{j}.down_proj.weight``          | copy    | row      |
| ``mlp.shared_experts.linear_fc1.weight``              | ``mlp.shared_expert.{gate,up}_proj.weight``   | gate_up | gate_up  |
| ``mlp.shared_experts.linear_fc2.weight``              | ``mlp.shared_expert.down_proj.weight``        | copy    | row      |
| ``mlp.shared_experts.gate_weight``                    | ``mlp.shared_expert_gate.weight``             | copy    | none     |

The HF names are a checkpoint's (one tensor per expert; transformers >= 5 fuses them in memory only).
Here ``j`` is the global expert index; with expert parallelism (:mod:`.sharding`) EP rank ``e`` holds
experts ``e * E/ep ... (e+1) * E/ep - 1`` as its ``local_experts.0 ...``, split over the expert TP ranks.

plus ``embedding.word_embeddings.weight`` <- ``model.embed_tokens.weight`` and ``output_layer.weight`` <-
``lm_head.weight`` (vocabulary padded, split over TP by rows), and ``decoder.final_layernorm.weight`` <-
``model.norm.weight``. A value model has ``output_layer.weight`` / ``.bias`` <- ``score.weight`` / ``.bias``
instead (replicated over TP). With tied embeddings the output layer is the embedding (megatron keeps a copy on the
last pipeline stage when PP > 1) and nothing is exported for it.

Layouts megatron uses:
- ``linear_qkv`` rows are grouped by query group: for each of the ``num_kv_heads`` groups, the group's
  ``num_heads / num_kv_heads`` query heads, then its key head, then its value head (``head_dim`` rows
  each). TP ranks hold whole groups, so the fused tensor splits into TP contiguous chunks.
- ``linear_fc1`` holds gate then up *per TP rank*: rank r has ``[gate_r; up_r]``. The full (TP=1) tensor
  is ``[gate; up]``; splitting it for TP splits gate and up separately.
- Vocabulary tensors are padded with zero rows to ``padded_vocab`` (see ``padded_vocab_size``) and the
  padding is stripped on the way back. The padded logits must be masked out of any softmax.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from verl.engines.megatron.model_config import ModelShape

Fuse = Literal["copy", "qkv", "gate_up", "vocab"]
Split = Literal["none", "qkv", "row", "gate_up", "vocab"]
Spec = Literal["local", "transformer_engine"]

EMBEDDING = "embedding.word_embeddings.weight"
OUTPUT_LAYER = "output_layer.weight"
#: Only value models have it (the ``score`` head's bias).
OUTPUT_BIAS = "output_layer.bias"
FINAL_NORM = "decoder.final_layernorm.weight"
LAYER_PREFIX = "decoder.layers."


@dataclass(frozen=True)
class Rule:
    """One megatron parameter (full, TP=1 layout, global layer number) and the HF tensors it comes from."""

    megatron: str
    hf: tuple[str, ...]
    fuse: Fuse
    split: Split
    #: Global layer index (None for embedding, final norm, output layer).
    layer: int | None = None
    #: Whether exporting writes the HF tensors (False for the tied output layer: it is the embedding).
    export: bool = True
    #: Global expert index of a routed expert's weight (None for everything else).
    expert: int | None = None


def _layer_rules(shape: ModelShape, spec: Spec, i: int) -> list[Rule]:
    m, h = f"{LAYER_PREFIX}{i}.", f"model.layers.{i}."
    te = spec == "transformer_engine"
    attn_norm = "self_attention.linear_qkv.layer_norm_weight" if te else "input_layernorm.weight"
    mlp_norm = "mlp.linear_fc1.layer_norm_weight" if te else "pre_mlp_layernorm.weight"
    rules = [
        Rule(m + attn_norm, (h + "input_layernorm.weight",), "copy", "none", i),
        Rule(
            m + "self_attention.linear_qkv.weight",
            tuple(h + f"self_attn.{p}_proj.weight" for p in "qkv"),
            "qkv",
            "qkv",
            i,
        ),
    ]
    if shape.qkv_bias:
        rules.append(
            Rule(
                m + "self_attention.linear_qkv.bias",
                tuple(h + f"self_attn.{p}_proj.bias" for p in "qkv"),
                "qkv",
                "qkv",
                i,
            )
        )
    if shape.qk_layernorm:
        rules.append(Rule(m + "self_attention.q_layernorm.weight", (h + "self_attn.q_norm.weight",), "copy", "none", i))
        rules.append(Rule(m + "self_attention.k_layernorm.weight", (h + "self_attn.k_norm.weight",), "copy", "none", i))
    rules.append(Rule(m + "self_attention.linear_proj.weight", (h + "self_attn.o_proj.weight",), "copy", "row", i))
    if shape.moe is not None:
        # megatron keeps the MoE layer's norm a module of its own in both specs.
        rules.append(Rule(m + "pre_mlp_layernorm.weight", (h + "post_attention_layernorm.weight",), "copy", "none", i))
        return rules + _moe_rules(shape, i)
    rules.append(Rule(m + mlp_norm, (h + "post_attention_layernorm.weight",), "copy", "none", i))
    return rules + _mlp_rules(m + "mlp.", h + "mlp.", i)


def _mlp_rules(m: str, h: str, i: int, expert: int | None = None) -> list[Rule]:
    """A SwiGLU MLP: megatron ``{m}linear_fc1`` / ``{m}linear_fc2`` <- HF ``{h}{gate,up,down}_proj``."""
    return [
        Rule(
            m + "linear_fc1.weight",
            (h + "gate_proj.weight", h + "up_proj.weight"),
            "gate_up",
            "gate_up",
            i,
            expert=expert,
        ),
        Rule(m + "linear_fc2.weight", (h + "down_proj.weight",), "copy", "row", i, expert=expert),
    ]


def _moe_rules(shape: ModelShape, i: int) -> list[Rule]:
    assert shape.moe is not None
    m, h = f"{LAYER_PREFIX}{i}.mlp.", f"model.layers.{i}.mlp."
    rules = [Rule(m + "router.weight", (h + "gate.weight",), "copy", "none", i)]
    for j in range(shape.moe.num_experts):
        rules += _mlp_rules(f"{m}experts.local_experts.{j}.", f"{h}experts.{j}.", i, expert=j)
    if shape.moe.shared_expert_ffn_hidden_size:
        rules += _mlp_rules(m + "shared_experts.", h + "shared_expert.", i)
        if shape.moe.shared_expert_gate:
            rules.append(Rule(m + "shared_experts.gate_weight", (h + "shared_expert_gate.weight",), "copy", "none", i))
    return rules


def conversion_rules(shape: ModelShape, spec: Spec = "local") -> list[Rule]:
    """Every megatron parameter of the full model, in HF order (embedding, layers, norm, output)."""
    rules = [Rule(EMBEDDING, ("model.embed_tokens.weight",), "vocab", "vocab")]
    for i in range(shape.num_layers):
        rules += _layer_rules(shape, spec, i)
    rules.append(Rule(FINAL_NORM, ("model.norm.weight",), "copy", "none"))
    if shape.value_head:  # replicated over TP (see value_head.py)
        rules.append(Rule(OUTPUT_LAYER, ("score.weight",), "copy", "none"))
        if shape.value_head_bias:
            rules.append(Rule(OUTPUT_BIAS, ("score.bias",), "copy", "none"))
    elif shape.tie_embeddings:
        rules.append(Rule(OUTPUT_LAYER, ("model.embed_tokens.weight",), "vocab", "vocab", export=False))
    else:
        rules.append(Rule(OUTPUT_LAYER, ("lm_head.weight",), "vocab", "vocab"))
    return rules


# -- fusing (HF tensors <-> one full megatron tensor) ---------------------------------------------------


def fuse(rule: Rule, tensors: list[torch.Tensor], shape: ModelShape, padded_vocab: int) -> torch.Tensor:
    """The full megatron tensor of ``rule`` from its HF tensors (in ``rule.hf`` order)."""
    if rule.fuse == "copy":
        return tensors[0]
    if rule.fuse == "qkv":
        q, k, v = tensors
        return _fuse_qkv(q, k, v, shape)
    if rule.fuse == "gate_up":
        return torch.cat(tensors, dim=0)
    if rule.fuse == "vocab":
        return _pad_vocab(tensors[0], padded_vocab)
    raise ValueError(f"unknown fuse kind {rule.fuse!r}")


def unfuse(rule: Rule, tensor: torch.Tensor, shape: ModelShape) -> list[tuple[str, torch.Tensor]]:
    """The HF (name, tensor) pairs of ``rule`` from its full megatron tensor (empty for what is not exported)."""
    if not rule.export:
        return []
    if rule.fuse == "copy":
        parts = [tensor]
    elif rule.fuse == "qkv":
        parts = list(_split_qkv(tensor, shape))
    elif rule.fuse == "gate_up":
        parts = list(tensor.chunk(2, dim=0))
    elif rule.fuse == "vocab":
        parts = [tensor[: shape.vocab_size]]
    else:
        raise ValueError(f"unknown fuse kind {rule.fuse!r}")
    return list(zip(rule.hf, parts))


def _group_sizes(shape: ModelShape) -> tuple[int, int]:
    if shape.num_heads % shape.num_kv_heads:
        raise ValueError(
            f"num_attention_heads={shape.num_heads} is not a multiple of num_key_value_heads={shape.num_kv_heads}"
        )
    return shape.num_kv_heads, shape.num_heads // shape.num_kv_heads


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: ModelShape) -> torch.Tensor:
    groups, per_group = _group_sizes(shape)
    d = shape.head_dim
    rest = q.shape[1:]  # (hidden,) for weights, () for biases
    q = q.reshape(groups, per_group * d, *rest)
    k = k.reshape(groups, d, *rest)
    v = v.reshape(groups, d, *rest)
    return torch.cat([q, k, v], dim=1).reshape(groups * (per_group + 2) * d, *rest)


def _split_qkv(fused: torch.Tensor, shape: ModelShape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    groups, per_group = _group_sizes(shape)
    d = shape.head_dim
    rest = fused.shape[1:]
    grouped = fused.reshape(groups, (per_group + 2) * d, *rest)
    q, k, v = grouped.split([per_group * d, d, d], dim=1)
    return (
        q.reshape(groups * per_group * d, *rest),
        k.reshape(groups * d, *rest),
        v.reshape(groups * d, *rest),
    )


def _pad_vocab(tensor: torch.Tensor, padded_vocab: int) -> torch.Tensor:
    rows = tensor.shape[0]
    if padded_vocab < rows:
        raise ValueError(f"padded vocabulary {padded_vocab} is smaller than the model's {rows}")
    if padded_vocab == rows:
        return tensor
    return torch.cat([tensor, tensor.new_zeros(padded_vocab - rows, *tensor.shape[1:])], dim=0)


# -- whole state dicts (TP=1, PP=1) -----------------------------------------------------------------------


def hf_to_megatron(
    hf_state: dict[str, torch.Tensor], shape: ModelShape, padded_vocab: int, spec: Spec = "local"
) -> dict[str, torch.Tensor]:
    """The full (TP=1, PP=1) megatron state dict of a HF state dict. A tied model's output layer is
    included (a PP>1 last stage needs it); drop :data:`OUTPUT_LAYER` for a tied single-stage model."""
    out: dict[str, torch.Tensor] = {}
    for rule in conversion_rules(shape, spec):
        missing = [name for name in rule.hf if name not in hf_state]
        if missing:
            raise KeyError(f"the Hugging Face weights lack {missing} (needed for megatron's {rule.megatron})")
        out[rule.megatron] = fuse(rule, [hf_state[name] for name in rule.hf], shape, padded_vocab)
    return out


def megatron_to_hf(
    mg_state: dict[str, torch.Tensor], shape: ModelShape, spec: Spec = "local"
) -> dict[str, torch.Tensor]:
    """The HF state dict of a full megatron state dict (padding stripped; a tied head not repeated)."""
    out: dict[str, torch.Tensor] = {}
    for rule in conversion_rules(shape, spec):
        if rule.export:
            out.update(unfuse(rule, mg_state[rule.megatron], shape))
    return out
