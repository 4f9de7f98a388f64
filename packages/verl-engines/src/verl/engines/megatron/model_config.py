"""Hugging Face config -> megatron ``TransformerConfig`` and ``GPTModel`` (dense Llama, Qwen2, Qwen3, and the
Qwen2-MoE / Qwen3-MoE mixtures of experts).

What each architecture needs from megatron, beyond the shared shape (RMSNorm, SwiGLU MLP, rotary
embeddings with the HF rope theta, grouped-query attention):

| HF model_type | qkv bias (``add_qkv_bias``) | per-head q/k RMSNorm (``qk_layernorm``) |
|---------------|-----------------------------|-----------------------------------------|
| llama         | no (``attention_bias`` must be false) | no |
| qwen2         | yes                         | no                                      |
| qwen3         | ``attention_bias``          | yes                                     |

| qwen2_moe     | ``qkv_bias`` (default yes)  | no                                      |
| qwen3_moe     | ``attention_bias``          | yes                                     |

The MoE families replace every layer's MLP with megatron's ``MoELayer`` (see :class:`MoEShape`): a router
(``mlp.gate``, no bias) over ``num_experts`` SwiGLU experts of ``moe_intermediate_size`` taking the top
``num_experts_per_tok``; Qwen2-MoE adds a shared expert (``shared_expert_intermediate_size``) scaled by
``sigmoid(shared_expert_gate(x))``. HF's routing is a softmax over all experts, then the top-k, renormalised
when ``norm_topk_prob``: megatron's ``moe_router_pre_softmax`` is that without the renormalisation, and its
default (top-k of the logits, then a softmax over those k) equals it with. The router runs in fp32, with
no load-balancing loss and no capacity limit (no token dropped): what HF's forward computes (verl's
megatron configs for these models also set ``moe_router_load_balancing_type="none"``).

Embeddings are tied (``share_embeddings_and_output_weights``) as ``tie_word_embeddings`` says. Dropout is
0 (RL needs the same log-probs in every pass). On the CPU the weights are created on the host
(``use_cpu_initialization``) and kept in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe")
MOE_MODEL_TYPES = ("qwen2_moe", "qwen3_moe")


@dataclass(frozen=True)
class MoEShape:
    """The mixture-of-experts part of a model (every layer is an MoE layer)."""

    num_experts: int
    topk: int
    expert_ffn_hidden_size: int
    #: HF renormalises the top-k routing weights (megatron: ``moe_router_pre_softmax=False``).
    norm_topk_prob: bool
    #: Qwen2-MoE's shared expert (0: none) and its sigmoid gate.
    shared_expert_ffn_hidden_size: int = 0
    shared_expert_gate: bool = False


@dataclass(frozen=True)
class ModelShape:
    """The facts about a HF config that the model builder and the weight converter both need."""

    model_type: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_positions: int
    rope_theta: float
    rms_norm_eps: float
    tie_embeddings: bool
    qkv_bias: bool
    qk_layernorm: bool
    #: A value model: the HF ``score`` head (hidden -> 1) instead of the LM head (:mod:`.value_head`).
    value_head: bool = False
    value_head_bias: bool = True
    #: None for dense models.
    moe: MoEShape | None = None


def model_shape(hf_config: Any, value_head: bool = False) -> ModelShape:
    """Read and check ``hf_config``; an architecture or option megatron is not wired for here is an error
    that names it. ``value_head``: the shape of the value model (``*ForTokenClassification``, one label)
    on this backbone; it has no LM head, so nothing is tied."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise NotImplementedError(
            f"the megatron engine cannot build model_type={model_type!r} "
            f"({type(hf_config).__name__}); supported: {', '.join(SUPPORTED_MODEL_TYPES)}. "
            "Use the fsdp engine for other architectures."
        )
    _check_unsupported_options(hf_config, model_type)
    heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    return ModelShape(
        model_type=model_type,
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        ffn_hidden_size=hf_config.intermediate_size,
        num_heads=heads,
        num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        vocab_size=hf_config.vocab_size,
        max_positions=hf_config.max_position_embeddings,
        rope_theta=float(_rope_parameters(hf_config)["rope_theta"]),
        rms_norm_eps=float(hf_config.rms_norm_eps),
        tie_embeddings=not value_head and bool(getattr(hf_config, "tie_word_embeddings", False)),
        qkv_bias=_qkv_bias(hf_config, model_type),
        qk_layernorm=model_type in ("qwen3", "qwen3_moe"),
        value_head=value_head,
        value_head_bias=bool(getattr(hf_config, "token_classification_bias", True)),
        moe=_moe_shape(hf_config) if model_type in MOE_MODEL_TYPES else None,
    )


