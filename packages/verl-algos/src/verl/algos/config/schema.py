"""The run configuration: dataclasses whose key paths are verl's (``data.train_batch_size``,
``actor_rollout_ref.actor.optim.lr``, ``algorithm.adv_estimator``, ...), so verl run scripts carry over.

Defaults are the embedded main job: GRPO on SmolLM2-135M-Instruct over the offline arithmetic task, on
this CPU. Recipes (``recipes/*.yaml``) change only what their algorithm needs. Value checks live in
``__post_init__`` and raise with the key's full path, so a bad value never starts a run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from verl.algos.advantages.config import AdvantageConfig
from verl.algos.advantages.pf_ppo import PFPPOConfig
from verl.algos.agent.config import MultiTurnConfig
from verl.algos.async_training.config import AsyncTrainingConfig, apply_verl_async_sizes
from verl.algos.data.dynamic_sampling import FilterGroupsConfig
from verl.algos.losses.kl_control import KLControlConfig
from verl.algos.policy_losses.config import ActorLossConfig
from verl.algos.rewards.config import CustomRewardFunctionConfig, OverlongBufferConfig
from verl.algos.rollout_correction.config import RolloutCorrectionConfig
from verl.algos.run.config import RunLoopConfig
from verl.core.checks import check_choice, check_positive, check_positive_fields, check_range
from verl.engines.fsdp.config import FSDPConfig
from verl.engines.fsdp.lora import LoRAConfig
from verl.engines.megatron.config import MegatronConfig
from verl.engines.optim_config import OptimConfig
from verl.engines.rollout.hf.config import HFServingConfig
from verl.engines.rollout.vllm.config import VLLMServingConfig


def _check_sampling(top_p: float, top_k: int, temperature: float) -> None:
    check_range("top_p", top_p, 0.0, 1.0, low_open=True)
    if top_k < -1:
        raise ValueError(f"top_k={top_k} has no meaning: use a positive k, or -1 (or 0) for no top-k filtering")
    check_positive("temperature", temperature, allow_zero=True)


# --------------------------------------------------------------------------------------------- data
@dataclass
class DataConfig:
    #: Parquet/jsonl files in verl's schema, or "builtin:<task>" for an offline generated task.
    train_files: list[str] = field(default_factory=lambda: ["builtin:arithmetic"])
    val_files: list[str] = field(default_factory=lambda: ["builtin:arithmetic"])
    prompt_key: str = "prompt"
    max_prompt_length: int = 128
    max_response_length: int = 24
    #: prompts per step; 0 (verl's fully async scripts): derived, async_training.require_batches x
    #: actor_rollout_ref.actor.ppo_mini_batch_size, which only async_training.mode=fully_async allows
    train_batch_size: int = 2
    val_batch_size: int | None = None  # None: the whole validation set in one batch
    #: Keep at most this many validation prompts (None or -1: all).
    val_max_samples: int | None = None
    #: Keep at most this many training prompts (-1: all), as verl.
    train_max_samples: int = -1
    shuffle: bool = True
    seed: int = 42
    filter_overlong_prompts: bool = True
    truncation: str = "error"
    #: With a tokenizer that has no chat template: send the messages' contents as plain text instead of
    #: stopping with an error.
    plain_prompt_fallback: bool = False
    #: Options of the built-in generated tasks (builtin:<task>): sizes, ranges, split seed.
    builtin: dict[str, Any] = field(default_factory=dict)
    #: Extra keyword arguments of the tokenizer's apply_chat_template (e.g. enable_thinking: false), as verl.
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_positive_fields(self, "max_prompt_length", "max_response_length", "val_batch_size")
        check_positive("train_batch_size", self.train_batch_size, allow_zero=True)
        check_choice("truncation", self.truncation, ("error", "left", "right", "middle"))


# --------------------------------------------------------------------------------------------- model
@dataclass
class ModelConfig(LoRAConfig):
    """verl's ``model`` node; its LoRA keys (``lora_rank``, ``lora_alpha``, ``target_modules``,
    ``exclude_modules``) are the FSDP engine's :class:`LoRAConfig`, flat under ``model`` as in verl."""

    #: A local Hugging Face folder, or a built-in model name (nothing is downloaded).
    path: str = "smollm2-135m-instruct"
    tokenizer_path: str | None = None
    #: A Jinja chat template (the text, or the path of a .jinja file) for a tokenizer that lacks one.
    custom_chat_template: str | None = None
    use_remove_padding: bool = True
    #: With packing: compute a prompt once for all of its responses (rollout.n) in a micro-batch.
    share_prompts: bool = True
    enable_gradient_checkpointing: bool = False
    trust_remote_code: bool = False
    override_config: dict[str, Any] = field(default_factory=dict)


