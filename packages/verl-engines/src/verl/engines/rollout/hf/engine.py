"""The ``hf`` rollout engine: generation with a plain (unsharded) transformers model.

It decodes with the model's own forward and KV cache, one micro-batch of sequences at a time, and
chooses tokens itself (``verl.engines.rollout.sampling``) so that it can return the per-token
log-probs without keeping ``[steps, batch, vocab]`` scores around. It is the reference backend that
runs anywhere (CPU included) and the one the hybrid engine uses on CPU.

Decode paths (``cache_implementation``): "static" (default; ``static_decode``: left padding trimmed, each
prompt prefilled once for its n samples, a preallocated cache, finished rows dropped, optionally a
compiled step; for prompts of 128+ tokens on the CPU the samples read one copy of their prompt's keys and
values, ``shared_prefix``) and "dynamic" (``plain_decode``: the plain transformers loop, the reference). On the CPU,
grouped-query attention reads the KV cache in place (``gqa_attention``; a decode step's one query per row
as two batched products), and the fp32 linear layers run through oneDNN on weights reordered once per
``generate``, sibling projections (q/k/v, gate/up) as one product (``packed_linear``; skipped for a
generate whose free memory cannot hold the copy); on the static path the RMSNorms, the rotary embedding,
the decode attention and the cache update run through verl's fused C++ kernels (``cpu_kernels``, built on
first use with the machine's compiler), and, with the products packed too, a Llama-layout decoder layer's
decode step is a dozen direct calls instead of transformers' module tree (``fused_layer``). Greedy outputs
of every combination are the same token for token; each returns exact log-probs.

Weights: ``update_weights`` takes (Hugging Face name, full tensor) pairs; an MoE model's per-expert tensors
under the checkpoint's names go into transformers' fused expert parameters (``fused_experts``). A tensor with the target's
dtype, device and shape is *aliased* (the parameter is re-pointed at it, no copy) when
``share_weight_storage`` is on, otherwise copied in place. In a one-rank hybrid engine on CPU the
trainer yields its own parameter storage, so the rollout model then shares the training weights and
costs no memory (it then also follows every optimizer step without a sync: turn sharing off where a
frozen snapshot is needed); with more ranks it keeps the freshly gathered tensors, which is the one
full copy it needs anyway.

Log-probs (``SamplingParams.logprobs``): ``rollout_log_probs`` is ``log_softmax(logits / T)`` of each
sampled token over the whole vocabulary, before top-k/top-p truncation (T = 1 for greedy decoding):
exactly what the training engine recomputes from ``meta_info["temperature"]``, so the two agree to fp32
rounding when the weights are the same.

Sleep: ``sleep_level=1`` moves the weights to host memory (nothing to release on CPU: a reported
no-op); ``sleep_level=2`` drops them (on any device), and the next ``update_weights`` re-creates
them, which is what the hybrid engine wants since it refreshes the weights before every generation.
"""

from __future__ import annotations

import contextlib
import logging
import time

import torch

from verl.core.engine import LoRAAdapter, RolloutEngine, RolloutRegistry, SamplingParams
from verl.core.platform import get_platform
from verl.core.protocol import DataProto
from verl.engines.dtypes import parse_dtype
from verl.engines.lora_layout import hf_name, is_adapter_weight
from verl.engines.models import LANGUAGE_MODEL, load_model, named_weights
from verl.engines.rollout.hf.compiled_step import CompiledDecodeStep
from verl.engines.rollout.hf.config import HFRolloutConfig
from verl.engines.rollout.hf.cpu_kernels import build_seconds, cpu_kernels_unavailable_reason, fused_cpu_kernels
from verl.engines.rollout.hf.decode_common import DecodeSettings, DecodeStats
from verl.engines.rollout.hf.fused_experts import FusedExpertWeights
from verl.engines.rollout.hf.gqa_attention import gqa_attention_name
from verl.engines.rollout.hf.lora_adapter import inject_lora_layers, load_adapter_tensors, structure
from verl.engines.rollout.hf.packed_linear import (
    packable_weight_bytes,
    packed_linear_unsupported_reason,
    packed_linear_weights,
    reordered_copy_fits,
)
from verl.engines.rollout.hf.plain_decode import decode_plain
from verl.engines.rollout.hf.static_decode import decode_static
from verl.engines.rollout.hf.transformers_compat import static_cache_unsupported_reason
from verl.engines.rollout.output import assemble_rollout_output, check_left_padded
from verl.engines.rollout.special_tokens import resolve_special_tokens

