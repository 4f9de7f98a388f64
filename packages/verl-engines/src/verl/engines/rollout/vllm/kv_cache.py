"""The size of vLLM's KV cache on CPU, from the run's own batch and lengths.

On CPU vLLM reads ``gpu_memory_utilization`` as a fraction of *all* host memory and refuses to start
when that much is not free, which on a machine shared with the trainer is the usual case. So the
vllm rollout gives vLLM an explicit ``kv_cache_memory_bytes`` that it computes from what the run will
ask of it: every sequence of its largest generation call in flight at once, each as long as it can
get::

    sequences = max over the run's generation calls of min(prompts on this engine x n, max_num_seqs)
    blocks    = ceil(sequences x ceil(max_model_len / block_size) x (1 + MARGIN)) + 1 null block
    bytes     = blocks x block_size x (layers x 2 x kv_heads x head_dim x dtype bytes)

- Whole blocks per sequence: vLLM hands out KV memory in blocks of ``block_size`` tokens (128 on
  CPU), so a sequence holds ``ceil(length / block_size)`` of them; vLLM's block pool also keeps one
  null block back for good.
- The margin (:data:`MARGIN`) is for the bytes a token takes, which is computed here from
  ``config.json`` while vLLM computes it from its own attention layers: a model whose layers vLLM lays
  out differently (padded pages, a different cache dtype) would otherwise fit fewer sequences than
  planned. After start-up the engine reads the block count vLLM actually made and warns when it holds
  fewer sequences than planned (:func:`check_capacity`).
- The calls (:class:`GenerationBatch`) come from the worker: training (``data.train_batch_size`` over
  the data-parallel ranks, ``rollout.n``) and, when the run validates, validation
  (``data.val_batch_size`` or ``data.val_max_samples`` over the ranks, ``val_kwargs.n``). A call whose
  size is not known before the run (validation over the whole held-out set) counts as
  ``max_num_seqs`` sequences, which bounds how many vLLM runs at once anyway; no call counts as more.
  Measured with the tiny test model (`verl train`, 2 steps, validation over 64 prompts before and
  after): with the cache sized for the 4 training sequences only, validation ran in waves of 5 and the
  steps took 23 s; sized for the validation call as here, 2 s.
- The cache is capped at :data:`HOST_SHARE` of the host's free memory, split over the engines of this
  node. A smaller cache is not an error: vLLM then runs a generation call in waves (and preempts what
  does not fit), more slowly. Only a cache that cannot hold one full-length sequence is refused.

Explicit settings win: ``engine_kwargs.kv_cache_memory_bytes`` or ``engine_kwargs.num_gpu_blocks_override``
(vLLM's own arguments, passed unchanged) and the environment variable ``VLLM_CPU_KVCACHE_SPACE`` (GiB,
read by vLLM itself).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: vLLM's KV block size on CPU when none is given (``CpuPlatform.check_and_update_config``; attention
#: with a latent cache (MLA) uses 16 and DeepSeek-V4 256, which the capacity check would report).
CPU_BLOCK_SIZE = 128
#: vLLM's ``max_num_seqs`` on CPU when none is given (``EngineArgs.get_batch_defaults``, offline ``LLM``).
CPU_MAX_NUM_SEQS = 256
#: Extra blocks, as a fraction of the planned ones, for a per-token size vLLM computes differently.
MARGIN = 0.10
#: The most of the host's free memory the KV caches of this node's engines may take together: the
#: trainer's optimizer states and activations need the rest (they grow after the rollout is built).
HOST_SHARE = 0.25
#: Blocks vLLM's block pool keeps out of use (its null block).
RESERVED_BLOCKS = 1
EXPLICIT_KEYS = ("kv_cache_memory_bytes", "num_gpu_blocks_override")
ENV_KEY = "VLLM_CPU_KVCACHE_SPACE"
MIB = 1 << 20


def kv_cache_bytes_per_token(model_path: str, dtype_bytes: int) -> int:
    """K and V of every attention layer for one token, from the Hugging Face ``config.json``."""
    cfg = json.loads((Path(model_path) / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    try:
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise ValueError(
            f"cannot size the vllm rollout's KV cache: {model_path}/config.json lacks {exc} (needs num_hidden_layers, "
            "num_attention_heads, hidden_size or head_dim); set +actor_rollout_ref.rollout.engine_kwargs."
            "kv_cache_memory_bytes=<bytes>"
        ) from None
    return layers * 2 * kv_heads * head_dim * dtype_bytes


def model_max_len(model_path: str) -> int:
    """The longest sequence the model takes (vLLM's default ``max_model_len``), from ``config.json``."""
    cfg = json.loads((Path(model_path) / "config.json").read_text())
    length = cfg.get("text_config", cfg).get("max_position_embeddings")
    if not length:
        raise ValueError(
            f"cannot size the vllm rollout's KV cache: no sequence length is given and {model_path}/config.json has "
            "no max_position_embeddings; set data.max_prompt_length and data.max_response_length, or "
            "actor_rollout_ref.rollout.max_model_len"
        )
    return int(length)


@dataclass(frozen=True)
class KVCachePlan:
    """A KV cache size and how it was arrived at (``how``, for the log)."""

    bytes: int
    how: str
    #: Full-length sequences the cache should hold at once (0 when the size was given, not planned).
    sequences: int = 0
    max_model_len: int = 0


@dataclass(frozen=True)
class GenerationBatch:
    """One kind of generation call the engine serves in this run."""

    name: str
    #: Prompts of one call on this engine; None: not known before the run (a whole held-out set).
    prompts: int | None
    #: Samples per prompt.
    n: int = 1

    def sequences(self, max_num_seqs: int) -> tuple[int, str]:
        """How many sequences vLLM runs at once for this call, and how that was derived."""
        if self.prompts is None:
            return max_num_seqs, f"{self.name}: size known only at run time, at most max_num_seqs={max_num_seqs}"
        wanted = self.prompts * self.n
        capped = f", capped at max_num_seqs={max_num_seqs}" if wanted > max_num_seqs else ""
        return min(wanted, max_num_seqs), f"{self.name}: {self.prompts} prompts x n={self.n}{capped}"


def plan_kv_cache(
    *,
    bytes_per_token: int,
    max_model_len: int,
    batches: list[GenerationBatch],
    max_num_seqs: int | None,
    block_size: int | None,
    host_free_bytes: int,
    engines_on_host: int = 1,
) -> KVCachePlan:
    """The size for one engine, as the module docstring derives it: room for the largest of ``batches``
    (none given: a call of unknown size)."""
    block = block_size or CPU_BLOCK_SIZE
    seq_cap = max_num_seqs or CPU_MAX_NUM_SEQS
    calls = [b.sequences(seq_cap) for b in batches or [GenerationBatch("generation", None)]]
    sequences, source = max(calls, key=lambda call: call[0])
    per_sequence = math.ceil(max_model_len / block)
    planned = math.ceil(sequences * per_sequence * (1 + MARGIN)) + RESERVED_BLOCKS
    block_bytes = block * bytes_per_token
    how = (
        f"{sequences} sequences ({source}) x {per_sequence} blocks of {block} tokens (max_model_len={max_model_len}) "
        f"+{MARGIN:.0%} margin + {RESERVED_BLOCKS} null block = {planned} blocks x {bytes_per_token} B/token"
    )
    budget = int(host_free_bytes * HOST_SHARE) // max(engines_on_host, 1)
    if host_free_bytes and planned * block_bytes > budget:
        fitting = budget // block_bytes
        needed = per_sequence + RESERVED_BLOCKS
        if fitting < needed:
            raise ValueError(
                f"the vllm rollout's KV cache for one sequence of max_model_len={max_model_len} tokens needs "
                f"{needed * block_bytes / MIB:.1f} MiB, more than {HOST_SHARE:.0%} of this host's free memory "
                f"({host_free_bytes / MIB:.0f} MiB) split over {engines_on_host} engine(s): shorten "
                "data.max_prompt_length / data.max_response_length, free memory, or give the size with "
                "+actor_rollout_ref.rollout.engine_kwargs.kv_cache_memory_bytes=<bytes>"
            )
        how += (
            f"; capped at {HOST_SHARE:.0%} of free host memory / {engines_on_host} engine(s) = {fitting} blocks "
            f"({(fitting - RESERVED_BLOCKS) // per_sequence} full-length sequences at once: generation runs in waves)"
        )
        planned = fitting
        sequences = (fitting - RESERVED_BLOCKS) // per_sequence
    return KVCachePlan(planned * block_bytes, how, sequences, max_model_len)


def explicit_kv_cache(engine_kwargs: dict[str, Any]) -> str | None:
    """What sets the KV cache size when the user did (for the log), else None."""
    for key in EXPLICIT_KEYS:
        if engine_kwargs.get(key):
            return f"engine_kwargs.{key}={engine_kwargs[key]}"
    if os.environ.get(ENV_KEY):
        return f"{ENV_KEY}={os.environ[ENV_KEY]} GiB"
    return None


def check_capacity(plan: KVCachePlan, num_blocks: int | None, block_size: int | None) -> str | None:
    """A warning when the cache vLLM made (``num_blocks`` of ``block_size`` tokens, null block included)
    holds fewer full-length sequences than planned."""
    if not plan.sequences or not num_blocks or not block_size:
        return None
    held = (num_blocks - RESERVED_BLOCKS) // math.ceil(plan.max_model_len / block_size)
    if held >= plan.sequences:
        return None
    return (
        f"vLLM made {num_blocks} KV cache blocks of {block_size} tokens, room for {held} sequences of "
        f"{plan.max_model_len} tokens instead of the {plan.sequences} planned (its KV layout takes more than "
        "config.json suggests); generation runs in waves. Give the size with "
        "+actor_rollout_ref.rollout.engine_kwargs.kv_cache_memory_bytes=<bytes>"
    )
