"""Rules between config values of different sections, checked before Ray starts.

Each value of these pairs is valid alone (the schema checks that); together they would give a run that
fails late or quietly learns nothing. Every message names both keys and what to change.
"""

from __future__ import annotations

from verl.algos.advantages.registry import uses_critic
from verl.algos.config.placement import plan_placement, world_key
from verl.algos.config.schema import PPOConfig
from verl.algos.config.sequence_parallel import check_sequence_parallel
from verl.core.config import ConfigError


def check_consistency(cfg: PPOConfig) -> None:
    plan_placement(cfg)  # an impossible mapping of roles to pools is refused first
    _check_mini_batches(cfg)
    _check_group_size(cfg)
    _check_parallel_layout(cfg)
    _check_sequence_parallel(cfg)
    _check_token_budgets(cfg)
    _check_rollout_correction(cfg)
    _check_lora(cfg)
    _check_agent_configs(cfg)
    _check_async_training(cfg)


def _check_async_training(cfg: PPOConfig) -> None:
    """The asynchronous schedules draw batches ahead of training, on a rollout pool of their own."""
    mode = cfg.async_training.mode
    if mode == "sync":
        return
    if cfg.actor_rollout_ref.hybrid_engine:
        raise ConfigError(
            f"async_training.mode={mode} generates while the trainer trains, which needs the rollout on a pool of "
            "its own: set actor_rollout_ref.hybrid_engine=false with rollout.nnodes and rollout.n_gpus_per_node "
            f"(the recipe {'grpo_one_step_off' if mode == 'one_step_off' else 'grpo_async'} does)"
        )
    from verl.algos.advantages import get_adv_estimator

    if cfg.algorithm.filter_groups.enable:
        raise ConfigError(
            "algorithm.filter_groups.enable=true (dynamic sampling) generates as many rounds as a step needs, "
            f"which async_training.mode={mode} cannot draw ahead; use async_training.mode=sync with it"
        )
    if "reward_baselines" in get_adv_estimator(cfg.algorithm.adv_estimator).required_fields:
        raise ConfigError(
            f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} generates a greedy baseline with the current "
            f"weights at every step, which async_training.mode={mode} does not draw ahead; use "
            "async_training.mode=sync with it"
        )
    if mode != "fully_async":
        return
    at = cfg.async_training
    step = at.require_batches * cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    if cfg.data.train_batch_size != step:
        raise ConfigError(
            f"async_training.mode=fully_async trains async_training.require_batches x "
            f"actor_rollout_ref.actor.ppo_mini_batch_size = {at.require_batches} x "
            f"{cfg.actor_rollout_ref.actor.ppo_mini_batch_size} = {step} prompts per step, but data.train_batch_size="
            f"{cfg.data.train_batch_size}; set data.train_batch_size={step} (verl ignores it in this mode; here it "
            "must say the same)"
        )
    if at.partial_rollout and cfg.actor_rollout_ref.rollout.multi_turn.enable:
        raise ConfigError(
            "async_training.partial_rollout=true continues single responses after a push; the agent loops "
            "(actor_rollout_ref.rollout.multi_turn.enable=true) finish each trajectory with one policy: set "
            "async_training.partial_rollout=false"
        )


def _check_token_budgets(cfg: PPOConfig) -> None:
    """With dynamic batch sizes a micro-batch holds up to a token budget: one whole sequence (prompt and
    response at their limits) must fit in it, or the longest samples cannot be placed anywhere."""
    sequence = cfg.data.max_prompt_length + cfg.data.max_response_length
    actor = cfg.actor_rollout_ref.actor
    budgets = []
    if actor.use_dynamic_bsz:
        budgets.append(("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", actor.ppo_max_token_len_per_gpu))
    for key, section in (
        ("actor_rollout_ref.rollout", cfg.actor_rollout_ref.rollout),
        ("actor_rollout_ref.ref", cfg.actor_rollout_ref.ref),
    ):
        dynamic = (
            actor.use_dynamic_bsz if section.log_prob_use_dynamic_bsz is None else section.log_prob_use_dynamic_bsz
        )
        if dynamic and section.log_prob_max_token_len_per_gpu is not None:  # None: the actor's, checked above
            budgets.append((f"{key}.log_prob_max_token_len_per_gpu", section.log_prob_max_token_len_per_gpu))
    if uses_critic(cfg.algorithm.adv_estimator) and cfg.critic.use_dynamic_bsz:
        budgets.append(("critic.ppo_max_token_len_per_gpu", cfg.critic.ppo_max_token_len_per_gpu))
    for key, budget in budgets:
        if budget < sequence:
            raise ConfigError(
                f"{key}={budget} is shorter than one sequence: data.max_prompt_length + data.max_response_length = "
                f"{cfg.data.max_prompt_length} + {cfg.data.max_response_length} = {sequence} tokens, so the longest "
                f"samples fit in no micro-batch. Raise {key} to at least {sequence} (a few times that is usual), or "
                "lower the length limits"
            )


