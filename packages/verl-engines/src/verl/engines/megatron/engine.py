"""``MegatronEngine``: the megatron training engine.

One instance per worker process. ``initialize()`` joins the process group, builds megatron's parallel
state as :class:`~verl.core.parallel_dims.ParallelDims` lays out ranks (TP innermost, PP outermost), builds
this rank's model chunks, loads the HF folder's weights into them with our converter, wraps them in
megatron's DDP (gradients summed over data-parallel ranks, :mod:`~verl.engines.megatron.ddp`) and builds
megatron's optimizer with verl's lr schedule (:mod:`~verl.engines.megatron.optimizer`). Every public call
runs inside the platform's megatron environment (``PlatformBase.backend_environment("megatron")``: on the
CPU the cuda -> cpu redirect, on Ascend the MindSpeed adaptor), entered per call so that nothing else in
the process runs under it.

Done: ``forward_only`` (per-token ``log_probs`` / ``entropy`` of ``responses``, [batch, response_length],
the FSDP engine's semantics, computed vocab-parallel), ``forward_backward`` (micro-batches
through the pipeline schedule, ``loss_fn`` on the last stage), ``optimizer_zero_grad`` /
``optimizer_step`` / ``lr_scheduler_step``, ``named_full_parameters``, ``save_checkpoint`` /
``load_checkpoint`` (layout-independent, :mod:`~verl.engines.megatron.checkpoint`), ``export_hf`` and
offload (``offload_to_host`` / ``load_to_device``, and ``param_offload`` / ``grad_offload`` /
``optimizer_offload`` between phases, :mod:`~verl.engines.megatron.offload`).
``MegatronValueEngine`` is the value-model variant (critic, reward model). Micro-batches are fixed-size
or by token budget (``use_dynamic_bsz``). MoE models
(Qwen2-MoE, Qwen3-MoE) take expert parallelism (``megatron.expert_model_parallel_size``; TP must be 1 on
megatron's local spec, see ``model_config.check_moe_layout``). Not yet: sequence parallelism (megatron's
local layer spec refuses it; untested with Transformer Engine) and context parallelism.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import os
from collections import defaultdict
from collections.abc import Iterator
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from verl.core.engine import EngineRegistry, LossFn, TrainingEngine
from verl.core.platform import get_platform
from verl.core.protocol import DataProto
from verl.engines.distributed import ensure_process_group
from verl.engines.dtypes import parse_dtype
from verl.engines.megatron.config import MegatronEngineConfig
from verl.engines.models import LANGUAGE_MODEL, VALUE_MODEL, load_config

logger = logging.getLogger(__name__)

HOST = torch.device("cpu")


@EngineRegistry.register(model_type=LANGUAGE_MODEL, backend="megatron", device=["cpu", "cuda", "npu"])
class MegatronEngine(TrainingEngine):
    """megatron-core GPTModel with TP x PP (x EP) for causal LMs (Llama, Qwen2, Qwen3; Qwen2-MoE, Qwen3-MoE)."""

    model_type: ClassVar[str] = LANGUAGE_MODEL
    config_class: ClassVar[type] = MegatronEngineConfig

    def __init__(self, config: MegatronEngineConfig | dict):
        self.config = MegatronEngineConfig(**config) if isinstance(config, dict) else config
        self.platform = get_platform()
        self._initialized = False
        self.chunks: list[torch.nn.Module] = []
        self._on_device = {"model": False, "optimizer": False}
        self._grads_allocated = False

    # -- lifecycle ----------------------------------------------------------------------------------
    def _environment(self):
        return self.platform.backend_environment("megatron")

    def initialize(self) -> None:
        from verl.engines.megatron.build import build_model_chunks
        from verl.engines.megatron.ddp import wrap_ddp
        from verl.engines.megatron.optimizer import LRSchedule, build_megatron_optimizer

        cfg, mcfg = self.config, self.config.megatron
        ensure_process_group(self.platform)
        with self._environment():
            self._set_up_parallel()
            self.chunks, self.padded_vocab = build_model_chunks(
                self.shape,
                self.layout,
                self.spec,
                params_dtype=self._params_dtype(),
                use_cpu_initialization=self.platform.device_name == "cpu",
                vocab_divisible_by=mcfg.make_vocab_size_divisible_by,
                sequence_parallel=mcfg.sequence_parallel,
            )
            self._load_hf_weights()
            device = self.platform.device()
            self.chunks = wrap_ddp(
                [chunk.to(device) for chunk in self.chunks], use_distributed_optimizer=mcfg.use_distributed_optimizer
            )
            self.optimizer = build_megatron_optimizer(
                self.chunks,
                cfg.optim,
                params_dtype=self._params_dtype(),
                use_distributed_optimizer=mcfg.use_distributed_optimizer,
            )
            self.lr_scheduler = LRSchedule(self.optimizer, cfg.optim)
        self._grads_reduced = False
        self._on_device = {"model": True, "optimizer": True}
        self._grads_allocated = True
        self._initialized = True
        self._rest()
        logger.info(
            "MegatronEngine ready: %s, tp %d x pp %d x ep %d, dp %d",
            self.shape.model_type,
            self.dims.tp,
            self.dims.pp,
            self.dims.ep,
            self.dp_size,
        )

    def _set_up_parallel(self) -> None:
        """The model's shape and layer spec (checked against the layout), megatron's process groups and
        its model-parallel RNG streams."""
        from megatron.core import parallel_state as mpu

        from verl.engines.megatron.build import Layout
        from verl.engines.megatron.layer_spec import spec_name
        from verl.engines.megatron.model_config import check_moe_layout, model_shape
        from verl.engines.megatron.parallel import initialize_megatron_parallel, megatron_parallel_dims
        from verl.engines.megatron.rng import seed_model_parallel

        cfg, mcfg = self.config, self.config.megatron
        self.dims = megatron_parallel_dims(
            dist.get_world_size(),
            tp=mcfg.tensor_model_parallel_size,
            pp=mcfg.pipeline_model_parallel_size,
            ep=mcfg.expert_model_parallel_size,
        )
        self.hf_config = load_config(cfg.model_path, self.model_type, overrides=cfg.override_config)
        self.shape = model_shape(self.hf_config, value_head=self.model_type == VALUE_MODEL)
        self.spec = spec_name(self.platform.device_name)
        check_moe_layout(self.shape, self.spec, self.dims.tp, mcfg.sequence_parallel)
        vpp = mcfg.virtual_pipeline_model_parallel_size
        initialize_megatron_parallel(self.dims, vpp)
        seed_model_parallel(
            mcfg.seed,
            self.platform.device_name,
            mpu.get_tensor_model_parallel_rank(),
            ep_rank=mpu.get_expert_model_parallel_rank(),
            etp_rank=mpu.get_expert_tensor_parallel_rank(),
        )
        self.layout = Layout.current(vpp)

    def _load_hf_weights(self) -> None:
        """The Hugging Face checkpoint into this rank's chunks; a value head the checkpoint lacks is
        initialised as the FSDP value engine's is."""
        from verl.engines.megatron.build import hf_names, load_hf_weights
        from verl.engines.megatron.value_head import initial_head

        hf_weights = _read_hf_weights(self.config.model_path)
        if self.shape.value_head and "score.weight" not in hf_weights:  # a critic started from a causal LM
            std = float(getattr(self.hf_config, "initializer_range", 0.02))
            seed = self.config.megatron.seed
            hf_weights.update(initial_head(self.shape.hidden_size, self.shape.value_head_bias, std, seed))
        elif self.shape.value_head and self.shape.value_head_bias and "score.bias" not in hf_weights:
            # A sequence classifier (a reward model) has a score head without a bias; the token
            # classifier the FSDP value engine loads it as gets a zero one (HF's init), and so does this.
            hf_weights["score.bias"] = torch.zeros(1, dtype=hf_weights["score.weight"].dtype)
        load_hf_weights(self.chunks, hf_weights, self.shape, self.layout, self.padded_vocab, self.spec)
        # What named_full_parameters yields, in order (export plans its files from it).
        self._hf_shapes = [(name, hf_weights[name].shape) for name in hf_names(self.shape, self.spec)]

    def _params_dtype(self) -> torch.dtype:
        name = self.config.megatron.params_dtype
        if name == "auto":
            on_accelerator = self.platform.device_name != "cpu" and self.platform.is_bf16_supported()
            return torch.bfloat16 if on_accelerator else torch.float32
        return parse_dtype(name, "megatron.params_dtype")

    def _require_initialized(self) -> None:
        if not self._initialized:
            raise RuntimeError("the engine is not initialized; call engine.initialize() in the worker first")

    # -- modes --------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def train_mode(self):
        self._require_initialized()
        self.load_to_device(model=True, optimizer=True)
        self._allocate_grads()
        for chunk in self.chunks:
            chunk.train()
        try:
            yield
        finally:
            self._rest()

    @contextlib.contextmanager
    def eval_mode(self):
        self._require_initialized()
        self.load_to_device(model=True, optimizer=False)
        for chunk in self.chunks:
            chunk.eval()
        try:
            yield
        finally:
            self._rest()

    def _rest(self) -> None:
        """Offload what the config keeps in host memory between phases (gradients: dropped)."""
        mcfg = self.config.megatron
        if mcfg.param_offload or mcfg.optimizer_offload:
            self.offload_to_host(model=mcfg.param_offload, optimizer=mcfg.optimizer_offload)
        if mcfg.grad_offload and self._grads_allocated:
            from verl.engines.megatron.offload import free_grad_buffers

            free_grad_buffers(self.chunks, self.optimizer)
            self._grads_allocated = False

    def _allocate_grads(self) -> None:
        if not self._grads_allocated:
            from verl.engines.megatron.offload import restore_grad_buffers

            restore_grad_buffers(self.chunks)  # zeroed
            self._grads_allocated = True
            self._grads_reduced = False

    @contextlib.contextmanager
    def _everything_on_device(self):
        before = dict(self._on_device)
        self.load_to_device(model=True, optimizer=True)
        try:
            yield
        finally:
            self.offload_to_host(model=not before["model"], optimizer=not before["optimizer"])

    def _require_on_device(self, what: str, where: str, optimizer: bool = False) -> None:
        self._require_initialized()
        if not self._on_device["model"] or (optimizer and not self._on_device["optimizer"]):
            raise RuntimeError(f"{what} needs the model on the device; call it inside engine.{where}")

    # -- compute ------------------------------------------------------------------------------------
    def forward_only(self, batch: DataProto, compute_entropy: bool = False) -> dict[str, torch.Tensor]:
        from verl.engines.megatron.schedule import run_micro_batches

        self._require_on_device("forward_only", "eval_mode")
        if len(batch) == 0:
            raise ValueError("the engine got an empty batch")
        temperature = float(batch.meta_info.get("temperature", 1.0))
        parts = self._micro_batches(batch, forward_only=True)
        micro = [batch[indices] for indices in parts]
        with self._environment(), torch.no_grad():
            results = run_micro_batches(
                self.chunks,
                micro,
                vocab_size=self.shape.vocab_size,
                padded_vocab=self.padded_vocab,
                temperature=temperature,
                compute_entropy=compute_entropy,
                values=self.model_type == VALUE_MODEL,
                device=self.platform.device(),
            )
        pieces: dict[str, list[torch.Tensor]] = defaultdict(list)
        for result in results:
            for key, value in result["outputs"].items():
                pieces[key].append(value)
        order = torch.tensor([i for indices in parts for i in indices], dtype=torch.long)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(len(order))  # back to the batch's row order
        return {key: torch.cat(values)[inverse] for key, values in pieces.items()}

    def _micro_batches(self, batch: DataProto, forward_only: bool) -> list[list[int]]:
        """Row indices of each micro-batch: consecutive fixed-size pieces, or (dynamic batching) the FSDP
        engine's token-budget partition. Data-parallel ranks need not agree on a count (megatron's DDP
        reduces once, after the last micro-batch); the ranks of a model-parallel group hold the same rows
        and compute the same partition."""
        from verl.engines.fsdp.dynamic_batch import token_budget_micro_batches

        size, budget, dynamic = self.config.micro_batching(forward_only)
        if dynamic:
            return token_budget_micro_batches(batch.tensors["attention_mask"].sum(-1).tolist(), budget)
        return [list(range(i, min(len(batch), i + size))) for i in range(0, len(batch), size)]

    def forward_backward(self, batch: DataProto, loss_fn: LossFn) -> dict[str, Any]:
        from verl.engines.megatron.ddp import accumulate_onto_reduced
        from verl.engines.megatron.schedule import global_counts, run_micro_batches

        self._require_on_device("forward_backward", "train_mode")
        if not self._grads_allocated:
            raise RuntimeError("forward_backward needs the gradient buffers (freed by grad_offload); use train_mode")
        if len(batch) == 0:
            raise ValueError("the engine got an empty batch")
        temperature = float(batch.meta_info.get("temperature", 1.0))
        compute_entropy = bool(batch.meta_info.get("compute_entropy", False))
        device = self.platform.device()
        counts = global_counts(batch, self.dp_size, self.dp_group, device)
        micro = [batch[indices].to(device) for indices in self._micro_batches(batch, forward_only=False)]
        for m in micro:
            m.meta_info = {**m.meta_info, **counts}
        with self._environment(), accumulate_onto_reduced(self.chunks, self._grads_reduced):
            results = run_micro_batches(
                self.chunks,
                micro,
                vocab_size=self.shape.vocab_size,
                padded_vocab=self.padded_vocab,
                temperature=temperature,
                compute_entropy=compute_entropy,
                values=self.model_type == VALUE_MODEL,
                loss_fn=loss_fn,
                device=device,
            )
        # finalize_model_grads has all-reduced the buffers: a further call must not reduce them again.
        self._grads_reduced = True
        metrics: dict[str, list[Any]] = defaultdict(list)
        for result in results:
            for key, value in result["metrics"].items():
                metrics[key].append(value)
        return dict(metrics)

    def optimizer_zero_grad(self) -> None:
        from verl.engines.megatron.ddp import zero_grad_buffers

        self._require_initialized()
        if self._grads_allocated:  # freed buffers come back zeroed
            zero_grad_buffers(self.chunks)
        self.optimizer.zero_grad()
        self._grads_reduced = False

    def optimizer_step(self) -> float:
        from verl.engines.megatron.optimizer import clip_and_step

        self._require_on_device("optimizer_step", "train_mode", optimizer=True)
        with self._environment():
            grad_norm = clip_and_step(self.optimizer, self.config.optim.clip_grad)
        if not math.isfinite(grad_norm):
            logger.warning("grad norm is %s: skipping this optimizer step", grad_norm)
            self.optimizer_zero_grad()
        return grad_norm

    def lr_scheduler_step(self) -> float:
        self._require_initialized()
        return self.lr_scheduler.step()

    @property
    def lr(self) -> float:
        return self.lr_scheduler.lr

    # -- weights ------------------------------------------------------------------------------------
    def named_full_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, full tensor) one megatron parameter at a time on every rank (gathered over TP,
        broadcast over PP); every rank of the model-parallel group must consume the whole iterator."""
        from verl.engines.megatron.build import gather_hf_weights

        self._require_on_device("named_full_parameters", "load_to_device(model=True) or eval_mode")
        gathered = gather_hf_weights(self.chunks, self.shape, self.layout, self.spec, device=self.platform.device())
        while True:
            # The redirect is entered around each step only, never across a yield to the consumer.
            with self._environment():
                item = next(gathered, None)
            if item is None:
                return
            yield item

    def named_full_gradients(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, full gradient) like :meth:`named_full_parameters`, from DDP's buffers: after
        ``forward_backward`` they hold the sums over micro-batches and data-parallel ranks (for checks
        and debugging; collective over the model-parallel group)."""
        from verl.engines.megatron.build import gather_hf_weights

        self._require_on_device("named_full_gradients", "train_mode")
        if self.config.megatron.use_distributed_optimizer:
            raise NotImplementedError(
                "named_full_gradients with megatron.use_distributed_optimizer=true: the grad buffers hold "
                "reduce-scattered shards (each rank's own part summed, the rest partial)"
            )
        gathered = gather_hf_weights(
            self.chunks,
            self.shape,
            self.layout,
            self.spec,
            device=self.platform.device(),
            tensor_of=lambda param: param.main_grad,  # type: ignore[attr-defined]  # set by megatron's DDP
        )
        while True:
            with self._environment():
                item = next(gathered, None)
            if item is None:
                return
            yield item

    def save_checkpoint(self, path: str) -> None:
        from verl.engines.megatron import checkpoint

        self._require_initialized()
        with self._everything_on_device(), self._environment():
            checkpoint.save_checkpoint(path, self, extra={"model_type": self.model_type})

    def load_checkpoint(self, path: str) -> None:
        from verl.engines.megatron import checkpoint

        self._require_initialized()
        with self._everything_on_device(), self._environment():
            extra = checkpoint.load_checkpoint(path, self)
        if extra.get("model_type") not in (None, self.model_type):
            raise ValueError(
                f"checkpoint {path!r} holds a {extra['model_type']}, this engine trains a {self.model_type}"
            )

    def export_hf(self, path: str, dtype: str | None = None) -> None:
        """Write a Hugging Face folder (weights gathered one at a time, written by rank 0; the source
        config, generation config and tokenizer); ``dtype`` defaults to fp32. Collective."""
        from verl.engines.fsdp.export import export_hf_folder

        self._require_initialized()
        with self._everything_on_device():
            export_hf_folder(
                path,
                self._hf_shapes,
                self.named_full_parameters(),
                self._export_config(),
                source_path=self.config.tokenizer_path or self.config.model_path,
                dtype=parse_dtype(dtype or "fp32", "export dtype"),
            )

    def _export_config(self):
        config = copy.deepcopy(self.hf_config)
        if self.model_type == VALUE_MODEL:  # the folder loads as the value model verl's engines build
            from transformers import AutoModelForTokenClassification

            config.architectures = [AutoModelForTokenClassification._model_mapping[type(config)].__name__]
        return config

    # -- memory -------------------------------------------------------------------------------------
    @property
    def offload_state(self) -> dict[str, bool]:
        """Which parts are on the device now: {"model": bool, "optimizer": bool}."""
        return dict(self._on_device)

    def offload_to_host(self, model: bool = True, optimizer: bool = True) -> None:
        """Parameters (and the gradient buffers, freed: offload happens between updates) and/or the
        optimizer state to host memory (:mod:`~verl.engines.megatron.offload`)."""
        from verl.engines.megatron import offload

        self._require_initialized()
        if model and self._on_device["model"]:
            if self._grads_allocated:
                offload.free_grad_buffers(self.chunks, self.optimizer)
                self._grads_allocated = False
            offload.move_params(self.chunks, HOST, to_host=True)
            self._on_device["model"] = False
        if optimizer and self._on_device["optimizer"]:
            offload.move_optimizer(self.optimizer, self._model_params(), HOST)
            self._on_device["optimizer"] = False
        if model or optimizer:
            self.platform.empty_cache()

    def load_to_device(self, model: bool = True, optimizer: bool = True) -> None:
        from verl.engines.megatron import offload

        self._require_initialized()
        device = self.platform.device()
        if model and not self._on_device["model"]:
            offload.move_params(self.chunks, device, to_host=False)
            self._on_device["model"] = True
        if optimizer and not self._on_device["optimizer"]:
            offload.move_optimizer(self.optimizer, self._model_params(), device)
            self._on_device["optimizer"] = True

    def _model_params(self) -> set[torch.nn.Parameter]:
        return {p for chunk in self.chunks for p in chunk.parameters()}

    # -- parallelism --------------------------------------------------------------------------------
    @property
    def dp_rank(self) -> int:
        from megatron.core import parallel_state as mpu

        return mpu.get_data_parallel_rank() if self._initialized else 0

    @property
    def dp_size(self) -> int:
        from megatron.core import parallel_state as mpu

        return mpu.get_data_parallel_world_size() if self._initialized else 1

    @property
    def is_collect_rank(self) -> bool:
        """TP rank 0 of the last pipeline stage: ``forward_only``'s outputs and ``forward_backward``'s
        metrics are the same on every rank of a replica (computed on the last stage, replicated over TP,
        broadcast to the other stages), but ``loss_fn`` itself runs only on the last stage, so what a
        caller records from inside it (the update's own log-probs) is complete there."""
        from megatron.core import parallel_state as mpu

        if not self._initialized:
            return True
        return mpu.get_tensor_model_parallel_rank() == 0 and mpu.is_pipeline_last_stage(ignore_virtual=True)

    @property
    def dp_group(self):
        from megatron.core import parallel_state as mpu

        return mpu.get_data_parallel_group() if self._initialized else None


@EngineRegistry.register(model_type=VALUE_MODEL, backend="megatron", device=["cpu", "cuda", "npu"])
class MegatronValueEngine(MegatronEngine):
    """The megatron engine for value models (PPO critic, reward model): per-token ``values`` of the
    responses from the HF ``score`` head (:mod:`~verl.engines.megatron.value_head`), aligned like the FSDP
    value engine's. A causal-LM folder gets a freshly initialised head (the same on every rank)."""

    model_type: ClassVar[str] = VALUE_MODEL


def _read_hf_weights(path: str) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors files (host memory; each rank then keeps its shards)."""
    from safetensors.torch import load_file

    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"{path!r} has no .safetensors weights; the megatron engine loads safetensors only")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_file(os.path.join(path, name)))
    return state