def _qkv_bias(hf_config: Any, model_type: str) -> bool:
    if model_type == "qwen2":
        return True
    if model_type == "qwen2_moe":
        return bool(getattr(hf_config, "qkv_bias", True))  # transformers < 5 has no flag: always a bias
    return bool(getattr(hf_config, "attention_bias", False))


def _moe_shape(hf_config: Any) -> MoEShape:
    num_experts = getattr(hf_config, "num_experts", None) or hf_config.num_local_experts
    shared = int(getattr(hf_config, "shared_expert_intermediate_size", 0) or 0)
    return MoEShape(
        num_experts=int(num_experts),
        topk=int(hf_config.num_experts_per_tok),
        expert_ffn_hidden_size=int(hf_config.moe_intermediate_size),
        norm_topk_prob=bool(hf_config.norm_topk_prob),
        shared_expert_ffn_hidden_size=shared,
        shared_expert_gate=shared > 0,  # Qwen2-MoE's shared expert always has its gate
    )


def _rope_parameters(hf_config: Any) -> dict[str, Any]:
    # transformers >= 5 keeps them in ``rope_parameters``; older releases in rope_theta / rope_scaling.
    params = getattr(hf_config, "rope_parameters", None)
    if params:
        return dict(params)
    scaling = getattr(hf_config, "rope_scaling", None) or {}
    return {"rope_type": scaling.get("rope_type", scaling.get("type", "default")), "rope_theta": hf_config.rope_theta}


def _check_unsupported_options(hf_config: Any, model_type: str) -> None:
    problems = []
    rope_type = _rope_parameters(hf_config).get("rope_type", "default")
    if rope_type != "default":
        problems.append(f"rope scaling {rope_type!r} (only plain rotary embeddings are mapped)")
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        problems.append(f"hidden_act={hf_config.hidden_act!r} (SwiGLU with silu only)")
    if model_type == "llama" and getattr(hf_config, "attention_bias", False):
        problems.append("attention_bias=True (Llama's bias on o_proj too has no megatron flag here)")
    if getattr(hf_config, "mlp_bias", False):
        problems.append("mlp_bias=True")
    if getattr(hf_config, "use_sliding_window", False):
        problems.append("use_sliding_window=True")
    if model_type in MOE_MODEL_TYPES:
        if getattr(hf_config, "decoder_sparse_step", 1) != 1:
            problems.append(f"decoder_sparse_step={hf_config.decoder_sparse_step} (every layer must be an MoE layer)")
        if getattr(hf_config, "mlp_only_layers", None):
            problems.append(f"mlp_only_layers={hf_config.mlp_only_layers} (dense layers among MoE layers)")
    if problems:
        raise NotImplementedError(
            f"the megatron engine cannot build this {model_type} model: {'; '.join(problems)}. "
            "Use the fsdp engine for it."
        )


#: Settings that do not depend on the model or the layout.
_FIXED_SETTINGS: dict[str, Any] = dict(
    hidden_dropout=0.0,
    attention_dropout=0.0,
    # The fused kernels are CUDA (apex / TE) code; the plain torch paths are what run everywhere.
    bias_activation_fusion=False,
    bias_dropout_fusion=False,
    masked_softmax_fusion=False,
    persist_layer_norm=False,
    apply_rope_fusion=False,
    gradient_accumulation_fusion=False,
    # verl's losses are already scaled for the global batch: no division by the number of
    # micro-batches, and megatron's DDP then sums gradients over data-parallel ranks.
    calculate_per_token_loss=True,
    # Dense models have no experts, but megatron refuses variable_seq_lengths with its default
    # ("allgather") MoE dispatcher setting.
    moe_token_dispatcher_type="alltoall",
)


def transformer_config(
    shape: ModelShape,
    *,
    tp: int = 1,
    pp: int = 1,
    vpp: int | None = None,
    cp: int = 1,
    ep: int = 1,
    sequence_parallel: bool = False,
    params_dtype: torch.dtype = torch.float32,
    use_cpu_initialization: bool = False,
    **overrides: Any,
):
    """megatron's ``TransformerConfig`` for ``shape`` on a TP x PP (x CP x EP) layout."""
    from megatron.core.transformer import TransformerConfig

    kwargs = {**_FIXED_SETTINGS, **_architecture_settings(shape)}
    kwargs.update(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp,
        context_parallel_size=cp,
        sequence_parallel=sequence_parallel and tp > 1,
        params_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,
        fp16=params_dtype == torch.float16,
        pipeline_dtype=params_dtype,
        use_cpu_initialization=use_cpu_initialization,
        # Pipeline stages exchange each micro-batch's shape (micro-batches are trimmed to their longest row);
        # with virtual stages the schedule runs fixed shapes instead (see schedule.run_micro_batches).
        variable_seq_lengths=pp > 1 and not vpp,
        # With virtual stages on two ranks, a stage's previous and next stage are the same peer: batched
        # p2p (one batch_isend_irecv) then pairs an activation with a gradient (measured on gloo: wrong
        # gradients). megatron's unbatched path keeps the two directions on two communicators for 2-rank
        # groups.
        batch_p2p_comm=not (vpp and pp == 2),
    )
    if shape.moe is not None:
        kwargs.update(moe_config_kwargs(shape.moe, ep))
    elif ep != 1:
        raise ValueError(
            f"expert_model_parallel_size={ep} needs a mixture-of-experts model; {shape.model_type} is dense"
        )
    kwargs.update(overrides)
    return TransformerConfig(**kwargs)


