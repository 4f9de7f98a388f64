"""A Llama-family decoder layer's decode step as a dozen direct calls (eager CPU decode with the fused kernels).

With the products on oneDNN (``packed_linear``) and the small operations in the fused kernels
(``cpu_kernels``), a SmolLM2 decode step at 16 rows still spent ~5 ms of its ~55 in Python: transformers'
decoder layer is four modules deep (layer, attention, MLP, projections), each call going through
``nn.Module.__call__``, the deprecation wrapper of the cache argument, keyword handling and views. For the
duration of a generate, each decoder layer of the Llama layout (input RMSNorm; q/k/v/o attention;
post-attention RMSNorm; gated SiLU MLP: Llama, Mistral, Qwen2, SmolLM2) gets a forward that makes the same
computations directly, for one-token steps against transformers' ``StaticCache`` (or the static path's
shared prompt cache, ``shared_prefix``, whose own update and attention it then calls):

    rms_norm -> q/k/v as one product -> rotary -> the new keys/values written into their slots ->
    the decode attention -> o_proj with the residual added by oneDNN (a binary post-op) -> rms_norm ->
    gate/up as one product -> silu(gate) * up -> down_proj with the residual added

These are the same products on the same reordered weights and the same kernels that transformers' layer
runs through under ``packed_linear_weights`` and ``fused_cpu_kernels``, and oneDNN's added residual rounds
as ``residual + product`` does, so the output is transformers' layer's to the bit (tested). Over
transformers' static cache the whole step is one call into C++ (``cpu_kernels.cpp``'s ``LayerStep``, built
once per layer and generate on its packed weights): the same kernels and oneDNN products in the same order,
without a Python call or argument conversion between them (41.1 against 43.2 ms a SmolLM2 step at 16 rows,
in turns in one process). Over the shared prompt cache, whose update and attention are its own Python, the
step makes its calls from Python. A layer class
is taken only after a probe shows that its forward computes the same (once per class, a decode step on
random inputs against its own forward, to fp32 rounding: a model loaded with another attention function
than verl's rounds its softmax differently); what a layer's class cannot tell, its configuration (activation, norms, head sizes, biases, packed
weights), is checked per layer. Any other call (a prefill, another cache, gradients, another dtype) goes to
the layer's own forward.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
from typing import Any

import torch

from verl.engines.rollout.hf import gqa_attention
from verl.engines.rollout.hf.packed_linear import onednn_linear, packed_product

LAYER_CHILDREN = frozenset({"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"})
ATTENTION_CHILDREN = frozenset({"q_proj", "k_proj", "v_proj", "o_proj"})
MLP_CHILDREN = frozenset({"gate_proj", "up_proj", "down_proj", "act_fn"})


@dataclasses.dataclass(frozen=True)
class LayerWeights:
    """What one decoder layer's fused step reads: its norms, its packed products and its attention shape."""

    index: int
    input_norm: torch.Tensor
    input_eps: float
    qkv: tuple[torch.Tensor, torch.Tensor | None]
    o: tuple[torch.Tensor, torch.Tensor | None]
    post_norm: torch.Tensor
    post_eps: float
    gate_up: tuple[torch.Tensor, torch.Tensor | None]
    down: tuple[torch.Tensor, torch.Tensor | None]
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    scale: float
    #: The step as one native call over a static cache (``cpu_kernels.cpp``'s ``LayerStep``), or None.
    native: Any = None


def binary_linear_unsupported_reason() -> str | None:
    """None when this torch has oneDNN's linear with an added tensor (``_linear_pointwise.binary``)."""
    try:
        torch.ops.mkldnn._linear_pointwise.binary  # noqa: B018  (resolving the overload is the check)
    except (AttributeError, RuntimeError) as exc:
        return f"torch {torch.__version__} lacks oneDNN's linear with a binary post-op ({exc})"
    return None


@functools.cache
def _is_silu(activation_class: type) -> bool:
    """Whether ``activation_class()`` computes ``F.silu`` (bit for bit, on random inputs)."""
    try:
        activation = activation_class()
        x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)) * 4
        return torch.equal(activation(x), torch.nn.functional.silu(x))
    except Exception:  # noqa: BLE001  (an activation with constructor arguments is not SiLU's)
        return False


