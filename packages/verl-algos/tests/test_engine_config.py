"""How a worker builds an engine's config from the run config: strictly for training engines, and for
rollout engines with a warning that names another engine's settings instead of dropping them silently."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from verl.algos.config.schema import RolloutConfig
from verl.algos.workers.engine_config import engine_config, rollout_engine_values
from verl.engines.fsdp.config import FSDPEngineConfig
from verl.engines.rollout.hf.config import HFRolloutConfig


def test_engine_config_refuses_a_key_the_engine_does_not_declare():
    with pytest.raises(ValueError, match="takes no tensor_model_parallel_size"):
        engine_config(FSDPEngineConfig, {"model_path": "m", "tensor_model_parallel_size": 2})
    assert engine_config(FSDPEngineConfig, {"model_path": "m"}).model_path == "m"


def test_rollout_engine_values_names_settings_the_engine_does_not_read(caplog):
    section = RolloutConfig(max_num_seqs=128, gpu_memory_utilization=0.7)
    values = {"model_path": "m", "micro_batch_size": 4, "max_num_seqs": 128, "gpu_memory_utilization": 0.7}
    values["enable_prefix_caching"] = section.enable_prefix_caching  # at its default: not worth a warning
    with caplog.at_level(logging.WARNING):
        config = rollout_engine_values(HFRolloutConfig, values, section, "hf")
    assert isinstance(config, HFRolloutConfig) and config.micro_batch_size == 4
    (record,) = [r for r in caplog.records if "does not read" in r.getMessage()]
    message = record.getMessage()
    assert "actor_rollout_ref.rollout.gpu_memory_utilization=0.7" in message
    assert "actor_rollout_ref.rollout.max_num_seqs=128" in message
    assert "enable_prefix_caching" not in message


def test_rollout_engine_values_is_quiet_when_nothing_is_lost(caplog):
    with caplog.at_level(logging.WARNING):
        rollout_engine_values(HFRolloutConfig, {"model_path": "m", "max_num_seqs": 256}, RolloutConfig(), "hf")
    assert not [r for r in caplog.records if "does not read" in r.getMessage()]


# -- training engines: the workers' values for whichever engine the strategy selects -------------------
def _config(*overrides: str):
    from verl.algos.config import load_config

    return load_config(None, list(overrides))


def _unread(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "training engine does not take" in r.getMessage()]


def test_the_megatron_engine_gets_its_section_and_names_the_fsdp_settings_it_does_not_take(caplog):
    from verl.algos.workers.actor_rollout_ref import ActorRolloutRefWorker
    from verl.algos.workers.engine_config import training_engine_config
    from verl.engines.megatron.config import MegatronConfig, MegatronEngineConfig

    cfg = _config(
        "actor_rollout_ref.actor.strategy=megatron",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
        "actor_rollout_ref.actor.megatron.param_offload=true",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=5",
        "actor_rollout_ref.actor.fsdp_config.param_offload=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096",
        "actor_rollout_ref.model.enable_gradient_checkpointing=true",
    )
    values = ActorRolloutRefWorker(cfg)._actor_values("/models/m")
    with caplog.at_level(logging.WARNING):
        config = training_engine_config(MegatronEngineConfig, values, "megatron")
    assert isinstance(config, MegatronEngineConfig)
    assert isinstance(config.megatron, MegatronConfig) and config.megatron is cfg.actor_rollout_ref.actor.megatron
    assert (config.megatron.tensor_model_parallel_size, config.megatron.param_offload) == (2, True)
    assert (config.ppo_micro_batch_size_per_gpu, config.log_prob_micro_batch_size_per_gpu) == (3, 5)
    assert config.optim is cfg.actor_rollout_ref.actor.optim
    (message,) = _unread(caplog)
    assert "the megatron training engine does not take these" in message
    for setting in (
        "actor_rollout_ref.actor.fsdp_config.param_offload=True",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    ):
        assert setting in message
    # token-budget micro-batching (on by default) is the megatron engine's too
    assert (config.use_dynamic_bsz, config.ppo_max_token_len_per_gpu) == (True, 4096)
    assert "use_dynamic_bsz" not in message and "ppo_max_token_len_per_gpu" not in message
    # at their defaults (the rest of fsdp_config, share_prompts, ...): not named
    assert "reshard_after_forward" not in message and "share_prompts" not in message
    caplog.clear()
    fixed = _config("actor_rollout_ref.actor.strategy=megatron", "actor_rollout_ref.actor.use_dynamic_bsz=false")
    with caplog.at_level(logging.WARNING):
        training_engine_config(MegatronEngineConfig, ActorRolloutRefWorker(fixed)._actor_values("m"), "megatron")
    assert _unread(caplog) == []  # fixed micro-batches: nothing is lost either


def test_the_fsdp_engine_names_a_megatron_section_it_does_not_take_and_is_quiet_at_defaults(caplog):
    from verl.algos.workers.actor_rollout_ref import ActorRolloutRefWorker
    from verl.algos.workers.engine_config import training_engine_config

    with caplog.at_level(logging.WARNING):
        config = training_engine_config(FSDPEngineConfig, ActorRolloutRefWorker(_config())._actor_values("m"), "fsdp2")
    assert _unread(caplog) == [] and config.use_dynamic_bsz is True
    cfg = _config("actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2")
    with caplog.at_level(logging.WARNING):
        training_engine_config(FSDPEngineConfig, ActorRolloutRefWorker(cfg)._actor_values("m"), "fsdp2")
    (message,) = _unread(caplog)
    assert "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2: the fsdp2 training engine" in message


def test_engine_config_stays_strict_and_an_engine_without_the_roles_needs_is_refused():
    from verl.algos.workers.engine_config import training_engine_config
    from verl.engines.megatron.config import MegatronEngineConfig

    with pytest.raises(ValueError, match="takes no share_prompts"):
        engine_config(MegatronEngineConfig, {"model_path": "m", "share_prompts": True})

    @dataclasses.dataclass
    class NoOptimizer:
        model_path: str = ""
        ppo_micro_batch_size_per_gpu: int = 1

    with pytest.raises(ValueError, match="takes no optim: the PPO workers cannot drive it"):
        training_engine_config(NoOptimizer, {"model_path": "m"}, "plugin")


def test_the_reference_and_the_critic_follow_the_actors_megatron_layout():
    from verl.algos.workers.engine_config import megatron_setting

    cfg = _config(
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
        "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
        "actor_rollout_ref.ref.megatron.param_offload=true",
        "critic.megatron.pipeline_model_parallel_size=2",  # the actor's: fine
    )
    ref = megatron_setting(cfg, "actor_rollout_ref.ref.megatron")
    assert (ref.value.tensor_model_parallel_size, ref.value.pipeline_model_parallel_size) == (2, 2)
    assert ref.value.param_offload is True
    assert ref.default.tensor_model_parallel_size == 2  # only what the user changed is named
    critic = megatron_setting(cfg, "critic.megatron").value
    assert (critic.tensor_model_parallel_size, critic.pipeline_model_parallel_size) == (2, 2)
    with pytest.raises(ValueError, match="critic.megatron.tensor_model_parallel_size=4: the roles share processes"):
        megatron_setting(_config("critic.megatron.tensor_model_parallel_size=4"), "critic.megatron")


def test_the_pre_ray_check_passes_megatron_and_refuses_what_the_workers_cannot_drive():
    from verl.algos.config.names import _check_workers_drive, check_registered_names
    from verl.core.config import ConfigError
    from verl.engines.fsdp.engine import FSDPEngine

    megatron = ["actor_rollout_ref.actor.strategy=megatron", "trainer.n_gpus_per_node=2"]
    check_registered_names(_config(*megatron, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"))
    check_registered_names(_config())
    with pytest.raises(ConfigError, match="does not divide trainer.nnodes x trainer.n_gpus_per_node = 2 ranks"):
        check_registered_names(_config(*megatron, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4"))
    with pytest.raises(ConfigError, match="ref.megatron.pipeline_model_parallel_size=2: the roles share"):
        check_registered_names(_config(*megatron, "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=2"))

    @dataclasses.dataclass
    class WithoutMicroBatches:
        model_path: str = ""
        optim: object = None

    class PluginEngine(FSDPEngine):  # an engine registered by a plugin whose config lacks what roles need
        config_class = WithoutMicroBatches

    with pytest.raises(ConfigError, match="takes none of ppo_micro_batch_size_per_gpu, which every role needs"):
        _check_workers_drive(_config(), PluginEngine)


def test_the_pre_ray_check_selects_veomni_for_every_role():
    """strategy=veomni takes the FSDP engine's role settings: GRPO, a critic and a reward model pass."""
    from verl.algos.config.names import check_registered_names
    from verl.algos.workers.engine_config import missing_required
    from verl.core.engine import LANGUAGE_MODEL, VALUE_MODEL, EngineRegistry
    from verl.engines.veomni import VeOmniEngine, VeOmniValueEngine

    assert EngineRegistry.get(LANGUAGE_MODEL, "veomni") is VeOmniEngine
    assert EngineRegistry.get(VALUE_MODEL, "veomni") is VeOmniValueEngine
    assert missing_required(VeOmniEngine.config_class) == []
    veomni = ["actor_rollout_ref.actor.strategy=veomni", "trainer.n_gpus_per_node=2"]
    check_registered_names(_config(*veomni))
    check_registered_names(_config(*veomni, "algorithm.adv_estimator=gae"))


def test_the_critic_takes_its_own_lora_keys_also_from_the_actors_model_folder():
    """verl's critic.model.lora_* are the critic's: an actor with LoRA leaves a critic that borrows the actor's
    model folder (no critic.model.path) a full fine-tuning critic, and critic.model.lora_rank alone gives it one."""
    from verl.algos.config import load_config
    from verl.algos.workers.critic import CriticWorker
    from verl.engines.fsdp.engine import FSDPValueEngine

    def critic_lora(*overrides: str):
        worker = CriticWorker(load_config("ppo", list(overrides)))
        setting = worker.engine_values("/model", FSDPValueEngine)["lora"]
        return setting.key, setting.value.lora_rank

    assert critic_lora("actor_rollout_ref.model.lora_rank=8") == ("critic.model", 0)
    assert critic_lora("critic.model.lora_rank=4") == ("critic.model", 4)
    assert critic_lora("critic.model.path=/elsewhere", "critic.model.lora_rank=4", "critic.model.lora_alpha=8") == (
        "critic.model",
        4,
    )