logger = logging.getLogger(__name__)


@RolloutRegistry.register(backend="hf", device=["cpu", "cuda", "npu"])
class HFRolloutEngine(RolloutEngine):
    config_class = HFRolloutConfig
    supports_lora_adapters = True

    def __init__(self, config: HFRolloutConfig | dict):
        self.config = HFRolloutConfig(**config) if isinstance(config, dict) else config
        cfg = self.config
        self.platform = get_platform()
        self.device = self.platform.device()
        if cfg.dtype == "auto":
            bf16 = self.platform.device_name != "cpu" and self.platform.is_bf16_supported()
            self.dtype = torch.bfloat16 if bf16 else torch.float32
        else:
            self.dtype = parse_dtype(cfg.dtype, "rollout.dtype")
        model = load_model(
            cfg.model_path,
            LANGUAGE_MODEL,
            dtype=self.dtype,
            attn_implementation=self._attention(),
            trust_remote_code=cfg.trust_remote_code,
            weights=cfg.load_format == "hf",
            config_overrides=cfg.override_config,
        )
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.tokenizer = self._load_tokenizer()
        self.eos_token_ids, self.pad_token_id = self._special_tokens()
        self._index_weights()
        self._adapter_structure: dict | None = None  # the LoRA adapter's, once update_adapter injected it
        self._on_host = False  # sleep level 1
        self._dropped = False  # sleep level 2 (weights gone until update_weights)
        self._stop_criteria: dict[tuple[str, ...], object] = {}
        self._warned_sleep = False
        self.cache_implementation = self._choose_cache_implementation()
        self.compiled_step = self._compiled_step()
        self.packed_linear = self._use_packed_linear()
        self.shared_prefix = self._use_shared_prefix()
        self.cpu_kernels = self._use_cpu_kernels()
        self._warned_no_room = False

    def _attention(self) -> str:
        """sdpa with grouped KV heads read in place on the CPU (see ``gqa_attention``); else as configured."""
        if self.config.attn_implementation == "sdpa" and self.device.type == "cpu":
            return gqa_attention_name() or "sdpa"
        return self.config.attn_implementation

    def _choose_cache_implementation(self) -> str:
        if self.config.cache_implementation == "static":
            reason = static_cache_unsupported_reason()
            if reason is not None:
                if self.config.compile_decode:
                    raise ValueError(f"rollout compile_decode=true needs the static KV cache, but {reason}")
                logger.warning("hf rollout: decoding with the dynamic cache: %s (upgrade transformers)", reason)
                return "dynamic"
        return self.config.cache_implementation

    def _use_packed_linear(self) -> bool:
        """Whether generates reorder the weights for oneDNN: where possible, unless turned off."""
        wanted = self.config.packed_linear
        reason = packed_linear_unsupported_reason()
        if reason is None and self.device.type != "cpu":
            reason = f"it is for the CPU, and this rollout runs on {self.device.type}"
        if reason is None and self.dtype != torch.float32:
            reason = f"it is for fp32 weights, and this rollout's are {self.dtype}"
        if reason is None and self.compiled_step is not None:
            reason = "the decode step is compiled (packed weights are for the eager step)"
        return _where_possible("packed_linear", wanted, reason) is not False

    def _use_shared_prefix(self) -> bool | None:
        """Whether samples decode against one copy of their prompt's cache (see ``DecodeSettings``): only
        where the decode attention is the CPU one that takes it (static cache, eager step)."""
        wanted = self.config.shared_prefix
        reason = None
        if self.cache_implementation != "static":
            reason = f"the decode cache is {self.cache_implementation!r}, not 'static'"
        elif self.compiled_step is not None:
            reason = "the decode step is compiled"
        elif self.model.config._attn_implementation != gqa_attention_name():
            reason = (
                f"the attention is {self.model.config._attn_implementation!r}; the shared prompt cache is read by "
                "the CPU decode attention (attn_implementation='sdpa' on the CPU)"
            )
        return _where_possible("shared_prefix", wanted, reason)

    def _use_cpu_kernels(self) -> bool:
        """Whether generates run norms, rotary embedding and decode attention through the fused CPU kernels
        (``cpu_kernels``): where possible (building them here, at setup), unless turned off."""
        wanted = self.config.cpu_kernels
        if wanted is False:
            return False
        reason = None
        if self.device.type != "cpu":
            reason = f"they are for the CPU, and this rollout runs on {self.device.type}"
        elif self.dtype != torch.float32:
            reason = f"they are for fp32 weights, and this rollout's are {self.dtype}"
        elif self.cache_implementation != "static":
            reason = f"the decode cache is {self.cache_implementation!r} (transformers' own loop, the reference)"
        elif self.compiled_step is not None:
            reason = "the decode step is compiled (it fuses these operations itself)"
        else:
            reason = cpu_kernels_unavailable_reason()
            if reason is None:
                logger.info("hf rollout: verl's CPU kernels ready (%.1f s to build or load)", build_seconds())
            elif wanted is None:
                logger.warning(
                    "hf rollout: decoding without verl's CPU kernels: %s (cpu_kernels=false silences this)", reason
                )
        return _where_possible("cpu_kernels", wanted, reason) is not False

    def _pack_this_generate(self) -> bool:
        """The default packs only when the reordered copy fits in free memory now (the actor's optimizer
        state appears after the first generate); ``packed_linear=true`` packs regardless."""
        if not self.packed_linear:
            return False
        if self.config.packed_linear:
            return True
        copy_bytes = packable_weight_bytes(self.model)
        free, total = self.platform.mem_get_info()
        if reordered_copy_fits(copy_bytes, free, total):
            return True
        if not self._warned_no_room:
            logger.warning(
                "hf rollout: %.2f GB free cannot hold a %.2f GB oneDNN copy of the linear weights with room to "
                "spare; decoding through F.linear while that lasts (packed_linear=false silences this)",
                free / 1e9,
                copy_bytes / 1e9,
            )
            self._warned_no_room = True
        return False

    def _compiled_step(self) -> CompiledDecodeStep | None:
        wanted = self.config.compile_decode
        options = self.platform.decode_compile_options()
        if wanted is None:
            wanted = options is not None and self.cache_implementation == "static"
        if not wanted:
            return None
        return CompiledDecodeStep(options if options is not None else {"fullgraph": True})

    # -- setup --------------------------------------------------------------------------------------
    def _load_tokenizer(self):
        from transformers import AutoTokenizer

        path = self.config.tokenizer_path or self.config.model_path
        try:
            return AutoTokenizer.from_pretrained(path, trust_remote_code=self.config.trust_remote_code)
        except (OSError, ValueError) as exc:
            logger.info("hf rollout: no tokenizer in %s (%s); stop strings are unavailable", path, exc)
            return None

    def _special_tokens(self) -> tuple[list[int], int]:
        cfg = self.config
        return resolve_special_tokens(
            cfg.model_path,
            eos_override=cfg.eos_token_id,
            pad_override=cfg.pad_token_id,
            tokenizer=self.tokenizer,
            model_eos=getattr(self.model.config, "eos_token_id", None),
            model_pad=getattr(self.model.config, "pad_token_id", None),
        )

    # -- weights ------------------------------------------------------------------------------------
    def _index_weights(self) -> None:
        """The model's weights by Hugging Face name (with LoRA layers injected: the base weights)."""
        self._tensors = {hf_name(n): t for n, t in named_weights(self.model) if not is_adapter_weight(n)}
        self._shapes = {name: t.shape for name, t in self._tensors.items()}

    @property
    def weights_discarded(self) -> bool:  # type: ignore[override]
        return self._dropped

    def update_adapter(self, adapter: LoRAAdapter) -> None:
        """Serve a LoRA adapter in place (see ``lora_adapter``); the first call injects its layers."""
        if self._on_host:
            raise RuntimeError(
                "the hf rollout is asleep (weights in host memory); call wake_up() before update_adapter"
            )
        wanted = structure(adapter.config)
        if self._adapter_structure is None:
            inject_lora_layers(self.model, adapter.config)
            self.model.to(self.device)
            self._index_weights()
            self._adapter_structure = wanted
        elif wanted != self._adapter_structure:
            raise ValueError(
                f"update_adapter: the adapter's settings changed from {self._adapter_structure} to {wanted}; "
                "a rollout serves one adapter layout for its lifetime"
            )
        load_adapter_tensors(self.model, adapter)

    def update_weights(self, weights) -> None:
        if self._on_host:
            raise RuntimeError(
                "the hf rollout is asleep (weights in host memory); call wake_up() before update_weights"
            )
        updated = set()
        experts = FusedExpertWeights(self._tensors)
        with torch.no_grad():
            for name, tensor in weights:
                target = self._tensors.get(name)
                routed = experts.fused_name(name) if target is None else None
                if routed is not None:  # a checkpoint-format expert tensor: into its slice of the fused weight
                    self._copy_expert(experts, routed, name, tensor)
                    continue
                if target is None:
                    raise KeyError(
                        f"update_weights: {name!r} is not a weight of the rollout model "
                        f"({type(self.model).__name__}); are trainer and rollout built from the same model?"
                    )
                shape = self._shapes[name]
                if tensor.shape != shape:
                    raise ValueError(
                        f"update_weights: {name!r} has shape {tuple(tensor.shape)}, expected {tuple(shape)}"
                    )
                if self.config.share_weight_storage and tensor.device == self.device and tensor.dtype == self.dtype:
                    target.data = tensor.detach()
                else:
                    if target.numel() != tensor.numel():  # dropped by sleep(level=2)
                        target.data = torch.empty(shape, dtype=self.dtype, device=self.device)
                    target.copy_(tensor)
                updated.add(name)
        missing = sorted(set(self._tensors) - updated - experts.complete())
        if missing and self._dropped:
            raise RuntimeError(
                f"update_weights after sleep(level=2) must provide every weight; missing {missing[:5]}"
                f"{' ...' if len(missing) > 5 else ''}"
            )
        if missing:
            logger.warning("update_weights left %d weights unchanged: %s", len(missing), missing[:5])
        self._dropped = False

    def _copy_expert(self, experts: FusedExpertWeights, routed: tuple[str, int, str], name: str, tensor) -> None:
        fused = routed[0]
        if self._tensors[fused].numel() == 0:  # dropped by sleep(level=2)
            self._tensors[fused].data = torch.empty(self._shapes[fused], dtype=self.dtype, device=self.device)
        target = experts.target(*routed)
        if tensor.shape != target.shape:
            raise ValueError(
                f"update_weights: {name!r} has shape {tuple(tensor.shape)}, expected {tuple(target.shape)} "
                f"(its slice of {fused!r})"
            )
        target.copy_(tensor)
        experts.received(*routed)

    # -- memory -------------------------------------------------------------------------------------
    @property
    def supports_sleep(self) -> bool:  # type: ignore[override]
        return self.config.sleep_level == 2 or self.device.type != "cpu"

    def sleep(self) -> bool:
        if not self.supports_sleep:
            if not self._warned_sleep:
                logger.info(
                    "hf rollout on cpu with sleep_level=1: weights already live in host memory; sleep is a no-op"
                )
                self._warned_sleep = True
            return False
        with torch.no_grad():
            if self.config.sleep_level == 2:
                for tensor in self._tensors.values():
                    tensor.data = torch.empty(0, dtype=tensor.dtype, device=self.device)
                self._dropped = True
            elif not self._on_host:
                self.model.to("cpu")
                self._on_host = True
        self.platform.empty_cache()
        return True

    def wake_up(self) -> bool:
        if not self.supports_sleep:
            return False
        if self._on_host:
            self.model.to(self.device)
            self._on_host = False
        # sleep_level=2: memory is retaken by the next update_weights, which brings the weights.
        return True

    # -- generation ---------------------------------------------------------------------------------
    def generate(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        if self._dropped or self._on_host:
            raise RuntimeError(
                "the hf rollout is asleep; call wake_up() and (after sleep_level=2) update_weights() before generate"
            )
        t = prompts.tensors
        input_ids, attention_mask, position_ids = t["input_ids"], t["attention_mask"], t["position_ids"]
        check_left_padded(attention_mask)
        rows = len(prompts) * sampling.n
        source_rows = torch.arange(len(prompts)).repeat_interleave(sampling.n)
        responses = torch.full((rows, sampling.max_new_tokens), self.pad_token_id, dtype=input_ids.dtype)
        lengths = torch.zeros(rows, dtype=torch.long)
        logprobs = torch.zeros(rows, sampling.max_new_tokens, dtype=torch.float32)
        generator = None
        if sampling.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(sampling.seed)
        stop = self._stop_criterion(sampling.stop)
        settings = DecodeSettings(self.pad_token_id, tuple(self.eos_token_ids), self.device, self.shared_prefix)
        stats = DecodeStats()
        pack = self._pack_this_generate()
        pack_start = time.perf_counter()
        packing = (
            packed_linear_weights(self.model, min(rows, self.config.micro_batch_size))
            if pack
            else contextlib.nullcontext()
        )
        kernels = fused_cpu_kernels(self.model) if self.cpu_kernels else contextlib.nullcontext({"layers": 0})
        with torch.no_grad(), packing, kernels as replaced:
            pack_s = time.perf_counter() - pack_start
            for start in range(0, rows, self.config.micro_batch_size):
                sel = source_rows[start : start + self.config.micro_batch_size]
                out = self._decode((input_ids, attention_mask, position_ids), sel, sampling, generator, stop, settings)
                end = start + len(sel)
                responses[start:end], lengths[start:end], logprobs[start:end] = out.tokens, out.lengths, out.logprobs
                stats.add(out.stats)
        output = assemble_rollout_output(
            prompts, sampling.n, responses, lengths, logprobs if sampling.logprobs else None
        )
        metrics = self._metrics(stats)
        metrics["rollout/packed_linear"] = float(pack)
        metrics["rollout/shared_prefix"] = stats.shared_prefix_rows / rows if rows else 0.0
        metrics["rollout/cpu_kernels"] = float(self.cpu_kernels)
        # Decoder layers whose decode steps go through fused_layer in this generate (0 without packing or kernels).
        metrics["rollout/fused_decoder_layers"] = float(replaced["layers"])
        if self.cpu_kernels:  # the seconds this process paid once, at setup, to build (or load) them
            metrics["timing_s/rollout_cpu_kernels_build"] = build_seconds()
        if pack:
            metrics["timing_s/rollout_pack_weights"] = pack_s
        output.meta_info.setdefault("metrics", {}).update(metrics)
        return output

    def _decode(self, prompts, sel: torch.Tensor, sampling: SamplingParams, generator, stop, settings):
        """One micro-batch: rows ``sel`` of the prompts (each prompt's samples consecutive)."""
        input_ids, attention_mask, position_ids = prompts
        if self.cache_implementation == "static":
            unique, repeats = torch.unique_consecutive(sel, return_counts=True)
            return decode_static(
                self.model,
                input_ids[unique],
                attention_mask[unique],
                position_ids[unique],
                repeats,
                sampling,
                generator,
                stop,
                settings,
                self.compiled_step,
            )
        return decode_plain(
            self.model, input_ids[sel], attention_mask[sel], position_ids[sel], sampling, generator, stop, settings
        )

    def _metrics(self, stats: DecodeStats) -> dict[str, float]:
        """Where generation time went, for the trainer's metrics (``timing_s/*`` and ``rollout/*``)."""
        metrics = {
            "timing_s/rollout_prefill": stats.prefill_s,
            "timing_s/rollout_decode": stats.decode_s,
            "rollout/decode_steps": float(stats.steps),
            "rollout/decode_rows_per_step": stats.row_steps / stats.steps if stats.steps else 0.0,
            "rollout/prefill_tokens": float(stats.prefill_tokens),
        }
        if self.compiled_step is not None:
            metrics["timing_s/rollout_compile"] = stats.compile_s
        return metrics

    def _stop_criterion(self, stop: list[str]):
        if not stop:
            return None
        if self.tokenizer is None:
            raise ValueError(
                f"stop strings {stop} need a tokenizer, and none was found in "
                f"{self.config.tokenizer_path or self.config.model_path!r}; set rollout tokenizer_path"
            )
        key = tuple(stop)
        if key not in self._stop_criteria:
            from transformers.generation.stopping_criteria import StopStringCriteria

            self._stop_criteria[key] = StopStringCriteria(self.tokenizer, list(stop))
        return self._stop_criteria[key]


def _where_possible(key: str, wanted: bool | None, reason: str | None) -> bool | None:
    """A decode-path switch (None: where possible, true: required, false: off) given why it is impossible
    here (None: possible): False where impossible, an error where required and impossible, else ``wanted``."""
    if reason is None:
        return wanted
    if wanted:
        raise ValueError(f"rollout {key}=true cannot be honoured: {reason}; leave it false")
    return False
