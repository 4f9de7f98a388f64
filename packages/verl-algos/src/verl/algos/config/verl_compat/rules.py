"""What each of verl's config keys means here, for the keys our schema does not hold under the same path.

Every key of verl's trainer configs (``upstream_*.yaml``) falls under exactly one rule, first match wins
(a test checks that none is left over):

- ``Alias(target)``: the same setting under our key (``critic.model.fsdp_config.param_offload`` ->
  ``critic.fsdp_config.param_offload``), with a value map where verl spells values differently.
- ``NoEffect(why)``: a knob that tunes GPU memory, kernels or verl's own plumbing; accepted with any value
  and reported once per run (``verl config show`` lists them) as having no effect here, and why.
- ``Internal``: verl's Hydra plumbing (``_target_``, values interpolated from other keys); accepted,
  listed, never meaningful to set by hand.
- ``NotYet(feature, instead)``: a feature we do not have yet. Accepted while its value leaves the feature
  off (verl's default, null, false, 0, empty); any other value stops before Ray starts with a message
  naming the feature and what to use instead.

Keys are matched with ``fnmatch`` patterns (``*`` crosses dots).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Alias:
    target: str
    #: verl's spelling -> ours (values not listed pass through unchanged)
    values: dict[Any, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NoEffect:
    why: str


@dataclass(frozen=True)
class Internal:
    pass


@dataclass(frozen=True)
class NotYet:
    feature: str
    instead: str
    #: values that leave the feature off besides verl's default and the empty ones (1 for a parallel size)
    off: tuple[Any, ...] = ()


Rule = Alias | NoEffect | Internal | NotYet

#: Keys verl's config classes take that its YAML files do not list (its scripts add them with ``+``), with
#: verl's default.
EXTRA_UPSTREAM_KEYS: dict[str, Any] = {
    **{
        f"{role}.{key}": default
        for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic.model")
        for key, default in (
            ("fsdp_config.mixed_precision.param_dtype", "bf16"),
            ("fsdp_config.mixed_precision.reduce_dtype", "fp32"),
            ("fsdp_config.mixed_precision.buffer_dtype", "fp32"),
        )
    },
    "actor_rollout_ref.model.torch_dtype": None,
    "critic.model.torch_dtype": None,
    "actor_rollout_ref.actor.use_rollout_log_probs": False,
    # verl's recipes: DAPO's generation batch, and its fully-async trainer's config
    # (verl/experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml) beyond what our schema holds
    "data.gen_batch_size": None,
    "rollout.n": 4,
    "async_training.use_rollout_log_probs": True,
    "async_training.compute_prox_log_prob": False,
    "async_training.use_trainer_do_validate": False,
    "async_training.checkpoint_engine.enable": True,
    "async_training.checkpoint_engine.device_buffer_size_M": 4096,
    "async_training.checkpoint_engine.overlap_broadcast_and_consume": False,
    "actor_rollout_ref.checkpoint_engine": None,
}

_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "half": "fp16", "float": "fp32"}
_TUNING = "tunes GPU memory or kernels; the FSDP2 engine and the CPU platform have no such knob"
_MEGATRON_OPTIM = NotYet(
    "megatron's own optimizer and lr-schedule options",
    "both engines take our optim keys (lr, weight_decay, lr_scheduler_type, lr_warmup_steps_ratio, min_lr_ratio, ...)",
)
_LORA = NotYet("LoRA", "train the full model (the default) or warm-start with `verl sft`")
#: verl's model.lora.* node configures LoRA of its Megatron engine (megatron-bridge); ours is the FSDP engine's.
_MEGATRON_LORA = NotYet("LoRA in the Megatron engine (model.lora.*)", "use model.lora_rank with strategy=fsdp2")
_PROFILER = NotYet("verl's profiler integration", "profile a worker with torch.profiler or py-spy by hand")
_VLM = NotYet("vision-language models", "train a text-only model")


def _fsdp_section(prefix: str, ours: str) -> list[tuple[str, Rule]]:
    """verl's ``fsdp_config`` knobs under ``prefix`` (ours live under ``ours``)."""
    role = prefix.removesuffix(".model")  # critic.model.fsdp_config belongs to critic
    return [
        (f"{prefix}.fsdp_config.param_offload", Alias(f"{ours}.param_offload")),
        (f"{prefix}.fsdp_config.optimizer_offload", Alias(f"{ours}.optimizer_offload")),
        (f"{prefix}.fsdp_config.reshard_after_forward", Alias(f"{ours}.reshard_after_forward")),
        (f"{prefix}.fsdp_config.model_dtype", Alias(f"{ours}.model_dtype", _DTYPES)),
        (f"{prefix}.fsdp_config.dtype", Alias(f"{ours}.param_dtype", _DTYPES)),
        (f"{prefix}.fsdp_config.mixed_precision.param_dtype", Alias(f"{ours}.param_dtype", _DTYPES)),
        (f"{prefix}.fsdp_config.mixed_precision.reduce_dtype", Alias(f"{ours}.reduce_dtype", _DTYPES)),
        (f"{prefix}.fsdp_config.mixed_precision.buffer_dtype", NoEffect("buffers keep the model's dtype")),
        (f"{prefix}.fsdp_config.offload_policy", NoEffect("offloading is param_offload / optimizer_offload")),
        (f"{prefix}.fsdp_config.cpu_offload", Alias(f"{ours}.param_offload")),
        (f"{prefix}.fsdp_config.offload_params", Alias(f"{ours}.param_offload")),
        (f"{prefix}.fsdp_config.fsdp_size", Alias(f"{ours}.fsdp_size")),
        # verl's engine-side copy of the role's key (ours is the role's: critic.ulysses_sequence_parallel_size)
        (f"{prefix}.fsdp_config.ulysses_sequence_parallel_size", Alias(f"{role}.ulysses_sequence_parallel_size")),
        (f"{prefix}.fsdp_config.full_determinism", NotYet("full determinism mode", "CPU runs are deterministic")),
        (f"{prefix}.fsdp_config.seed", NoEffect("every rank is seeded from trainer.seed")),
        (f"{prefix}.fsdp_config.strategy", Internal()),
        (f"{prefix}.fsdp_config.forward_only", Internal()),
        (f"{prefix}.fsdp_config.*", NoEffect(_TUNING)),
    ]