def _children(module: torch.nn.Module) -> frozenset[str]:
    return frozenset(name for name, _ in module.named_children())


def layer_weights(layer: Any, norms: dict[Any, float]) -> LayerWeights | None:
    """The fused step's inputs for ``layer`` when it has the Llama layout, its norms are kernel norms
    (``norms``: module -> epsilon) and its projections are packed; else None."""
    if _children(layer) != LAYER_CHILDREN:
        return None
    attention, mlp = layer.self_attn, layer.mlp
    if _children(attention) != ATTENTION_CHILDREN or _children(mlp) != MLP_CHILDREN:
        return None
    if (
        not _is_silu(type(mlp.act_fn))  # type: ignore[arg-type]
        or layer.input_layernorm not in norms
        or layer.post_attention_layernorm not in norms
    ):
        return None
    if layer.training and getattr(attention, "attention_dropout", 0.0):
        return None  # the step has no dropout
    q, k, v = attention.q_proj, attention.k_proj, attention.v_proj
    # Packed implies plain nn.Linear layers (not LoRA-wrapped ones), whose sizes are then read below.
    products = (
        packed_product([q, k, v]),
        packed_product([attention.o_proj]),
        packed_product([mlp.gate_proj, mlp.up_proj]),
        packed_product([mlp.down_proj]),
    )
    if any(p is None for p in products):
        return None
    qkv, o, gate_up, down = products
    head_dim, index, scale = (getattr(attention, name, None) for name in ("head_dim", "layer_idx", "scaling"))
    if not (isinstance(head_dim, int) and isinstance(index, int) and isinstance(scale, float)):
        return None
    if head_dim <= 0 or head_dim % 8 or q.out_features % head_dim or k.out_features % head_dim:
        return None
    heads, kv_heads = q.out_features // head_dim, k.out_features // head_dim
    if v.out_features != k.out_features or heads % kv_heads or attention.o_proj.in_features != heads * head_dim:
        return None
    return LayerWeights(
        index=index,
        input_norm=layer.input_layernorm.weight,
        input_eps=norms[layer.input_layernorm],
        qkv=qkv,  # type: ignore[arg-type]
        o=o,  # type: ignore[arg-type]
        post_norm=layer.post_attention_layernorm.weight,
        post_eps=norms[layer.post_attention_layernorm],
        gate_up=gate_up,  # type: ignore[arg-type]
        down=down,  # type: ignore[arg-type]
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=mlp.gate_proj.out_features,
        scale=scale,
    )


@functools.cache
def _cache_layer_types() -> dict[Any, Any]:
    """The caches the fused step writes to, each with the type of its layers: transformers' own static
    cache, and the static path's shared prompt cache (``shared_prefix``), which attends itself."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    from verl.engines.rollout.hf.shared_prefix import SharedPrefixCache, SharedPrefixLayer

    return {StaticCache: StaticLayer, SharedPrefixCache: SharedPrefixLayer}


def _decode_step_slots(hidden: torch.Tensor, args: tuple, kwargs: dict, w: LayerWeights):
    """The cache layer this call writes to, if it is a step the fused forward takes, else None."""
    if args or kwargs.get("output_attentions") or torch.is_grad_enabled() or hidden.dim() != 3 or hidden.shape[1] != 1:
        return None
    cache: Any = kwargs.get("cache", kwargs.get("past_key_values"))
    # Exactly these classes: a subclass (an offloading cache, a sliding-window layer) keeps its own update.
    layer_type = _cache_layer_types().get(type(cache))
    if layer_type is None or getattr(cache, "offloading", False) or w.index >= len(cache.layers):
        return None
    slots = cache.layers[w.index]
    mask, embeddings = kwargs.get("attention_mask"), kwargs.get("position_embeddings")
    if type(slots) is not layer_type or not slots.is_initialized or mask is None or embeddings is None:
        return None
    rows, cos = hidden.shape[0], embeddings[0]
    if not (
        hidden.dtype == torch.float32
        and hidden.is_cpu
        and mask.dim() == 4
        and mask.shape[:3] == (rows, 1, 1)
        and mask.shape[3] >= slots.max_cache_len
        and cos.dim() == 3
        and cos.shape[0] in (1, rows)
        and cos.shape[1:] == (1, w.head_dim)
        and cos.dtype == torch.float32
        and int(slots.cumulative_length) < slots.max_cache_len
    ):
        return None
    return slots


def native_step(w: LayerWeights, ops: Any) -> Any:
    """The C++ ``LayerStep`` for ``w``'s layer (the operations below, without Python between them), or None
    where the kernels' attention does not take its heads (it then keeps the step below)."""
    if w.head_dim > ops.MAX_HEAD_DIM:
        return None
    return ops.LayerStep(
        w.input_norm, w.input_eps, *w.qkv, *w.o, w.post_norm, w.post_eps, *w.gate_up, *w.down,
        w.heads, w.kv_heads, w.head_dim, w.intermediate, w.scale,
    )  # fmt: skip