def _architecture_settings(shape: ModelShape) -> dict[str, Any]:
    """The Llama/Qwen decoder: RMSNorm, SwiGLU, no linear biases (but Qwen2's q/k/v), optional q/k norm."""
    import torch.nn.functional as F

    return dict(
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        ffn_hidden_size=shape.ffn_hidden_size,
        num_attention_heads=shape.num_heads,
        num_query_groups=shape.num_kv_heads,
        kv_channels=shape.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=shape.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=shape.qkv_bias,
        qk_layernorm=shape.qk_layernorm,
    )


def moe_config_kwargs(moe: MoEShape, ep: int) -> dict[str, Any]:
    """The ``TransformerConfig`` fields of an MoE model on ``ep`` expert-parallel ranks (module docstring)."""
    if moe.num_experts % ep:
        raise ValueError(f"expert_model_parallel_size={ep} must divide the model's {moe.num_experts} experts")
    return dict(
        num_moe_experts=moe.num_experts,
        moe_router_topk=moe.topk,
        moe_ffn_hidden_size=moe.expert_ffn_hidden_size,
        moe_shared_expert_intermediate_size=moe.shared_expert_ffn_hidden_size or None,
        moe_shared_expert_gate=moe.shared_expert_gate,
        moe_router_score_function="softmax",
        moe_router_pre_softmax=not moe.norm_topk_prob,
        moe_router_dtype="fp32",
        moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=0.0,
        expert_model_parallel_size=ep,
        # SequentialMLP: the grouped GEMM needs Transformer Engine or the grouped_gemm CUDA package.
        moe_grouped_gemm=False,
    )


def check_moe_layout(shape: ModelShape, spec: str, tp: int, sequence_parallel: bool) -> None:
    """megatron trains an MoE layer with TP > 1 only with sequence parallelism (``MoELayer.forward`` raises
    otherwise), and its local spec's torch norms refuse sequence parallelism: on the local spec (CPU, NPU,
    CUDA without Transformer Engine) an MoE model trains with TP = 1 (expert parallelism still applies)."""
    if shape.moe is None or tp == 1:
        return
    if spec == "local":
        raise NotImplementedError(
            f"{shape.model_type} with tensor_model_parallel_size={tp}: megatron trains MoE layers under tensor "
            "parallelism only with sequence_parallel, which its local layer spec (torch norms; the spec used "
            "without Transformer Engine, e.g. on the CPU) does not support. Use tensor_model_parallel_size=1 "
            "(expert_model_parallel_size spreads the experts), or Transformer Engine on CUDA."
        )
    if not sequence_parallel:
        raise ValueError(
            f"{shape.model_type} with tensor_model_parallel_size={tp} needs megatron.sequence_parallel=true "
            "(megatron refuses to train MoE layers under tensor parallelism without it)"
        )


def padded_vocab_size(vocab_size: int, divisible_by: int, tp: int) -> int:
    """megatron pads the vocabulary so each TP rank holds an equal slice of a size divisible by
    ``divisible_by`` (megatron-lm's ``make_vocab_size_divisible_by`` x TP)."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


def build_gpt_model(
    shape: ModelShape,
    config,
    layer_spec,
    *,
    padded_vocab: int,
    pre_process: bool,
    post_process: bool,
    vp_stage: int | None = None,
):
    """One pipeline stage's ``GPTModel``: embedding on the first stage (``pre_process``), final norm and
    output layer on the last (``post_process``). Output logits stay vocab-parallel (split over TP)."""
    from megatron.core.models.gpt import GPTModel

    model = GPTModel(
        config=config,
        transformer_layer_spec=layer_spec,
        vocab_size=padded_vocab,
        max_sequence_length=shape.max_positions,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=shape.tie_embeddings,
        position_embedding_type="rope",
        rotary_base=shape.rope_theta,
        vp_stage=vp_stage,
    )
    if shape.value_head and post_process:
        from verl.engines.megatron.value_head import ValueHead

        if config.sequence_parallel:
            raise NotImplementedError("the megatron value model does not support sequence_parallel yet")
        model.output_layer = ValueHead(shape.hidden_size, shape.value_head_bias, config.params_dtype)
    return model