def _optim_section(prefix: str) -> list[tuple[str, Rule]]:
    return [
        (f"{prefix}.grad_clip", Alias(f"{prefix}.optim.clip_grad")),
        (f"{prefix}.optim.warmup_style", Alias(f"{prefix}.optim.lr_scheduler_type")),
        (f"{prefix}.optim.lr_scheduler", Alias(f"{prefix}.optim.lr_scheduler_type")),
        (f"{prefix}.optim.optimizer", NotYet("optimizers other than AdamW", "use AdamW (optimizer=AdamW)")),
        (f"{prefix}.optim.optimizer_impl", NotYet("other optimizer modules", "use torch.optim")),
        (f"{prefix}.optim.override_optimizer_config*", _MEGATRON_OPTIM),
        (f"{prefix}.optim.*", _MEGATRON_OPTIM),  # the rest of optim is megatron's (lr_decay_style, ...)
    ]


def _megatron_section(prefix: str) -> list[tuple[str, Rule]]:
    """verl's ``megatron`` knobs under ``prefix`` that our ``MegatronConfig`` (the node ``prefix.megatron``,
    the engine's own class) does not hold: its parallel sizes, offload, sequence parallelism, distributed
    optimizer and seed are ours under the same keys."""
    m = f"{prefix}.megatron"
    transformer = "overriding megatron's TransformerConfig"
    return [
        (f"{m}.dtype", Alias(f"{m}.params_dtype", _DTYPES)),
        (
            f"{m}.expert_tensor_parallel_size",
            NotYet(
                "an expert tensor-parallel size of its own in the Megatron engine (experts are split over the TP "
                "ranks, megatron's default)",
                "leave expert_tensor_parallel_size null; expert_model_parallel_size spreads the experts",
                off=(1,),
            ),
        ),
        (
            f"{m}.use_dist_checkpointing",
            NotYet(
                "loading megatron's distributed checkpoints",
                "start from a Hugging Face folder (model.path); our checkpoints reshard across layouts",
            ),
        ),
        (f"{m}.dist_checkpointing_*", NoEffect("megatron's distributed checkpoints are not read")),
        (f"{m}.override_ddp_config", NotYet("overriding megatron's DDP config", "leave override_ddp_config empty")),
        (
            f"{m}.override_mcore_model_config",
            NotYet(
                "overriding megatron's model config", "set Hugging Face config attributes with model.override_config"
            ),
        ),
        (
            f"{m}.override_transformer_config.recompute_*",
            NotYet("activation recomputation in the Megatron engine", "leave recompute_* unset", off=(["core_attn"],)),
        ),
        (
            f"{m}.override_transformer_config.attention_backend",
            NoEffect("megatron's local attention runs on CPU; TE's where installed"),
        ),
        (f"{m}.override_transformer_config*", NotYet(transformer, "leave override_transformer_config unset")),
        (f"{m}.use_mbridge", NoEffect("weights convert with our own HF <-> megatron converter")),
        (f"{m}.vanilla_mbridge", NoEffect("weights convert with our own HF <-> megatron converter")),
        (
            f"{m}.use_remove_padding",
            NoEffect("the Megatron engine left-aligns rows and runs each micro-batch at its longest row"),
        ),
        (f"{m}.forward_only", Internal()),
    ]


