"""The ``hf`` rollout engine: generation with a plain (unsharded) transformers model.

It decodes with the model's own forward and KV cache, one micro-batch of sequences at a time, and
chooses tokens itself (``verl.engines.rollout.sampling``) so that it can return the per-token
log-probs without keeping ``[steps, batch, vocab]`` scores around. It is the reference backend that
runs anywhere (CPU included) and the one the hybrid engine uses on CPU.

Weights: ``update_weights`` takes (Hugging Face name, full tensor) pairs. A tensor with the target's
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

import logging
from dataclasses import dataclass

import torch

from verl.core.engine import RolloutEngine, RolloutRegistry, SamplingParams
from verl.core.platform import get_platform
from verl.core.protocol import DataProto
from verl.engines.dtypes import parse_dtype
from verl.engines.models import LANGUAGE_MODEL, load_model, named_weights
from verl.engines.rollout.output import assemble_rollout_output, check_left_padded
from verl.engines.rollout.sampling import next_tokens
from verl.engines.rollout.special_tokens import resolve_special_tokens

logger = logging.getLogger(__name__)

LOAD_FORMATS = ("hf", "dummy")


@dataclass
class HFRolloutConfig:
    """verl keys: ``actor_rollout_ref.rollout.{name=hf, dtype, load_format, micro_batch_size, ...}``."""

    model_path: str = ""
    #: Folder of the tokenizer (needed for stop strings only); default ``model_path``.
    tokenizer_path: str | None = None
    #: "auto": fp32 on CPU, bf16 on accelerators that support it.
    dtype: str = "auto"
    attn_implementation: str = "sdpa"
    trust_remote_code: bool = False
    #: Sequences (prompts x n) decoded together; bounds the KV cache and logits memory.
    micro_batch_size: int = 32
    #: "hf": weights from ``model_path``; "dummy": random weights, to be replaced by ``update_weights``.
    load_format: str = "hf"
    #: Alias incoming tensors of matching dtype/device instead of copying them (see module docstring).
    share_weight_storage: bool = True
    #: 1: sleep moves weights to host memory; 2: sleep drops them until the next ``update_weights``.
    sleep_level: int = 1
    #: Overrides of the tokenizer's / generation config's special tokens.
    pad_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self) -> None:
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"rollout.load_format={self.load_format!r} is unknown; use one of {list(LOAD_FORMATS)}")
        if self.sleep_level not in (1, 2):
            raise ValueError(f"rollout.sleep_level must be 1 or 2, got {self.sleep_level}")
        if self.micro_batch_size < 1:
            raise ValueError(f"rollout.micro_batch_size must be >= 1, got {self.micro_batch_size}")
        if self.dtype != "auto":
            parse_dtype(self.dtype, "rollout.dtype")


@RolloutRegistry.register(backend="hf", device=["cpu", "cuda", "npu"])
class HFRolloutEngine(RolloutEngine):
    config_class = HFRolloutConfig

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
            attn_implementation=cfg.attn_implementation,
            trust_remote_code=cfg.trust_remote_code,
            weights=cfg.load_format == "hf",
        )
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.tokenizer = self._load_tokenizer()
        self.eos_token_ids, self.pad_token_id = self._special_tokens()
        self._tensors = dict(named_weights(self.model))
        self._shapes = {name: t.shape for name, t in self._tensors.items()}
        self._on_host = False  # sleep level 1
        self._dropped = False  # sleep level 2 (weights gone until update_weights)
        self._stop_criteria: dict[tuple[str, ...], object] = {}
        self._warned_sleep = False

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
    def update_weights(self, weights) -> None:
        if self._on_host:
            raise RuntimeError(
                "the hf rollout is asleep (weights in host memory); call wake_up() before update_weights"
            )
        updated = set()
        with torch.no_grad():
            for name, tensor in weights:
                target = self._tensors.get(name)
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
        missing = sorted(set(self._tensors) - updated)
        if missing and self._dropped:
            raise RuntimeError(
                f"update_weights after sleep(level=2) must provide every weight; missing {missing[:5]}"
                f"{' ...' if len(missing) > 5 else ''}"
            )
        if missing:
            logger.warning("update_weights left %d weights unchanged: %s", len(missing), missing[:5])
        self._dropped = False

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
        t = prompts.batch
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
        with torch.no_grad():
            for start in range(0, rows, self.config.micro_batch_size):
                sel = source_rows[start : start + self.config.micro_batch_size]
                out_ids, out_len, out_lp = self._decode(
                    input_ids[sel], attention_mask[sel], position_ids[sel], sampling, generator, stop
                )
                end = start + len(sel)
                responses[start:end], lengths[start:end], logprobs[start:end] = out_ids, out_len, out_lp
        return assemble_rollout_output(prompts, sampling.n, responses, lengths, logprobs if sampling.logprobs else None)

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

    def _decode(self, input_ids, attention_mask, position_ids, sampling: SamplingParams, generator, stop):
        """One micro-batch: (response ids [b, max_new] on host, lengths [b], log-probs [b, max_new])."""
        device = self.device
        b, width = input_ids.shape[0], sampling.max_new_tokens
        tokens = torch.full((b, width), self.pad_token_id, dtype=input_ids.dtype, device=device)
        logprobs = torch.zeros(b, width, dtype=torch.float32, device=device)
        lengths = torch.zeros(b, dtype=torch.long, device=device)
        finished = torch.zeros(b, dtype=torch.bool, device=device)
        eos = torch.tensor(self.eos_token_ids, device=device)
        step_ids, step_pos = input_ids.to(device), position_ids.to(device)
        mask = attention_mask.to(device)
        past = None
        for step in range(width):
            out = self.model(
                input_ids=step_ids,
                attention_mask=mask,
                position_ids=step_pos,
                past_key_values=past,
                use_cache=True,
                logits_to_keep=1,
            )
            past = out.past_key_values
            token, logprob = next_tokens(out.logits[:, -1, :].float(), sampling, generator)
            active = ~finished
            token = torch.where(active, token, self.pad_token_id)
            tokens[:, step] = token
            logprobs[:, step] = torch.where(active, logprob, 0.0)
            lengths += active.long()
            done = active & torch.isin(token, eos)
            if stop is not None:
                done |= active & stop(tokens[:, : step + 1], None).to(device)
            finished |= done
            if bool(finished.all()):
                break
            step_ids = token[:, None]
            step_pos = step_pos[:, -1:] + 1
            # Finished rows keep decoding pads (their outputs are discarded); their mask stays 1 so no
            # query row is ever fully masked.
            mask = torch.cat([mask, torch.ones(b, 1, dtype=mask.dtype, device=device)], dim=1)
        return tokens.cpu(), lengths.cpu(), logprobs.cpu()