def fused_step(w: LayerWeights, ops: Any, hidden_states: torch.Tensor, slots, mask, embeddings) -> torch.Tensor:
    """One decode step of the layer ``w`` describes: ``hidden_states`` [b, 1, hidden], its keys and values
    written into the cache layer ``slots`` (a static one, or a shared prompt cache's, which attends itself),
    ``mask`` [b, 1, 1, >= slots], ``embeddings`` (cos, sin). Over a static cache, ``w.native`` makes the
    same calls in C++ (bit-equal: the same kernels and products in the same order)."""
    additive, attended = gqa_attention._ADDITIVE_MASK.of(mask, torch.float32)
    cos, sin = embeddings
    if w.native is not None and not hasattr(slots, "attend"):
        return w.native(hidden_states, cos, sin, slots.keys, slots.values, slots.cumulative_length, additive, attended)
    rows, d = hidden_states.shape[0], w.head_dim
    q_width, k_width = w.heads * d, w.kv_heads * d
    x = ops.rms_norm(hidden_states, w.input_norm, w.input_eps)
    qkv = onednn_linear(x, *w.qkv)
    q = qkv[..., :q_width].view(rows, 1, w.heads, d).transpose(1, 2)
    k = qkv[..., q_width : q_width + k_width].view(rows, 1, w.kv_heads, d).transpose(1, 2)
    v = qkv[..., q_width + k_width :].view(rows, 1, w.kv_heads, d).transpose(1, 2)
    q, k = ops.rotary(q, k, cos.expand(rows, 1, d), sin.expand(rows, 1, d))
    if hasattr(slots, "attend"):  # the shared prompt cache: its own update and attention, as the layer's path
        slots.update(k, v)
        attention = slots.attend(q, additive, attended, w.scale)
    else:  # the one-query attention the layer's own path takes (the kernel, or torch where it declines)
        ops.write_slots(slots.keys, slots.values, k, v, slots.cumulative_length)
        attention = gqa_attention._single_query_attention(q, slots.keys, slots.values, additive, attended, w.scale)
    # oneDNN adds the residual as the product is written: the same rounding as `residual + product`.
    linear_add = torch.ops.mkldnn._linear_pointwise.binary
    hidden = linear_add(attention.reshape(rows, 1, q_width), hidden_states, w.o[0], w.o[1], "add")
    gate_up = onednn_linear(ops.rms_norm(hidden, w.post_norm, w.post_eps), *w.gate_up)
    gated = torch.nn.functional.silu(gate_up[..., : w.intermediate]) * gate_up[..., w.intermediate :]
    return linear_add(gated, hidden, w.down[0], w.down[1], "add")