@dataclass
class ActorConfig(ActorLossConfig):
    """verl's ``actor_rollout_ref.actor``: the loss keys (:class:`ActorLossConfig`, which the policy
    losses read), then batching, the optimizer and the engine's sharding."""

    strategy: str = "fsdp2"
    ppo_mini_batch_size: int = 2  # in prompts, as in verl (multiplied by rollout.n)
    ppo_micro_batch_size_per_gpu: int = 8
    use_dynamic_bsz: bool = True
    #: Tokens per micro-batch with use_dynamic_bsz (verl's default; one sequence at its limits must fit).
    ppo_max_token_len_per_gpu: int = 16384
    ppo_epochs: int = 1
    #: Run the separate old-log-prob forward even when the update is on-policy (one epoch, one
    #: mini-batch), where the update's own detached log-probs are the same numbers. Off saves a pass.
    recompute_old_log_prob: bool = False
    shuffle: bool = False
    #: Return sum_v pi_v^2 per token from the old-log-prob pass (the optimal token baseline needs it and
    #: turns it on itself).
    calculate_sum_pi_squared: bool = False
    #: Ulysses sequence parallelism (FSDP engine): ranks per group that split each micro-batch's tokens and
    #: count as one data-parallel rank. Needs model.use_remove_padding and sdpa. 1: off.
    ulysses_sequence_parallel_size: int = 1
    #: AdamW, gradient clipping (verl's actor.grad_clip is optim.clip_grad) and the lr schedule.
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=2e-5))
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    #: The Megatron engine's layout, offload and precision (strategy=megatron). Its parallel layout is
    #: the run's: the reference and the critic share these processes and follow it.
    megatron: MegatronConfig = field(default_factory=MegatronConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_fields(
            self,
            "ppo_mini_batch_size",
            "ppo_micro_batch_size_per_gpu",
            "ppo_max_token_len_per_gpu",
            "ppo_epochs",
            "ulysses_sequence_parallel_size",
        )


@dataclass
class SamplingOverrides:
    n: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = False

    def __post_init__(self) -> None:
        check_positive("n", self.n)
        _check_sampling(self.top_p, self.top_k, self.temperature)


@dataclass
class AgentLoopConfig:
    """verl's ``actor_rollout_ref.rollout.agent`` node."""

    #: The agent loop of a prompt whose row has no ``agent_name`` (``verl.algos.agent.loops.AGENT_LOOPS``).
    default_agent_loop: str = "single_turn_agent"
    #: verl's agent loop config file: a list of {name, _target_: class path, keyword arguments}; its loops
    #: are picked by a row's agent_name like the registered ones (verl.algos.agent.loops.AGENT_LOOPS).
    agent_loop_config_path: str | None = None
    #: verl's agent-loop worker processes. No effect here: each rollout worker runs the loops of its share
    #: of the batch itself, stepping all trajectories together (tool calls on threads).
    num_workers: int = 8


@dataclass
class RolloutConfig(VLLMServingConfig, HFServingConfig):
    """verl's flat rollout section: the sampling settings here, and each rollout engine's serving settings
    from the class that engine owns (vLLM's scheduler, memory and graph knobs; the hf engine's decode
    batch). An engine takes the keys it declares and warns about another engine's that were changed."""

    name: str = "hf"
    n: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = True
    #: Record the rollout engine's own log-probs (for the rollout-vs-training mismatch metric).
    calculate_log_probs: bool = True
    #: Micro-batching of the actor's old-log-prob pass (verl keeps these under rollout); None: the actor's
    #: use_dynamic_bsz / ppo_max_token_len_per_gpu.
    log_prob_micro_batch_size_per_gpu: int = 16
    log_prob_use_dynamic_bsz: bool | None = None
    log_prob_max_token_len_per_gpu: int | None = None
    #: Backend-specific engine arguments, passed through (e.g. vLLM's kv_cache_memory_bytes).
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    val_kwargs: SamplingOverrides = field(default_factory=SamplingOverrides)
    #: Agentic rollouts (verl's keys): multi_turn.enable runs each prompt through an agent loop with tools.
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    agent: AgentLoopConfig = field(default_factory=AgentLoopConfig)

    def __post_init__(self) -> None:
        VLLMServingConfig.__post_init__(self)
        HFServingConfig.__post_init__(self)
        check_positive("n", self.n)
        if self.do_sample:
            check_positive("temperature", self.temperature)
        _check_sampling(self.top_p, self.top_k, self.temperature)
        check_positive_fields(self, "log_prob_micro_batch_size_per_gpu", "log_prob_max_token_len_per_gpu")

    def serving_values(self) -> dict[str, Any]:
        """The rollout engines' settings, by the classes they own (this class's bases)."""
        engines = (VLLMServingConfig, HFServingConfig)
        return {f.name: getattr(self, f.name) for engine in engines for f in dataclasses.fields(engine)}


@dataclass
class RefConfig:
    #: Micro-batching of the reference pass; None: the actor's use_dynamic_bsz / ppo_max_token_len_per_gpu.
    log_prob_micro_batch_size_per_gpu: int = 16
    log_prob_use_dynamic_bsz: bool | None = None
    log_prob_max_token_len_per_gpu: int | None = None
    #: None: the actor's (as verl's interpolation). The reference shares the actor's processes and their
    #: data-parallel layout, so it may not differ from the actor's.
    ulysses_sequence_parallel_size: int | None = None
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    #: strategy=megatron: offload and precision of the reference (its parallel layout is the actor's).
    megatron: MegatronConfig = field(default_factory=MegatronConfig)

    def __post_init__(self) -> None:
        check_positive_fields(self, "log_prob_micro_batch_size_per_gpu", "log_prob_max_token_len_per_gpu")


@dataclass
class ActorRolloutRefConfig:
    #: True: the actor, its rollout engine and the reference share each process (the hybrid engine).
    #: False: the rollout runs on a pool of its own (the top-level ``rollout`` section) and receives the
    #: actor's weights over a collective after each update (see config.placement and workers.weight_sync).
    hybrid_engine: bool = True
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ref: RefConfig = field(default_factory=RefConfig)


@dataclass
class StandaloneRolloutConfig:
    """verl's top-level ``rollout`` section (its one-step-off and fully-async recipes): the rollout's own
    pool, ``n_gpus_per_node`` processes on each of ``nnodes`` nodes, used when
    ``actor_rollout_ref.hybrid_engine=false``. The trainer's pool is then the ``trainer`` section's."""

    nnodes: int = 1
    n_gpus_per_node: int = 1
    #: verl's fully async keys (they apply in every mode here): the rollout draws at most this many prompts
    #: (the run trains at most total_rollout_steps // data.train_batch_size steps) ...
    total_rollout_steps: int | None = None
    #: ... over at most this many passes of the data (trainer.total_epochs caps it too) ...
    total_epochs: int | None = None
    #: ... and validation runs every test_freq weight pushes (trainer.test_freq becomes test_freq x
    #: async_training.trigger_parameter_sync_step steps in fully_async mode, test_freq steps otherwise)
    test_freq: int | None = None

    def __post_init__(self) -> None:
        check_positive_fields(self, "nnodes", "n_gpus_per_node", "total_rollout_steps", "total_epochs")
        if self.test_freq is not None and self.test_freq < -1:
            raise ValueError(f"test_freq={self.test_freq} has no meaning: use a positive number of pushes, or -1")


# --------------------------------------------------------------------------------------------- critic
@dataclass
class CriticConfig:
    #: Used only by estimators that need values (gae). Model defaults to the actor's.
    model: ModelConfig = field(default_factory=lambda: ModelConfig(path=""))
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    ppo_mini_batch_size: int | None = None  # None: the actor's
    ppo_micro_batch_size_per_gpu: int = 8
    use_dynamic_bsz: bool = True
    ppo_max_token_len_per_gpu: int = 32768  # verl's default for the critic
    ppo_epochs: int | None = None
    cliprange_value: float = 0.5
    loss_agg_mode: str = "token-mean"
    #: Ulysses sequence parallelism of the critic (FSDP engine), like the actor's. 1: off.
    ulysses_sequence_parallel_size: int = 1
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    #: strategy=megatron: offload and precision of the critic (its parallel layout is the actor's).
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    #: A pool of its own for the critic: n_gpus_per_node processes on each of nnodes nodes (ours, shaped
    #: like verl's reward_model keys; verl keeps its critic in the global pool). See config.placement.
    enable_resource_pool: bool = False
    n_gpus_per_node: int = 0
    nnodes: int = 0

    def __post_init__(self) -> None:
        check_positive_fields(self, "n_gpus_per_node", "nnodes", allow_zero=True)
        check_positive_fields(
            self,
            "ppo_mini_batch_size",
            "ppo_epochs",
            "ppo_micro_batch_size_per_gpu",
            "ppo_max_token_len_per_gpu",
            "cliprange_value",
            "ulysses_sequence_parallel_size",
        )


# --------------------------------------------------------------------------------------------- reward
@dataclass
class RewardModelConfig:
    #: A sequence-classifier reward model (in addition to or instead of the reward function).
    enable: bool = False
    model: ModelConfig = field(default_factory=lambda: ModelConfig(path=""))
    micro_batch_size_per_gpu: int = 8
    #: Ulysses sequence parallelism of the reward model (FSDP engine), like the critic's. 1: off.
    ulysses_sequence_parallel_size: int = 1
    reward_manager: str = "naive"
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    #: Keyword arguments of the reward manager (e.g. dapo's overlong_buffer_cfg, max_resp_len), as verl.
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    #: Seconds one reward-function call may take before it scores 0 (counted in reward/timeouts). Default
    #: 300, the per-call limit of verl's prime reward manager; null: no limit (calls then run one by one).
    #: With a limit, calls run 8 at a time in threads and a batch whose every call hangs ends in about one
    #: timeout (the run then stops, naming the function).
    timeout_s: float | None = 300.0
    #: verl's pool of its own for the reward model: n_gpus_per_node processes on each of nnodes nodes (verl's
    #: defaults). See config.placement.
    enable_resource_pool: bool = False
    n_gpus_per_node: int = 8
    nnodes: int = 0

    def __post_init__(self) -> None:
        check_positive_fields(self, "n_gpus_per_node", "nnodes", allow_zero=True)
        check_positive_fields(self, "ulysses_sequence_parallel_size")


# --------------------------------------------------------------------------------------------- algorithm
@dataclass
class AlgorithmConfig(AdvantageConfig):
    """verl's ``algorithm``: the estimator's keys (:class:`AdvantageConfig`), then the reward's KL penalty,
    dynamic sampling, rollout correction and PF-PPO."""

    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    #: PF-PPO: resample the batch by reward-derived weights after the advantages.
    use_pf_ppo: bool = False
    pf_ppo: PFPPOConfig = field(default_factory=PFPPOConfig)


# --------------------------------------------------------------------------------------------- trainer
@dataclass
class TrainerConfig(RunLoopConfig):
    """``verl train``'s trainer section: the run loop's keys with the main job's defaults, and PPO's own."""

    experiment_name: str = "grpo-smollm2-arithmetic"
    total_training_steps: int | None = 20
    save_freq: int = 10
    test_freq: int = 10
    plot_curves: bool = True
    #: Train only the critic for this many first steps (the actor waits for useful values), as verl.
    critic_warmup: int = 0
    val_before_train: bool = True
    val_only: bool = False
    max_actor_ckpt_to_keep: int | None = None
    balance_batch: bool = True
    #: On a worker fault (a worker died or hung): tear the workers down, start new ones and resume from the
    #: last complete checkpoint, at most this many times in a run (0: stop on the first fault).
    max_restarts: int = 0
    #: NaN/inf in rewards, advantages, the loss or the gradients: "skip" the step (nothing of it reaches
    #: the weights; the samples are named in the log) or "stop" the run (the last checkpoint is kept).
    nonfinite: str = "skip"
    log_val_generations: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive("critic_warmup", self.critic_warmup, allow_zero=True)
        if self.max_actor_ckpt_to_keep is not None:
            check_positive("max_actor_ckpt_to_keep", self.max_actor_ckpt_to_keep, allow_zero=True)
        check_positive("max_restarts", self.max_restarts, allow_zero=True)
        check_choice("nonfinite", self.nonfinite, ("skip", "stop"))


@dataclass
class PPOConfig:
    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    rollout: StandaloneRolloutConfig = field(default_factory=StandaloneRolloutConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    def __post_init__(self) -> None:
        apply_verl_async_sizes(self)