def _checkpoint_section(prefix: str) -> list[tuple[str, Rule]]:
    return [
        (f"{prefix}.checkpoint.async_save", NotYet("asynchronous checkpoint writes", "leave async_save=false")),
        (
            f"{prefix}.checkpoint.*",
            NotYet(
                "choosing checkpoint contents",
                "checkpoints always hold model, "
                "optimizer and trainer state; `verl export` writes a Hugging Face folder",
            ),
        ),
    ]


def _lora_keys(prefix: str) -> list[tuple[str, Rule]]:
    """verl's LoRA keys of a ``model`` node whose LoRA our schema does not hold (verl's SFT trainer)."""
    return [
        (f"{prefix}.lora_rank", _LORA),
        (f"{prefix}.lora_alpha", NoEffect("LoRA is off (lora_rank=0)")),
        (f"{prefix}.target_modules", NoEffect("LoRA is off (lora_rank=0)")),
        (f"{prefix}.exclude_modules", NoEffect("LoRA is off (lora_rank=0)")),
    ]


def _model_section(prefix: str, fsdp: str) -> list[tuple[str, Rule]]:
    """verl's ``model`` knobs under ``prefix``; ``fsdp`` is where our engine's dtypes of that role live.
    (Its LoRA keys lora_rank, lora_alpha, target_modules and exclude_modules are the schema's own.)"""
    return [
        (
            f"{prefix}.lora_adapter_path",
            NotYet("starting from a trained LoRA adapter", "start from fresh adapters (leave lora_adapter_path unset)"),
        ),
        # verl copies the model folder to /dev/shm before loading it, to load faster from network storage
        (f"{prefix}.use_shm", NoEffect("models are read from a local folder")),
        (
            f"{prefix}.external_lib",
            NotYet(
                "importing an external model library",
                "register the model with transformers' Auto classes in a plugin (VERL_USE_EXTERNAL_MODULES)",
            ),
        ),
        (f"{prefix}.enable_activation_offload", NotYet("activation offload", "use enable_gradient_checkpointing")),
        (f"{prefix}.use_liger", NoEffect(_TUNING)),
        (f"{prefix}.use_fused_kernels", NoEffect(_TUNING)),
        (f"{prefix}.fused_kernel_options.*", NoEffect(_TUNING)),
        (f"{prefix}.tiled_mlp.enabled", NotYet("tiled MLP", "use enable_gradient_checkpointing")),
        (f"{prefix}.tiled_mlp.*", NoEffect("tiled MLP is off")),
        (f"{prefix}.hf_config_path", NotYet("a separate config folder", "put config.json in the model folder")),
        (f"{prefix}.torch_dtype", Alias(f"{fsdp}.model_dtype", _DTYPES)),
        (f"{prefix}.mtp.enable", NotYet("multi-token prediction", "leave mtp disabled")),
        (f"{prefix}.mtp.*", NoEffect("multi-token prediction is off")),
        (
            f"{prefix}.input_tokenizer",
            NotYet(
                "a reward model with its own tokenizer",
                "use a reward model that shares the policy's tokenizer (leave input_tokenizer unset)",
            ),
        ),
        (f"{prefix}.fsdp_config.*", NoEffect("this role runs forward-only with the reference's FSDP layout")),
    ]


