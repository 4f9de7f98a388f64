"""One copy of a prompt's keys and values for all its samples while they decode (cascade attention).

The static decode path prefills each prompt once. Repeating that cache for the n samples
(``Cache.reorder_cache``) makes every decode step read the prompt's keys and values n times in every
layer. (In a profile of a batch-16 SmolLM2 step without its weight products, the attention's two batched
products were 4.4 of its 12 ms.)

Here each layer keeps the prompt part once per prompt ([prompts, kv heads, P, d]) and only the response
part per sample ([prompts, kv heads, samples, W, d]). The decode attention (``gqa_attention``) scores a step's
queries in two parts: all n samples' queries of a KV head against their prompt's keys as one product of
n x group rows, and each row against its own response keys. One softmax runs over both parts together,
so the result is the attention over the concatenated keys up to float32 rounding.

Rows stay in place (there is no ``reorder_cache``: it would break the prompt-major layout the shared
product relies on): a finished sample keeps its row, and its outputs are discarded. Once enough rows have
finished to be dropped, the decode continues on a plain static cache of the remaining rows, each with its
prompt's part repeated (:meth:`SharedPrefixCache.repeated`).

What guards against a wrong answer: a model whose attention does not call ``gqa_attention``'s function
with these keys would attend to the response keys only. Each layer marks its keys unread on ``update``;
the shared-prefix attention marks them read; :meth:`SharedPrefixCache.check_attended` raises after a
step if any layer was not attended this way.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, StaticLayer

from verl.engines.rollout.hf.gqa_attention import register_key_owner


class SharedPrefixLayer(StaticLayer):
    """A static layer of ``P + width`` slots whose first ``P`` (the prompts') are held once per prompt.

    Slot numbering, the mask's width and the sequence length are a ``StaticLayer``'s of ``P + width``
    slots, so transformers builds the same mask and positions as for the repeated cache. The response
    part (``keys``/``values``) is laid out [prompts, kv heads, samples, width, d], so that the attention's
    scores over both parts share one layout, [prompts, kv heads, samples, group, keys], and meet without
    reordering; ``update`` hands it to the attention in that layout, which only :meth:`attend` reads."""

    def __init__(self, prompt_keys: torch.Tensor, prompt_values: torch.Tensor, samples: int, width: int):
        prompts, kv_heads, prompt_len, head_dim = prompt_keys.shape
        super().__init__(max_cache_len=prompt_len + width)
        self.prompt_keys, self.prompt_values = prompt_keys, prompt_values
        self.samples, self.prompt_len = samples, prompt_len
        self.device = prompt_keys.device
        self.batch_size, self.num_heads = prompts * samples, kv_heads
        self.k_head_dim, self.v_head_dim = head_dim, prompt_values.shape[-1]
        self.own_keys = prompt_keys.new_zeros(prompts, kv_heads, samples, width, head_dim)
        self.own_values = prompt_values.new_zeros(prompts, kv_heads, samples, width, self.v_head_dim)
        self.keys, self.values = self.own_keys, self.own_values
        self.cumulative_length = torch.tensor(prompt_len, dtype=torch.long, device=self.device)
        self.is_initialized = True
        self.unread = False
        register_key_owner(self.keys, self)  # the decode attention hands steps over these keys to attend()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Writes the step's keys and values [rows, kv heads, t, d] into the response slots; returns the
        response part only (the attention takes the prompt part from this layer)."""
        prompts, kv_heads, samples = self.own_keys.shape[:3]
        slots = torch.arange(key_states.shape[-2], device=self.device) + (self.cumulative_length - self.prompt_len)
        self.cumulative_length.add_(key_states.shape[-2])
        for part, states in ((self.own_keys, key_states), (self.own_values, value_states)):
            part.index_copy_(3, slots, states.view(prompts, samples, kv_heads, -1, states.shape[-1]).transpose(1, 2))
        self.unread = True
        return self.own_keys, self.own_values

    def attend(self, query: torch.Tensor, additive: torch.Tensor, attended: int, scale: float) -> torch.Tensor:
        return shared_prefix_attention(query, self, additive, attended, scale)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("a shared-prefix cache keeps its rows in place (prompt-major, n per prompt)")

    def reset(self) -> None:
        raise NotImplementedError("a shared-prefix cache is built for one generate and not reset")

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a shared-prefix cache is not cropped")


class SharedPrefixCache(Cache):
    """The decode cache of ``prompts x samples`` rows (prompt-major) over a prefilled cache of the prompts."""

    def __init__(self, prefilled: Cache, samples: int, width: int):
        self.shared_layers = [SharedPrefixLayer(*_prefilled_part(layer), samples, width) for layer in prefilled.layers]
        super().__init__(layers=list(self.shared_layers))

    def repeated(self, config, rows: torch.Tensor) -> Cache:
        """A plain static cache of ``rows`` (indices in this cache's prompt-major order), each with its
        prompt's part repeated before its own: what a decode continues with once rows leave the batch."""
        from verl.engines.rollout.hf.transformers_compat import new_static_cache

        samples = self.shared_layers[0].samples
        prompt_of, sample_of = rows // samples, rows % samples
        cache = new_static_cache(config, self.shared_layers[0].max_cache_len)
        for layer, shared in zip(cache.layers, self.shared_layers, strict=True):
            written = int(shared.cumulative_length) - shared.prompt_len
            # [prompts, kv heads, samples, W, d] -> the rows' written [rows, kv heads, written, d], after their
            # prompt's part; the static layer's own update allocates it and takes its length from them.
            keys, values = (
                torch.cat([prompt_part[prompt_of], own.permute(0, 2, 1, 3, 4)[prompt_of, sample_of, :, :written]], 2)
                for prompt_part, own in (
                    (shared.prompt_keys, shared.own_keys),
                    (shared.prompt_values, shared.own_values),
                )
            )
            layer.update(keys, values)
        return cache

    def check_attended(self) -> None:
        """Raises unless every layer's attention of the last step went through the shared prefix."""
        missed = [i for i, layer in enumerate(self.shared_layers) if layer.unread]
        if missed:
            raise RuntimeError(
                f"layers {missed} did not attend through the shared prompt keys (their attention is not the hf "
                "rollout's CPU decode attention); set actor_rollout_ref.rollout.engine_kwargs.shared_prefix=false"
            )


def _prefilled_part(layer) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(layer, StaticLayer) and layer.keys is not None and layer.values is not None):
        raise TypeError(f"a shared-prefix cache is built over a prefilled static cache, not {type(layer).__name__}")
    return layer.keys, layer.values