def _check_parallel_layout(cfg: PPOConfig) -> None:
    """Every role's FSDP shard size must split its ranks (its pool's processes)."""
    placement = plan_placement(cfg)
    for key, role, fsdp in (
        ("actor_rollout_ref.actor.fsdp_config.fsdp_size", "actor_rollout_ref", cfg.actor_rollout_ref.actor.fsdp_config),
        ("actor_rollout_ref.ref.fsdp_config.fsdp_size", "actor_rollout_ref", cfg.actor_rollout_ref.ref.fsdp_config),
        ("critic.fsdp_config.fsdp_size", "critic", cfg.critic.fsdp_config),
    ):
        world = placement.world(role)
        if fsdp.fsdp_size != -1 and world % fsdp.fsdp_size:
            raise ConfigError(
                f"{key}={fsdp.fsdp_size} cannot shard {world_key(placement, role)} = {world} ranks: "
                f"one model copy per {fsdp.fsdp_size} ranks needs a divisor of {world}; use one, or -1 to shard "
                "over all ranks"
            )


def _check_sequence_parallel(cfg: PPOConfig) -> None:
    """Ulysses groups must split the ranks (and each FSDP shard group); the FSDP engine is the one that has
    it; the reference shares the actor's processes, so it follows the actor's size."""
    placement = plan_placement(cfg)
    arr = cfg.actor_rollout_ref
    actor_sp = arr.actor.ulysses_sequence_parallel_size
    if arr.ref.ulysses_sequence_parallel_size not in (None, actor_sp):
        raise ConfigError(
            f"actor_rollout_ref.ref.ulysses_sequence_parallel_size={arr.ref.ulysses_sequence_parallel_size} differs "
            f"from actor_rollout_ref.actor.ulysses_sequence_parallel_size={actor_sp}: the reference runs in the "
            "actor's processes and hands out its data-parallel layout; leave the reference's unset (it follows "
            "the actor's)"
        )
    critic_model = cfg.critic.model if cfg.critic.model.path else arr.model
    # (the role's key prefix, its pool's role, its Ulysses size, the FSDP section it runs with, its model)
    roles = [
        ("actor_rollout_ref.actor", "actor_rollout_ref", actor_sp, "actor_rollout_ref.actor", arr.actor, arr.model),
        ("critic", "critic", cfg.critic.ulysses_sequence_parallel_size, "critic", cfg.critic, critic_model),
    ]
    if cfg.reward_model.enable:  # on the reference's FSDP settings (a model that never trains)
        rm = cfg.reward_model
        roles.append(
            ("reward_model", "rm", rm.ulysses_sequence_parallel_size, "actor_rollout_ref.ref", arr.ref, rm.model)
        )
    for role, pool_role, sp, fsdp_key, fsdp_section, model in roles:
        key = f"{role}.ulysses_sequence_parallel_size"
        if sp != 1 and arr.actor.strategy == "megatron":
            raise ConfigError(
                f"{key}={sp}: Ulysses sequence parallelism is a feature of the FSDP engine; with "
                "actor_rollout_ref.actor.strategy=megatron leave it at 1"
            )
        try:
            check_sequence_parallel(
                key,
                sp,
                placement.world(pool_role),
                world_key(placement, pool_role),
                f"{fsdp_key}.fsdp_config.fsdp_size",
                fsdp_section.fsdp_config.fsdp_size,
                "the model's use_remove_padding",
                model.use_remove_padding,
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def _check_mini_batches(cfg: PPOConfig) -> None:
    """A mini-batch larger than the batch (both count prompts, as in verl) cannot be formed."""
    batch = cfg.data.train_batch_size
    for key, mini in (
        ("actor_rollout_ref.actor.ppo_mini_batch_size", cfg.actor_rollout_ref.actor.ppo_mini_batch_size),
        ("critic.ppo_mini_batch_size", cfg.critic.ppo_mini_batch_size),
    ):
        if mini is not None and mini > batch:
            raise ConfigError(
                f"{key}={mini} is larger than data.train_batch_size={batch} (both count prompts); lower {key} "
                f"or raise data.train_batch_size so that each optimizer step sees a full mini-batch"
            )


def _check_group_size(cfg: PPOConfig) -> None:
    """Group-relative estimators (those that need the prompt ``index``) compare the n responses of a
    prompt: with n=1 every group has one member and the baseline is meaningless."""
    from verl.algos.advantages.registry import get_adv_estimator
    from verl.core.registry import RegistryError

    name = cfg.algorithm.adv_estimator
    n = cfg.actor_rollout_ref.rollout.n
    try:
        estimator = get_adv_estimator(name)
    except RegistryError:
        return  # reported by check_registered_names, with the registered names
    if "index" in getattr(estimator, "required_fields", ()) and n < 2:
        raise ConfigError(
            f"algorithm.adv_estimator={name} compares the responses of each prompt with each other, but "
            f"actor_rollout_ref.rollout.n={n} gives one response per prompt, so there is no group to compare "
            "with. Set actor_rollout_ref.rollout.n to 2 or more (4-16 is usual), or use an estimator without "
            "groups (gae, reinforce_plus_plus, remax)"
        )


def _check_rollout_correction(cfg: PPOConfig) -> None:
    """algorithm.rollout_correction's values, and its interplay with the loss, the rollout and the estimator."""
    from verl.algos.rollout_correction import check_rollout_correction

    try:
        check_rollout_correction(cfg)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _check_lora(cfg: PPOConfig) -> None:
    """LoRA (model.lora_rank > 0) is built in the FSDP engine; the reward model never trains."""
    strategy = cfg.actor_rollout_ref.actor.strategy
    for key, model in (("actor_rollout_ref.model", cfg.actor_rollout_ref.model), ("critic.model", cfg.critic.model)):
        if model.lora_rank and strategy not in ("fsdp", "fsdp2"):
            raise ConfigError(
                f"{key}.lora_rank={model.lora_rank} with actor_rollout_ref.actor.strategy={strategy}: LoRA runs in "
                "the FSDP engine; use strategy=fsdp2, or lora_rank=0 to train the full model"
            )
    if cfg.reward_model.model.lora_rank:
        raise ConfigError(
            f"reward_model.model.lora_rank={cfg.reward_model.model.lora_rank}: the reward model is never trained, "
            "an adapter on it would stay zero; leave it 0"
        )


def _check_agent_configs(cfg: PPOConfig) -> None:
    """The agent loops' config files (tools, interactions, loops) are read here too, so that a missing
    file, a bad entry or an unimportable class stops the run before Ray starts, not in every worker."""
    rollout = cfg.actor_rollout_ref.rollout
    if not rollout.multi_turn.enable:
        return
    from verl.algos.agent.interactions import load_interactions
    from verl.algos.agent.loop_config import load_agent_loop_config
    from verl.algos.agent.tools import load_tools

    files = (
        ("actor_rollout_ref.rollout.multi_turn.tool_config_path", rollout.multi_turn.tool_config_path, load_tools),
        (
            "actor_rollout_ref.rollout.multi_turn.interaction_config_path",
            rollout.multi_turn.interaction_config_path,
            load_interactions,
        ),
        (
            "actor_rollout_ref.rollout.agent.agent_loop_config_path",
            rollout.agent.agent_loop_config_path,
            load_agent_loop_config,
        ),
    )
    for key, path, load in files:
        if not path:
            continue
        try:
            load(path)
        except OSError as exc:
            raise ConfigError(f"{key}={path}: cannot read it ({exc.strerror or exc})") from None
        except ValueError as exc:
            raise ConfigError(f"{key}: {exc}") from None