RULES: list[tuple[str, Rule]] = [
    ("*._target_", Internal()),
    ("*.rollout_n", Internal()),
    # ---------------------------------------------------------------- actor, ref, rollout, model
    *_fsdp_section("actor_rollout_ref.actor", "actor_rollout_ref.actor.fsdp_config"),
    *_fsdp_section("actor_rollout_ref.ref", "actor_rollout_ref.ref.fsdp_config"),
    *_optim_section("actor_rollout_ref.actor"),
    *_checkpoint_section("actor_rollout_ref.actor"),
    *_megatron_section("actor_rollout_ref.actor"),
    *_megatron_section("actor_rollout_ref.ref"),
    ("actor_rollout_ref.actor.load_weight", Internal()),
    ("actor_rollout_ref.ref.load_weight", Internal()),
    (
        "actor_rollout_ref.actor.ppo_micro_batch_size",
        NotYet("a global micro-batch size (deprecated in verl)", "use ppo_micro_batch_size_per_gpu"),
    ),
    (
        "actor_rollout_ref.*.log_prob_micro_batch_size",
        NotYet("a global micro-batch size (deprecated in verl)", "use log_prob_micro_batch_size_per_gpu"),
    ),
    ("actor_rollout_ref.actor.use_prefix_grouper", Alias("actor_rollout_ref.model.share_prompts")),
    ("actor_rollout_ref.actor.use_remove_padding", Alias("actor_rollout_ref.model.use_remove_padding")),
    ("actor_rollout_ref.actor.use_fused_kernels", NoEffect(_TUNING)),
    ("actor_rollout_ref.*.use_torch_compile", NoEffect(_TUNING)),
    ("actor_rollout_ref.*.entropy_from_logits_with_chunking", NoEffect("log-probs and entropy are always chunked")),
    ("actor_rollout_ref.*.entropy_checkpointing", NoEffect(_TUNING)),
    ("actor_rollout_ref.actor.calculate_entropy", NoEffect("actor/entropy is always reported")),
    ("actor_rollout_ref.actor.data_loader_seed", NoEffect("mini-batch shuffles are seeded from trainer.seed")),
    ("actor_rollout_ref.actor.freeze_vision_tower", _VLM),
    ("actor_rollout_ref.*.router_replay.mode", NotYet("MoE router replay", "leave router_replay disabled")),
    ("actor_rollout_ref.*.router_replay.*", NoEffect("router replay is disabled")),
    ("actor_rollout_ref.*.profiler.enable", _PROFILER),
    ("actor_rollout_ref.*.profiler.tool", _PROFILER),
    ("actor_rollout_ref.*.profiler.*", NoEffect("profiling is off")),
    ("actor_rollout_ref.ref.strategy", Alias("actor_rollout_ref.actor.strategy")),
    ("*.nccl_timeout", NoEffect("collectives time out after trainer.worker_timeout_s")),
    ("actor_rollout_ref.actor.loss_scale_factor", NotYet("a fixed loss scale", "leave it unset")),
    ("actor_rollout_ref.actor.sum_pi_squared_checkpointing", NoEffect(_TUNING)),
    ("actor_rollout_ref.model.lora.rank", _MEGATRON_LORA),
    ("actor_rollout_ref.model.lora.adapter_path", _MEGATRON_LORA),
    ("actor_rollout_ref.model.lora.*", NoEffect("LoRA is off (lora.rank=0)")),
    ("data.tool_config_path", NoEffect("tools come from actor_rollout_ref.rollout.multi_turn.tool_config_path")),
    *_model_section("actor_rollout_ref.model", "actor_rollout_ref.actor.fsdp_config"),
    ("actor_rollout_ref.rollout.prompt_length", NoEffect("the rollout takes data.max_prompt_length")),
    ("actor_rollout_ref.rollout.response_length", NoEffect("the rollout takes data.max_response_length")),
    ("actor_rollout_ref.rollout.ignore_eos", NotYet("ignore_eos", "leave it false")),
    ("actor_rollout_ref.rollout.data_parallel_size", NotYet("rollout data parallelism", "leave it at 1", off=(1,))),
    ("actor_rollout_ref.rollout.expert_parallel_size", NotYet("rollout expert parallelism", "leave it at 1", off=(1,))),
    (
        "actor_rollout_ref.rollout.pipeline_model_parallel_size",
        NotYet("rollout pipeline parallelism", "leave it at 1", off=(1,)),
    ),
    ("actor_rollout_ref.rollout.logprobs_mode", NotYet("raw log-prob modes", "leave processed_logprobs")),
    ("actor_rollout_ref.rollout.over_sample_rate", NotYet("over-sampling", "leave it at 0")),
    ("actor_rollout_ref.rollout.skip_rollout", NotYet("replaying dumped rollouts", "leave it false")),
    ("actor_rollout_ref.rollout.skip_dump_dir", NoEffect("rollout replay is off")),
    ("actor_rollout_ref.rollout.skip_tokenizer_init", NoEffect("the rollout engine always has the tokenizer")),
    ("actor_rollout_ref.rollout.enable_rollout_routing_replay", NotYet("MoE routing replay", "leave it false")),
    ("actor_rollout_ref.rollout.quantization*", NotYet("quantized rollout", "roll out in the model's dtype")),
    ("actor_rollout_ref.rollout.mtp", NotYet("multi-token prediction", "leave it unset")),
    (
        "actor_rollout_ref.rollout.layered_summon",
        NoEffect("the actor's weights reach the rollout engine one tensor at a time already"),
    ),
    ("actor_rollout_ref.rollout.multi_stage_wake_up", NoEffect(_TUNING)),
    ("actor_rollout_ref.rollout.scheduling_policy", NoEffect("requests are served first come, first served")),
    ("actor_rollout_ref.rollout.cudagraph_capture_sizes", NoEffect(_TUNING)),
    ("actor_rollout_ref.rollout.agent.*", NoEffect("agent loops run inside each rollout worker")),
    ("actor_rollout_ref.rollout.trace.backend", NotYet("rollout tracing", "leave trace.backend unset")),
    ("actor_rollout_ref.rollout.trace.*", NoEffect("rollout tracing is off")),
    ("actor_rollout_ref.rollout.prometheus.enable", NotYet("Prometheus metrics", "use trainer.logger")),
    ("actor_rollout_ref.rollout.prometheus.*", NoEffect("Prometheus metrics are off")),
    (
        "actor_rollout_ref.rollout.checkpoint_engine.backend",
        NotYet("checkpoint-engine weight transfer", "weights sync in place (hybrid engine)"),
    ),
    ("actor_rollout_ref.rollout.checkpoint_engine.*", NoEffect("weights sync in place (hybrid engine)")),
    (
        "actor_rollout_ref.rollout.mode",
        NoEffect(
            "the hybrid engine generates in the actor's processes; agent loops on vllm stream each turn as a "
            "request into its running batch (what verl's async mode gives them)"
        ),
    ),
    ("actor_rollout_ref.rollout.*", NoEffect("a serving-engine knob the rollout engines here do not take")),
    # ---------------------------------------------------------------- critic
    *_fsdp_section("critic.model", "critic.fsdp_config"),
    *_optim_section("critic"),
    *_checkpoint_section("critic"),
    *_megatron_section("critic"),
    ("critic.load_weight", Internal()),
    ("critic.strategy", Alias("actor_rollout_ref.actor.strategy")),
    (
        "critic.ppo_micro_batch_size",
        NotYet("a global micro-batch size (deprecated in verl)", "use critic.ppo_micro_batch_size_per_gpu"),
    ),
    ("critic.forward_micro_batch_size*", NoEffect("the values pass uses critic.ppo_micro_batch_size_per_gpu")),
    ("critic.forward_max_token_len_per_gpu", NoEffect("the values pass uses critic.ppo_max_token_len_per_gpu")),
    ("critic.shuffle", NoEffect("critic mini-batches follow the actor's order")),
    ("critic.data_loader_seed", NoEffect("mini-batch shuffles are seeded from trainer.seed")),
    ("critic.profiler.enable", _PROFILER),
    ("critic.profiler.tool", _PROFILER),
    ("critic.profiler.*", NoEffect("profiling is off")),
    ("critic.enable", NoEffect("the critic runs when the estimator needs values (algorithm.adv_estimator)")),
    ("critic.model.use_fused_kernels", NoEffect(_TUNING)),
    *_model_section("critic.model", "critic.fsdp_config"),
    ("critic.model.*", NoEffect(_TUNING)),
    # ---------------------------------------------------------------- reward
    ("reward_model.strategy", Alias("actor_rollout_ref.actor.strategy")),
    (
        "reward_model.micro_batch_size",
        NotYet("a global micro-batch size (deprecated in verl)", "use reward_model.micro_batch_size_per_gpu"),
    ),
    ("reward_model.max_length", NoEffect("the reward model reads prompt + response as generated")),
    ("reward_model.use_dynamic_bsz", NoEffect("the reward model uses micro_batch_size_per_gpu")),
    ("reward_model.forward_max_token_len_per_gpu", NoEffect("the reward model uses micro_batch_size_per_gpu")),
    ("reward_model.use_reward_loop", NoEffect("rewards are scored in the driver, in parallel")),
    ("reward_model.num_workers", NoEffect("rewards are scored in the driver, in parallel")),
    ("reward_model.launch_reward_fn_async", NoEffect("rewards are scored in the driver, in parallel")),
    ("reward_model.reward_loop_source", NotYet("custom reward loops", "use custom_reward_function.path")),
    ("reward_model.reward_loop_*", NotYet("custom reward loops", "use custom_reward_function.path")),
    (
        "reward_model.sandbox_fusion.url",
        NotYet(
            "a remote SandboxFusion service",
            "code rewards run in the built-in local sandbox (data_source of a code task)",
        ),
    ),
    ("reward_model.sandbox_fusion.*", NoEffect("code rewards run in the built-in local sandbox")),
    (
        "reward_model.rollout.*",
        NoEffect(
            "the reward model runs forward-only on the training engine, in the "
            "trainer's workers, not on a serving engine"
        ),
    ),
    ("reward_model.profiler.enable", _PROFILER),
    ("reward_model.profiler.tool", _PROFILER),
    ("reward_model.profiler.*", NoEffect("profiling is off")),
    (
        "reward_model.megatron.*",
        NotYet(
            "a megatron section of the reward model's own",
            "with strategy=megatron the reward model runs with actor_rollout_ref.ref.megatron's settings",
        ),
    ),
    ("reward_model.load_weight", Internal()),
    *_model_section("reward_model.model", "actor_rollout_ref.ref.fsdp_config"),
    ("reward_manager.name", Alias("reward_model.reward_manager")),
    (
        "reward_manager.source",
        NotYet(
            "importing a reward manager class",
            "register it (REWARD_MANAGERS) in a plugin, or use custom_reward_function.path",
        ),
    ),
    ("reward_manager.module.path", NotYet("importing a reward manager class", "register it in a plugin")),
    ("reward_manager.module.*", NoEffect("no reward manager module is imported")),
    # ---------------------------------------------------------------- data
    ("data.tokenizer", Alias("actor_rollout_ref.model.tokenizer_path")),
    ("data.use_shm", NoEffect("data files are read locally")),
    ("data.return_raw_input_ids", NoEffect("the trainer keeps the prompt ids and the raw chat of every sample")),
    ("data.return_raw_chat", NoEffect("the trainer keeps the prompt ids and the raw chat of every sample")),
    ("data.return_full_prompt", NoEffect("the trainer keeps the prompt ids and the raw chat of every sample")),
    ("data.dataloader_num_workers", NoEffect("prompts are tokenized once, before training")),
    ("data.filter_overlong_prompts_workers", NoEffect("prompts are tokenized once, before training")),
    ("data.validation_shuffle", NotYet("shuffled validation", "validation runs over the whole set in order")),
    ("data.trust_remote_code", Alias("actor_rollout_ref.model.trust_remote_code")),
    ("data.image_key", _VLM),
    ("data.video_key", _VLM),
    ("data.image_patch_size", NoEffect("multi-modal inputs are not supported")),
    ("data.return_multi_modal_inputs", NoEffect("multi-modal inputs are not supported")),
    ("data.custom_cls.path", NotYet("a custom dataset class", "convert the data to verl's parquet schema")),
    ("data.custom_cls.*", NoEffect("no custom dataset class")),
    ("data.sampler.class_path", NotYet("a custom sampler (curriculum)", "use data.shuffle")),
    ("data.sampler.*", NoEffect("no custom sampler")),
    ("data.datagen.path", NotYet("a data generator class", "use data.train_files (or builtin:<task>)")),
    ("data.datagen.*", NoEffect("no data generator")),
    ("data.reward_fn_key", NotYet("choosing the reward key column", "name the task in the data_source column")),
    # ---------------------------------------------------------------- trainer and the rest
    (
        "trainer.rollout_data_dir",
        NotYet(
            "dumping rollouts to files",
            "trainer.log_val_generations logs validation generations; metrics.jsonl has the per-step metrics",
        ),
    ),
    (
        "trainer.validation_data_dir",
        NotYet("dumping validation generations to files", "use trainer.log_val_generations"),
    ),
    ("trainer.esi_redundant_time", NoEffect("elastic-instance timing does not apply")),
    ("trainer.default_hdfs_dir", NotYet("copying checkpoints to HDFS", "copy trainer.default_local_dir yourself")),
    ("trainer.del_local_ckpt_after_load", NotYet("deleting checkpoints after load", "leave it false")),
    (
        "trainer.max_critic_ckpt_to_keep",
        NoEffect("checkpoints rotate as whole global_step folders, by trainer.max_actor_ckpt_to_keep"),
    ),
    ("trainer.max_ckpt_to_keep", Alias("trainer.max_actor_ckpt_to_keep")),
    ("trainer.ray_wait_register_center_timeout", NoEffect("workers register with the driver directly")),
    ("trainer.device", NoEffect("the platform is detected (`verl platforms`); VERL_PLATFORM forces one")),
    ("trainer.use_legacy_worker_impl", NoEffect("there is one worker implementation")),
    ("trainer.npu_profile.*", NoEffect("profiling is off")),
    ("trainer.profile_*", NoEffect("profiling is off")),
    ("trainer.checkpoint.*", NoEffect("checkpoints always hold model, optimizer and trainer state")),
    ("global_profiler.tool", _PROFILER),
    ("global_profiler.steps", _PROFILER),
    ("global_profiler.*", NoEffect("profiling is off")),
    ("transfer_queue.enable", NotYet("the transfer queue", "leave it false")),
    # ---------------------------------------------------------------- recipes: DAPO, fully async
    (
        "data.gen_batch_size",
        NoEffect(
            "a generation round draws data.train_batch_size prompts (dynamic sampling runs up to "
            "algorithm.filter_groups.max_num_gen_batches of them); the fully async rollouter draws a step's prompts"
        ),
    ),
    ("rollout.n", NoEffect("the group size is actor_rollout_ref.rollout.n (verl's fully async trainer reads that)")),
    # verl's fully async trainer takes the rollout's log-probs as the PPO ratio's old ones: bypass mode
    ("async_training.use_rollout_log_probs", Alias("algorithm.rollout_correction.bypass_mode")),
    ("actor_rollout_ref.actor.use_rollout_log_probs", Alias("algorithm.rollout_correction.bypass_mode")),
    # ... or recomputes them with the trainer's weights (its proximal log-probs): the decoupled mode
    (
        "async_training.compute_prox_log_prob",
        Alias("algorithm.rollout_correction.bypass_mode", {True: False, False: True}),
    ),
    (
        "async_training.use_trainer_do_validate",
        NoEffect("validation generates on the rollout pool, after a push of the trainer's current weights"),
    ),
    (
        "async_training.checkpoint_engine.*",
        NoEffect("weights travel over the rollout pool's own process group in 64 MiB buckets"),
    ),
    ("actor_rollout_ref.checkpoint_engine", Internal()),
    ("ray_kwargs.*", NoEffect("the local Ray is started by the trainer (trainer.ray_address joins a cluster)")),
    ("ray_init.*", NoEffect("the local Ray is started by the trainer (trainer.ray_address joins a cluster)")),
]