def fused_forward(layer: torch.nn.Module, w: LayerWeights, ops: Any):
    """``layer``'s forward: :func:`fused_step` where :func:`_decode_step_slots` takes the call, else its own."""
    original = type(layer).forward

    def forward(hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        slots = _decode_step_slots(hidden_states, args, kwargs, w)
        if slots is None:
            return original(layer, hidden_states, *args, **kwargs)
        return fused_step(w, ops, hidden_states, slots, kwargs["attention_mask"], kwargs["position_embeddings"])

    return forward


def _probe_inputs(w: LayerWeights, slots: int = 5):
    """A prefill of 3 tokens and then one decode step, for 2 rows (the second left-padded by one token at
    the step), on random numbers: (prefill, step) hidden states, (prefill, step) (cos, sin), masks."""
    generator = torch.Generator().manual_seed(0)
    hidden = w.input_norm.shape[0]
    states = [torch.randn(2, n, hidden, generator=generator) for n in (3, 1)]
    angles = [tuple(torch.randn(2, n, w.head_dim, generator=generator) for _ in range(2)) for n in (3, 1)]
    causal = torch.ones(3, slots, dtype=torch.bool).tril()
    prefill_mask = causal[None, None].expand(2, 1, 3, slots)
    step_mask = torch.zeros(2, 1, 1, slots, dtype=torch.bool)
    step_mask[..., :4] = True  # the prefill's 3 slots and the step's own; the last one is not written yet
    step_mask[1, ..., 0] = False
    return states, angles, (prefill_mask, step_mask)


#: Layer classes whose forward the probe found equal to the fused step's (True) or not (False).
_PROBED: dict[type, bool] = {}


def _class_matches(layer: torch.nn.Module, w: LayerWeights, ops: Any, config: Any) -> bool:
    """Whether ``type(layer).forward`` computes :func:`fused_step`: probed once per class, on this layer
    with random inputs (a prefill through its own forward, then one step each way, outputs and caches
    compared)."""
    cls = type(layer)
    if cls not in _PROBED:
        from verl.engines.rollout.hf.transformers_compat import _forward_parameters, new_static_cache

        cache_name = "cache" if "cache" in _forward_parameters(cls) else "past_key_values"
        (prefill, step), (prefill_angles, step_angles), (prefill_mask, step_mask) = _probe_inputs(w)
        outputs, caches = [], []
        try:
            with torch.no_grad():
                for fused in (False, True):
                    cache = new_static_cache(config, step_mask.shape[-1])
                    kwargs = {"attention_mask": prefill_mask, "position_embeddings": prefill_angles, cache_name: cache}
                    cls.forward(layer, prefill, **kwargs)
                    kwargs.update(attention_mask=step_mask, position_embeddings=step_angles)
                    slots = _decode_step_slots(step, (), kwargs, w) if fused else None
                    if fused and slots is None:
                        raise ValueError("the probe's step is not one the fused forward takes")
                    outputs.append(
                        fused_step(w, ops, step, slots, step_mask, step_angles)
                        if fused
                        else cls.forward(layer, step, **kwargs)
                    )
                    caches.append(cache.layers[w.index])
            same = (
                isinstance(outputs[0], torch.Tensor)
                and outputs[0].shape == outputs[1].shape
                and torch.allclose(outputs[0], outputs[1], rtol=1e-5, atol=1e-5)
                and torch.equal(caches[0].keys, caches[1].keys)
                and torch.equal(caches[0].values, caches[1].values)
                and int(caches[0].cumulative_length) == int(caches[1].cumulative_length) == 4
            )
        except Exception:  # noqa: BLE001  (a forward with another signature is not the fused step's)
            same = False
        _PROBED[cls] = same
    return _PROBED[cls]


@contextlib.contextmanager
def fused_decoder_layers(model: torch.nn.Module, norms: dict[Any, float], rotary_modules: list, ops: Any):
    """Within the block, the decode steps of ``model``'s Llama-layout decoder layers go through
    :func:`fused_forward`. Needs ``packed_linear_weights`` and the kernels' norms (``norms``), rotary
    embedding (``rotary_modules``: the modeling modules whose ``apply_rotary_pos_emb`` the kernel replaced)
    and cache update in place. Yields the number of layers replaced."""
    replaced = []
    if binary_linear_unsupported_reason() is None:
        for layer in model.modules():
            w = layer_weights(layer, norms)
            if w is None or sys.modules.get(type(layer.self_attn).__module__) not in rotary_modules:
                continue
            w = dataclasses.replace(w, native=native_step(w, ops))
            if _class_matches(layer, w, ops, model.config):
                replaced.append((layer, fused_forward(layer, w, ops)))
    try:
        for layer, forward in replaced:
            layer.forward = forward
        yield len(replaced)
    finally:
        for layer, _ in replaced:
            layer.__dict__.pop("forward", None)
