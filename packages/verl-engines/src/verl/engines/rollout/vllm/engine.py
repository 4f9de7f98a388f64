"""``VLLMRolloutEngine``: vLLM as the rollout engine of the hybrid engine, inside the worker process.

Importing this module does not import vLLM (``import verl.engines`` happens everywhere): vLLM is
imported when an engine is built, after the environment it needs is set (see ``inprocess``), and a
missing or unsupported vLLM is reported then with what to install (see ``compat``).

On CPU the KV cache is sized from the run's batch and lengths unless the user gives a size
(``kv_cache``), and the verl keys that mean nothing there are reported in one log line (``engine_args``).

Per step the hybrid engine calls :meth:`wake_up`, :meth:`update_weights` with the actor's per-tensor
iterator, :meth:`generate` and :meth:`sleep`:

- weights go in through the path that works on the device (``weights``): vLLM's layer-wise
  ``reload_weights`` on CPU, the model's in-place ``load_weights`` on GPUs; a LoRA actor's base weights
  go in once, and its adapter through :meth:`update_adapter` as a LoRA request (``lora``);
- sleep uses vLLM's sleep mode on GPUs (``enable_sleep_mode``; level 2 discards weights and KV cache,
  level 1 moves the weights to host memory). Waking up happens in two stages, as vLLM recommends for
  RL: the weights' memory in :meth:`wake_up` (before the sync), the KV cache at :meth:`generate`, so
  the trainer's gathered tensors and a full KV cache are never on the device at the same time. vLLM
  rejects sleep mode on CPU, where :meth:`sleep` / :meth:`wake_up` report that with False.

Agent loops generate through :meth:`request_stream` instead: each turn is a request of its own, added to
vLLM's running batch while the others decode (``requests``).

Lifetime: build one engine per process and keep it. When an in-process vLLM engine is garbage
collected, vLLM shuts it down with ``cleanup_dist_env_and_memory()``, which destroys vLLM's parallel
groups *and torch.distributed's default group* in this process (the trainer's, if it made one first),
breaking every other engine in the process.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

import torch

from verl.core.engine import LoRAAdapter, RolloutEngine, RolloutRegistry, SamplingParams
from verl.core.platform import get_platform
from verl.core.protocol import DataProto
from verl.engines.rollout.output import check_left_padded
from verl.engines.rollout.special_tokens import resolve_special_tokens
from verl.engines.rollout.vllm import compat, kv_cache
from verl.engines.rollout.vllm.config import VLLMRolloutConfig
from verl.engines.rollout.vllm.engine_args import no_effect_on, vllm_args
from verl.engines.rollout.vllm.inprocess import preserved_process_state, set_in_process_environment
from verl.engines.rollout.vllm.lora import AdapterServer, max_lora_rank
from verl.engines.rollout.vllm.output import rollout_output
from verl.engines.rollout.vllm.requests import VLLMRequestStream
from verl.engines.rollout.vllm.sampling import request_seeds, to_vllm_sampling
from verl.engines.rollout.vllm.weights import TrackedWeights, push_weights

logger = logging.getLogger(__name__)

_DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@RolloutRegistry.register(backend="vllm", device=["cpu", "cuda"])
class VLLMRolloutEngine(RolloutEngine):
    config_class = VLLMRolloutConfig

    def __init__(self, config: VLLMRolloutConfig | dict):
        self.config = VLLMRolloutConfig(**config) if isinstance(config, dict) else config
        cfg = self.config
        self.platform = get_platform()
        self.device_type = self.platform.device_name
        set_in_process_environment()
        vllm = compat.import_vllm()
        self.vllm_version = vllm.__version__
        self.dtype = self._resolve_dtype()
        self.weight_sync = self._resolve_weight_sync()
        kwargs = cfg.passthrough_kwargs()
        compat.check_engine_kwargs(kwargs, compat.valid_engine_kwargs(vllm))
        compat.check_architecture(vllm, cfg.model_path, kwargs)
        self.kv_plan = self._plan_kv_cache(kwargs) if self.device_type == "cpu" else None
        self.lora_slot_rank = max_lora_rank(vllm, cfg.lora_rank) if cfg.lora_rank else None
        self.llm = self._build(vllm)
        self.adapters = (
            AdapterServer(self.llm, _lora_request_class(), self.lora_slot_rank)
            if self.lora_slot_rank is not None
            else None
        )
        self._check_kv_capacity()
        self._vllm = vllm
        self.eos_token_ids, self.pad_token_id = self._special_tokens()
        self._weights_asleep = False  # sleep() ran; wake_up() not yet
        self._cache_asleep = False  # KV cache (and scheduling) still released: taken back in generate()
        self._weights_stale = False  # sleep level 2 discarded the weights: update_weights() must run
        self._prefix_cache_stale = False
        self._warned_sleep = False

    # -- setup --------------------------------------------------------------------------------------
    def _resolve_dtype(self) -> str:
        dtype = _DTYPE_NAMES.get(self.config.dtype, self.config.dtype)
        if dtype != "auto":
            return dtype
        if self.device_type != "cpu" and self.platform.is_bf16_supported():
            return "bfloat16"
        return "float32"

    def _resolve_weight_sync(self) -> str:
        path = self.config.weight_sync
        if path == "auto":
            return "reload" if self.device_type == "cpu" else "load_weights"
        if path == "load_weights" and self.device_type == "cpu":
            raise ValueError(
                "rollout.weight_sync=load_weights does not work on CPU: vLLM repacks linear weights after "
                "loading, so the in-place loader fails or silently changes nothing. Use weight_sync=reload "
                "(the default on CPU)"
            )
        return path

    @property
    def supports_sleep(self) -> bool:  # type: ignore[override]
        return self.device_type != "cpu" and self.config.free_cache_engine

    def _plan_kv_cache(self, kwargs: dict) -> kv_cache.KVCachePlan:
        """The CPU KV cache size: the user's when given, else sized from this run (see ``kv_cache``)."""
        cfg = self.config
        explicit = kv_cache.explicit_kv_cache(kwargs)
        if explicit is not None:
            plan = kv_cache.KVCachePlan(0, f"set by {explicit}")
        else:
            max_model_len = cfg.resolved_max_model_len() or kv_cache.model_max_len(cfg.model_path)
            free, _ = self.platform.mem_get_info()
            plan = kv_cache.plan_kv_cache(
                bytes_per_token=kv_cache.kv_cache_bytes_per_token(cfg.model_path, _DTYPE_BYTES[self.dtype]),
                max_model_len=max_model_len,
                batches=cfg.generation_batches,
                max_num_seqs=cfg.max_num_seqs,
                block_size=kwargs.get("block_size"),
                host_free_bytes=free,
                engines_on_host=_engines_on_host(),
            )
        if _data_rank() == 0:
            size = f"{plan.bytes / kv_cache.MIB:.1f} MiB" if plan.bytes else "as given"
            logger.info("vllm rollout: KV cache %s: %s", size, plan.how)
        return plan

    def _check_kv_capacity(self) -> None:
        if self.kv_plan is None:
            return
        cache = self.llm.llm_engine.vllm_config.cache_config
        warning = kv_cache.check_capacity(self.kv_plan, cache.num_gpu_blocks, cache.block_size)
        if warning:
            logger.warning("vllm rollout: %s", warning)

    def _build(self, vllm):
        cfg = self.config
        kv_bytes = self.kv_plan.bytes if self.kv_plan is not None and self.kv_plan.bytes else None
        args = vllm_args(cfg, self.device_type, self.dtype, self.supports_sleep, kv_bytes, self.lora_slot_rank)
        logger.info(
            "vllm rollout: vLLM %s in-process on %s, dtype %s, weights via %s, load_format %s",
            vllm.__version__,
            self.device_type,
            self.dtype,
            self.weight_sync,
            args["load_format"],
        )
        unused = no_effect_on(cfg, self.device_type)
        if unused and _data_rank() == 0:
            logger.info(
                "vllm rollout: settings with no effect on %s: %s",
                self.device_type,
                "; ".join(f"{key} ({why})" for key, why in unused.items()),
            )
        with preserved_process_state(self.device_type, self.platform.device_count()):
            llm = vllm.LLM(**args)
        client = type(llm.llm_engine.engine_core).__name__
        if client != "InprocClient":
            raise RuntimeError(
                f"vLLM started its engine in another process ({client}) although VLLM_ENABLE_V1_MULTIPROCESSING=0 "
                "was set: this vLLM does not support in-process mode, which the vllm rollout needs to load weights"
            )
        return llm

    def _special_tokens(self) -> tuple[list[int], int]:
        """eos ids and pad id, resolved as the hf engine resolves them."""
        cfg = self.config
        model_config = json.loads((Path(cfg.model_path) / "config.json").read_text())
        return resolve_special_tokens(
            cfg.model_path,
            eos_override=cfg.eos_token_id,
            pad_override=cfg.pad_token_id,
            tokenizer=self.llm.get_tokenizer(),
            model_eos=model_config.get("eos_token_id"),
            model_pad=model_config.get("pad_token_id"),
        )

    # -- weights ------------------------------------------------------------------------------------
    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        if self._weights_asleep:
            raise RuntimeError("the vllm rollout is asleep; call wake_up() before update_weights()")
        tracked = TrackedWeights(weights)
        try:
            with torch.no_grad():
                push_weights(self.llm, tracked, self.weight_sync)
        except (KeyError, ValueError, RuntimeError, AssertionError) as exc:
            raise RuntimeError(
                f"update_weights: vLLM failed to load the trainer's weights (weight sync '{self.weight_sync}', "
                f"at tensor #{tracked.count} {tracked.last_name!r}): {type(exc).__name__}: {exc}. Are trainer "
                "and rollout built from the same model?"
            ) from exc
        if tracked.count == 0:
            raise ValueError("update_weights got no tensors")
        self._weights_stale = False
        self._prefix_cache_stale = True

    @property
    def supports_lora_adapters(self) -> bool:  # type: ignore[override]
        return self.adapters is not None

    @property
    def weights_discarded(self) -> bool:  # type: ignore[override]
        return self._weights_stale

    def update_adapter(self, adapter: LoRAAdapter) -> None:
        """Serve the actor's LoRA adapter as a LoRA request from the next generation on (see ``lora``)."""
        if self.adapters is None:
            raise ValueError(
                "update_adapter: this vllm rollout was built without LoRA (lora_rank=0); build it with the "
                "actor's actor_rollout_ref.model.lora_rank, or send merged weights with update_weights"
            )
        if self._weights_asleep:
            raise RuntimeError("the vllm rollout is asleep; call wake_up() before update_adapter()")
        self.adapters.serve(adapter)

    # -- memory -------------------------------------------------------------------------------------
    def _report_no_sleep(self) -> bool:
        if not self._warned_sleep:
            reason = (
                "vLLM has no sleep mode on CPU"
                if self.device_type == "cpu"
                else "actor_rollout_ref.rollout.free_cache_engine=False"
            )
            logger.info("vllm rollout: sleep/wake_up are no-ops (%s); KV cache and weights stay allocated", reason)
            self._warned_sleep = True
        return False

    def sleep(self) -> bool:
        if not self.supports_sleep:
            return self._report_no_sleep()
        if not (self._weights_asleep and self._cache_asleep):
            self.llm.sleep(level=self.config.sleep_level)
            self._weights_asleep = self._cache_asleep = True
            self._weights_stale = self.config.sleep_level == 2
            self._prefix_cache_stale = True  # its blocks' contents are gone with the KV cache
            self.platform.empty_cache()
        return True

    def wake_up(self) -> bool:
        if not self.supports_sleep:
            return self._report_no_sleep()
        if self._weights_asleep:
            # Weights only: the KV cache comes back in generate(), after the weight sync.
            self.llm.wake_up(tags=["weights"])
            self._weights_asleep = False
        return True

    # -- generation ---------------------------------------------------------------------------------
    @property
    def supports_request_stream(self) -> bool:  # type: ignore[override]
        return True

    def request_stream(self) -> VLLMRequestStream:
        """Token-in/token-out requests on vLLM's engine, stepped here (see ``requests``)."""
        self._ready_to_generate()
        return VLLMRequestStream(
            self.llm.llm_engine, self._vllm, self.eos_token_ids, self._lora_request(), _data_rank()
        )

    def _lora_request(self):
        return self.adapters.request if self.adapters is not None else None

    def generate(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        self._ready_to_generate()
        t = prompts.tensors
        input_ids, attention_mask = t["input_ids"], t["attention_mask"]
        check_left_padded(attention_mask)
        token_lists = [row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask)]
        seeds = request_seeds(sampling.seed, len(prompts), sampling.n, rank=_data_rank())
        params = [to_vllm_sampling(self._vllm, sampling, seed, self.eos_token_ids) for seed in seeds]
        outputs = self.llm.generate(
            [{"prompt_token_ids": ids} for ids in token_lists],
            params,
            use_tqdm=False,
            lora_request=self._lora_request(),
        )
        return rollout_output(
            prompts, outputs, sampling.n, sampling.max_new_tokens, self.pad_token_id, sampling.logprobs
        )

    def _ready_to_generate(self) -> None:
        """Refuse while asleep or without weights; take back the KV cache; drop prefixes of old weights."""
        if self._weights_asleep:
            raise RuntimeError("the vllm rollout is asleep; call wake_up() before generate()")
        if self._weights_stale:
            raise RuntimeError(
                "the vllm rollout's weights were discarded by sleep (sleep_level=2); call update_weights() "
                "before generate()"
            )
        if self._cache_asleep:
            self.llm.wake_up()  # everything still released: KV cache, scheduling
            self._cache_asleep = False
        if self._prefix_cache_stale:
            self.llm.reset_prefix_cache()
            self._prefix_cache_stale = False


def _lora_request_class():
    from vllm.lora.request import LoRARequest

    return LoRARequest


def _engines_on_host() -> int:
    """vLLM engines on this node: one per training rank (read before vLLM rewrites LOCAL_WORLD_SIZE)."""
    return max(int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1), 1)


def _data_rank() -> int:
    """This process's rank, to give data-parallel ranks different random streams for the same seed."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
