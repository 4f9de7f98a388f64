"""``VeOmniEngine``: the training engine on VeOmni (``backend="veomni"``, verl's ``strategy=veomni``).

The model is built, sharded and optimized by VeOmni's own API (:mod:`verl.engines.veomni.build`):
``init_parallel_state`` lays out the meshes (FSDP2 over all ranks, Ulysses groups inside them, an ``ep``
mesh for experts on accelerators), ``build_foundation_model`` builds VeOmni's patched Hugging Face model
with the op kernels the platform chooses (``PlatformBase.backend_options("veomni")``: the reference ops on
the CPU, VeOmni's fused kernels elsewhere), ``build_parallelize_model`` wraps it in FSDP2 and loads the
weights into the shards, ``veomni.optim.build_optimizer`` builds AdamW and ``veomni_clip_grad_norm`` clips.

What the trainer sees is the FSDP engine's contract, and its code: micro-batching, packing, log-probs /
entropy from our logprob code, the losses' global scaling (gradients are summed over ranks), Ulysses
through our packed-sdpa all-to-all attention over VeOmni's ``ulysses`` mesh, checkpoints and HF export.
"""

from __future__ import annotations

import logging
import math
from typing import ClassVar

import torch
import torch.distributed as dist

from verl.core.engine import EngineRegistry
from verl.engines.dtypes import parse_dtype
from verl.engines.fsdp.engine import FSDPEngine, FSDPValueEngine
from verl.engines.fsdp.optim import build_lr_scheduler
from verl.engines.fsdp.ulysses import attach_group, check_heads, register_ulysses_sdpa
from verl.engines.fsdp.varlen_attention import register_varlen_sdpa
from verl.engines.models import LANGUAGE_MODEL, VALUE_MODEL, named_weights
from verl.engines.veomni import build
from verl.engines.veomni.config import VeOmniEngineConfig

logger = logging.getLogger(__name__)


@EngineRegistry.register(model_type=LANGUAGE_MODEL, backend="veomni", device=["cpu", "cuda", "npu"])
class VeOmniEngine(FSDPEngine):
    """VeOmni's FSDP2 (x Ulysses, x EP on accelerators) for causal LMs: per-token ``log_probs`` / ``entropy``."""

    model_type: ClassVar[str] = LANGUAGE_MODEL
    config_class: ClassVar[type] = VeOmniEngineConfig
    config: VeOmniEngineConfig

    def __init__(self, config: VeOmniEngineConfig | dict):
        super().__init__(VeOmniEngineConfig(**config) if isinstance(config, dict) else config)

    def initialize(self) -> None:
        from verl.engines.distributed import ensure_process_group

        cfg, fsdp = self.config, self.config.fsdp_config
        ensure_process_group(self.platform)
        sp = cfg.ulysses_sequence_parallel_size
        parallel = build.init_parallel(sp, cfg.expert_parallel_size, self.platform.device_name)
        self._mesh, self._dp, self._sp = parallel.fsdp_mesh, parallel.dp_mesh, parallel.sp_mesh
        self.platform.manual_seed(cfg.seed)
        module = build.build_model(
            cfg.model_path,
            self.model_type,
            trust_remote_code=cfg.trust_remote_code,
            overrides=cfg.override_config,
            model_dtype=parse_dtype(fsdp.model_dtype, "fsdp_config.model_dtype"),
            ops=build.ops_config(self.platform.backend_options("veomni"), self._build_attention()),
        )
        self._use_packed_attention(module, sp)
        module = build.parallelize(
            module,
            cfg.model_path,
            param_dtype=fsdp.resolved_param_dtype(self.platform.device_name, self.platform.is_bf16_supported()),
            reduce_dtype=parse_dtype(fsdp.reduce_dtype, "fsdp_config.reduce_dtype"),
            reshard_after_forward=fsdp.reshard_after_forward,
            gradient_checkpointing=cfg.enable_gradient_checkpointing,
        )
        if self.model_type == VALUE_MODEL:
            build.restore_head(module, cfg.model_path)
        self.module = module
        self._use_checkpoint_layout([(name, tensor.shape) for name, tensor in named_weights(module)])
        self.optimizer = self._build_optimizer(module)
        self.lr_scheduler = build_lr_scheduler(self.optimizer, cfg.optim)
        self._ready()

    def _build_attention(self) -> str:
        """The attention VeOmni builds the model with. With packing and sdpa we switch it to our packed
        attention afterwards (:meth:`_use_packed_attention`); VeOmni builds it as plain "sdpa"."""
        return "sdpa" if self.config.attn_implementation == "sdpa" else self.config.attn_implementation

    def _use_packed_attention(self, module: torch.nn.Module, sp: int) -> None:
        """Packed rows need one causal attention per sequence (our varlen sdpa); with Ulysses, the same
        attention between the all-to-alls over VeOmni's ``ulysses`` group. VeOmni's own sdpa/eager would
        run Ulysses silently wrong (it only warns), so Ulysses never runs on them:
        ``check_supported`` (the config) refuses any other attention with sp > 1."""
        self.hf_config = module.config
        self._architecture = type(module).__name__
        if self.config.attn_implementation != "sdpa":
            return
        attn = register_ulysses_sdpa() if sp > 1 else register_varlen_sdpa()
        module.set_attn_implementation(attn)  # type: ignore[operator]  # a PreTrainedModel method
        if self._sp is not None:
            check_heads(self.hf_config, sp)
            attach_group(module, self._sp.get_group())

    def _build_optimizer(self, module: torch.nn.Module) -> torch.optim.Optimizer:
        """VeOmni's AdamW builder with verl's settings; weight decay on every parameter, as verl's FSDP."""
        from veomni.optim import build_optimizer

        optim = self.config.optim
        return build_optimizer(
            module,
            lr=optim.lr,
            betas=(optim.betas[0], optim.betas[1]),
            eps=optim.eps,
            weight_decay=optim.weight_decay,
            no_decay_modules=[],
            no_decay_params=[],
        )

    def optimizer_step(self) -> float:
        """VeOmni's clipping (the global norm over its meshes, gradients scaled in place); a step with a
        non-finite norm is skipped, as in the FSDP engine."""
        from veomni.distributed.clip_grad_norm import veomni_clip_grad_norm

        self._require_on_device("optimizer_step", "train_mode", optimizer=True)
        grad_norm = float(veomni_clip_grad_norm(self.module, self.config.optim.clip_grad))
        if not math.isfinite(grad_norm):
            logger.warning("grad norm is %s: skipping this optimizer step", grad_norm)
            self.optimizer.zero_grad(set_to_none=True)
            return grad_norm
        self.optimizer.step()
        return grad_norm

    @property
    def dp_group(self):
        return self._dp.get_group() if self._dp is not None else dist.group.WORLD


@EngineRegistry.register(model_type=VALUE_MODEL, backend="veomni", device=["cpu", "cuda", "npu"])
class VeOmniValueEngine(VeOmniEngine):
    """VeOmni's token-classification model with one score per token (PPO critic, reward model): per-token
    ``values`` of the responses, aligned as in :class:`~verl.engines.fsdp.FSDPValueEngine`. A head missing
    from the folder (a critic started from a causal LM) is initialised by VeOmni's loader."""

    model_type: ClassVar[str] = VALUE_MODEL
    _token_outputs = FSDPValueEngine._token_outputs