#: Rules of ``verl sft`` (verl's fsdp_sft_trainer / sft_trainer keys).
SFT_RULES: list[tuple[str, Rule]] = [
    ("*._target_", Internal()),
    ("data.micro_batch_size", NoEffect("deprecated in verl and unused there too; micro_batch_size_per_gpu counts")),
    ("data.max_length", NoEffect("sequences are cut at data.max_prompt_length + data.max_response_length")),
    ("data.truncation", NoEffect("prompts and responses are cut to their max lengths from the right")),
    ("data.balance_dp_token", NoEffect("micro-batches are balanced by tokens with use_dynamic_bsz")),
    ("data.chat_template", NotYet("a data-side chat template", "use model.custom_chat_template")),
    ("data.multiturn.enable", NotYet("multi-turn SFT data", "give one prompt and one response per row")),
    ("data.multiturn.*", NoEffect("multi-turn SFT is off")),
    ("data.messages_key", NoEffect("multi-turn SFT is off")),
    ("data.tools_key", NoEffect("multi-turn SFT is off")),
    ("data.enable_thinking_key", NoEffect("multi-turn SFT is off")),
    ("data.pad_mode", NoEffect("sequences are always packed")),
    ("data.ignore_input_ids_mismatch", NoEffect("multi-turn SFT is off")),
    ("data.train_max_samples", NotYet("capping the training set", "subset the data file")),
    ("data.custom_cls.path", NotYet("a custom dataset class", "convert the data to parquet")),
    ("data.custom_cls.*", NoEffect("no custom dataset class")),
    ("data.use_shm", NoEffect("data files are read locally")),
    ("data.use_dynamic_bsz", Alias("use_dynamic_bsz")),
    ("data.max_token_len_per_gpu", Alias("max_token_len_per_gpu")),
    ("model.partial_pretrain", Alias("model.path")),
    ("model.strategy", NoEffect("SFT runs on the FSDP2 engine")),
    ("model.fsdp_config.param_offload", Alias("fsdp_config.param_offload")),
    ("model.fsdp_config.cpu_offload", Alias("fsdp_config.param_offload")),
    ("model.fsdp_config.offload_params", Alias("fsdp_config.param_offload")),
    ("model.fsdp_config.model_dtype", Alias("fsdp_config.model_dtype", _DTYPES)),
    ("model.fsdp_config.*", NoEffect(_TUNING)),
    *_lora_keys("model"),
    *_model_section("model", "fsdp_config"),
    ("optim.lr_scheduler", Alias("optim.lr_scheduler_type")),
    ("optim.warmup_style", Alias("optim.lr_scheduler_type")),
    ("optim.*", NoEffect("a megatron/optimizer-module knob; SFT uses torch AdamW")),
    ("use_remove_padding", Alias("model.use_remove_padding")),
    ("trainer.default_hdfs_dir", NotYet("copying checkpoints to HDFS", "copy trainer.default_local_dir yourself")),
    ("trainer.max_ckpt_to_keep", NoEffect("SFT keeps every checkpoint it writes")),
    ("trainer.checkpoint.*", NoEffect("checkpoints always hold model, optimizer and trainer state")),
    ("checkpoint.*", NoEffect("checkpoints always hold model, optimizer and trainer state")),
    ("trainer.device", NoEffect("the platform is detected (`verl platforms`); VERL_PLATFORM forces one")),
    ("trainer.profile_*", NoEffect("profiling is off")),
    ("engine.*", NoEffect("SFT runs on the FSDP2 engine")),
]