def supports_shared_prefix(cache: Cache) -> bool:
    """Every layer of a (new) static cache a plain full-attention one (not sliding-window, not linear
    attention, whose state is not keys and values by position)."""
    return all(type(layer) is StaticLayer for layer in cache.layers)


def shared_prefix_attention(
    query: torch.Tensor, layer: SharedPrefixLayer, additive: torch.Tensor, attended: int, scale: float
) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v for one query per row [rows, heads, 1, d] over the prompt's keys
    (once per prompt) followed by the row's own response keys; ``additive`` [rows, 1, 1, >= attended] is the
    mask over all ``P + width`` slots, ``attended`` the slots any row attends to. Returns [rows, 1, heads, d]."""
    rows, heads, _, dim = query.shape
    prompts, kv_heads, prompt_len, _ = layer.prompt_keys.shape
    samples, group = layer.samples, heads // kv_heads
    own = attended - prompt_len  # response slots written so far (>= 1: the step's own key)
    # [prompts, kv heads, samples, group, d]: a KV head's queries of all samples of a prompt together.
    q = query.reshape(prompts, samples, kv_heads, group, dim).transpose(1, 2).contiguous()
    prompt_scores = torch.matmul(q.view(prompts, kv_heads, -1, dim), layer.prompt_keys.transpose(-1, -2))
    own_scores = torch.matmul(q, layer.own_keys[..., :own, :].transpose(-1, -2))  # [u, kv, n, g, own]
    shape = (prompts, kv_heads, samples, group)
    scores = torch.cat([prompt_scores.view(*shape, prompt_len), own_scores], dim=-1)  # [u, kv, n, g, attended]
    # The mask [rows, 1, 1, s] as [prompts, 1, samples, 1, s], broadcast over KV heads and query rows.
    mask = additive[..., :attended].view(prompts, 1, samples, 1, attended)
    probs = torch.softmax(scores.mul_(scale).add_(mask), dim=-1)
    out = torch.matmul(probs[..., prompt_len:], layer.own_values[..., :own, :])  # [u, kv, n, g, d]
    prompt_probs = probs[..., :prompt_len].reshape(prompts, kv_heads, -1, prompt_len)
    out.view(prompts, kv_heads, -1, dim).add_(torch.matmul(prompt_probs, layer.prompt_values))
    layer.unread = False
    return out.transpose(1, 2).reshape(rows, 1, heads, dim)
