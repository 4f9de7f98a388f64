"""Every key of verl's trainer configs means something definite here (``verl_compat.rules``): ours under
the same path, ours under another path, accepted with no effect (reported), or refused until built."""

from __future__ import annotations

import pytest

from verl.algos.cli import main as verl_main
from verl.algos.config import load_config
from verl.algos.config.schema import PPOConfig
from verl.algos.config.sft_schema import SFTConfig
from verl.algos.config.verl_compat import VerlKeys, rule_for, upstream_defaults
from verl.algos.config.verl_compat.rules import RULES, SFT_RULES, Alias, NotYet
from verl.core.config import ConfigError, schema_keys

CASES = [("ppo", PPOConfig, RULES), ("sft", SFTConfig, SFT_RULES)]


@pytest.mark.parametrize("kind, schema, rules", CASES, ids=["ppo", "sft"])
def test_every_upstream_key_is_ours_or_has_a_rule(kind, schema, rules):
    ours = set(schema_keys(schema))
    open_dicts = ("actor_rollout_ref.model.override_config",)  # a free-form mapping of ours
    left = [
        k for k in upstream_defaults(kind) if k not in ours and not k.startswith(open_dicts) and not rule_for(k, rules)
    ]
    assert left == []


@pytest.mark.parametrize("kind, schema, rules", CASES, ids=["ppo", "sft"])
def test_every_alias_points_at_a_key_of_ours(kind, schema, rules):
    ours = set(schema_keys(schema))
    assert [(p, r.target) for p, r in rules if isinstance(r, Alias) and r.target not in ours] == []


def test_an_alias_sets_our_key_with_verls_spelling_of_the_value():
    cfg = load_config(
        None,
        [
            "critic.model.fsdp_config.param_offload=true",
            "actor_rollout_ref.actor.grad_clip=0.5",
            "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=float32",
            "actor_rollout_ref.actor.optim.warmup_style=cosine",
        ],
    )
    assert cfg.critic.fsdp_config.param_offload is True
    assert cfg.actor_rollout_ref.actor.optim.clip_grad == 0.5
    assert cfg.actor_rollout_ref.actor.fsdp_config.param_dtype == "fp32"
    assert cfg.actor_rollout_ref.actor.optim.lr_scheduler_type == "cosine"


def test_a_feature_not_built_is_accepted_off_and_refused_on():
    keys = VerlKeys("ppo")
    load_config(
        None,
        ["actor_rollout_ref.model.lora_adapter_path=null", "actor_rollout_ref.rollout.data_parallel_size=1"],
        keys,
    )
    assert {k for k, _, _ in keys.no_effect} == {
        "actor_rollout_ref.model.lora_adapter_path",
        "actor_rollout_ref.rollout.data_parallel_size",
    }
    with pytest.raises(ConfigError, match="asks for starting from a trained LoRA adapter, which verl has but"):
        load_config(None, ["actor_rollout_ref.model.lora_adapter_path=/adapters/a"])
    assert isinstance(rule_for("actor_rollout_ref.actor.megatron.use_dist_checkpointing", RULES), NotYet)
    with pytest.raises(ConfigError, match="asks for loading megatron's distributed checkpoints"):
        load_config(None, ["actor_rollout_ref.actor.megatron.use_dist_checkpointing=true"])


def test_verls_megatron_keys_are_ours_or_translated():
    """The megatron sections are the engine's MegatronConfig: verl's layout keys land there as they are,
    its ``dtype`` is our ``params_dtype``, and the reference and the critic have their own sections."""
    keys = VerlKeys("ppo")
    cfg = load_config(
        None,
        [
            "actor_rollout_ref.actor.strategy=megatron",
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
            "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
            "actor_rollout_ref.actor.megatron.dtype=float32",
            "actor_rollout_ref.ref.megatron.param_offload=true",
            "critic.megatron.optimizer_offload=true",
            "actor_rollout_ref.actor.megatron.use_mbridge=true",
        ],
        keys,
    )
    assert cfg.actor_rollout_ref.actor.megatron.tensor_model_parallel_size == 2
    assert cfg.actor_rollout_ref.actor.megatron.pipeline_model_parallel_size == 2
    assert cfg.actor_rollout_ref.actor.megatron.params_dtype == "fp32"
    assert cfg.actor_rollout_ref.ref.megatron.param_offload is True
    assert cfg.critic.megatron.optimizer_offload is True
    assert [k for k, _, _ in keys.no_effect] == ["actor_rollout_ref.actor.megatron.use_mbridge"]


def test_a_key_verl_lacks_too_is_still_unknown():
    with pytest.raises(ConfigError, match="unknown config key 'actor_rollout_ref.actor.optim.lrr'"):
        load_config(None, ["actor_rollout_ref.actor.optim.lrr=1e-5"])


def test_config_show_lists_the_keys_without_effect_and_runs_the_pre_ray_checks(capsys, tmp_path):
    assert (
        verl_main(
            ["config", "show", f"trainer.default_local_dir={tmp_path}/run", "trainer.use_legacy_worker_impl=auto"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "# trainer.use_legacy_worker_impl='auto': no effect here (there is one worker implementation)" in out
    assert not (tmp_path / "run").exists()  # config show writes nothing into the run folder
    # a registered-name check that only the trainer's setup used to run
    assert verl_main(["config", "show", "actor_rollout_ref.actor.policy_loss.loss_mode=nope"]) == 2
    assert "no policy loss registered for 'nope'" in capsys.readouterr().err


def test_hydra_config_name_selects_verls_defaults_or_a_users_yaml(capsys, tmp_path):
    assert verl_main(["config", "show", "--config-name=ppo_megatron_trainer"]) == 2
    assert "select the Megatron engine with actor_rollout_ref.actor.strategy=megatron" in capsys.readouterr().err
    (tmp_path / "my_trainer.yaml").write_text(
        "hydra:\n  searchpath: [pkg://verl.trainer.config]\n"
        "defaults:\n  - ppo_trainer\n  - _self_\n"
        "data:\n  train_batch_size: 4\nactor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: 2\n"
        "trainer:\n  use_legacy_worker_impl: auto\n"
    )
    code = verl_main(
        [
            "config",
            "show",
            f"--config-path={tmp_path}",
            "--config-name=my_trainer",
            f"trainer.default_local_dir={tmp_path}/o",
        ]
    )
    assert code == 0
    assert "train_batch_size: 4" in capsys.readouterr().out


def test_ulysses_keys_are_ours_and_verls_engine_copy_is_translated():
    """verl's role keys are ours; its engine-side copies (``*.fsdp_config.ulysses_sequence_parallel_size``)
    land on the role's key; the reference follows the actor's unless set; layouts that cannot run are refused."""
    from verl.algos.config.consistency import check_consistency

    cfg = load_config(
        None,
        [
            "trainer.n_gpus_per_node=4",
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
            "critic.model.fsdp_config.ulysses_sequence_parallel_size=4",
        ],
        VerlKeys("ppo"),
    )
    assert cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size == 2
    assert cfg.actor_rollout_ref.ref.ulysses_sequence_parallel_size is None
    assert cfg.critic.ulysses_sequence_parallel_size == 4
    check_consistency(cfg)
    refused = {
        "the reference runs in the actor's processes": [
            "trainer.n_gpus_per_node=4",
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
            "actor_rollout_ref.ref.ulysses_sequence_parallel_size=4",
        ],
        "must divide trainer.nnodes x trainer.n_gpus_per_node = 2 ranks": [
            "trainer.n_gpus_per_node=2",
            "critic.ulysses_sequence_parallel_size=4",
        ],
        "reward_model.ulysses_sequence_parallel_size=4 must divide trainer.nnodes x trainer.n_gpus_per_node": [
            "trainer.n_gpus_per_node=2",
            "reward_model.enable=true",
            "reward_model.model.path=/rm",
            "reward_model.ulysses_sequence_parallel_size=4",
        ],
        "needs the model's use_remove_padding=true": [
            "trainer.n_gpus_per_node=2",
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
            "actor_rollout_ref.model.use_remove_padding=false",
        ],
        "a feature of the FSDP engine": [
            "trainer.n_gpus_per_node=2",
            "actor_rollout_ref.actor.strategy=megatron",
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
        ],
        # (a size that divides the other is taken either way: verl's fsdp_size=2 with Ulysses 4 runs)
        "ulysses_sequence_parallel_size=6 and actor_rollout_ref.actor.fsdp_config.fsdp_size=4: one must": [
            "trainer.n_gpus_per_node=12",
            "actor_rollout_ref.actor.fsdp_config.fsdp_size=4",
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=6",
        ],
    }
    for message, overrides in refused.items():
        with pytest.raises(ConfigError, match=message):
            check_consistency(load_config(None, overrides))


def test_verls_lora_keys_are_the_schemas():
    """verl's flat LoRA keys of the actor and the critic are the schema's (the FSDP engine's LoRAConfig);
    layered_summon and use_shm are accepted with no effect; verl's Megatron LoRA node is refused."""
    keys = VerlKeys("ppo")
    cfg = load_config(
        None,
        [
            "actor_rollout_ref.model.lora_rank=8",
            "actor_rollout_ref.model.lora_alpha=32",
            "actor_rollout_ref.model.target_modules=[q_proj,v_proj]",
            "actor_rollout_ref.model.exclude_modules=.*layers\\.0\\..*",
            "actor_rollout_ref.model.use_shm=true",
            "actor_rollout_ref.rollout.layered_summon=true",
            "critic.model.lora_rank=4",
        ],
        keys,
    )
    model = cfg.actor_rollout_ref.model
    assert (model.lora_rank, model.lora_alpha, model.target_modules) == (8, 32, ["q_proj", "v_proj"])
    assert model.exclude_modules == ".*layers\\.0\\..*"
    assert cfg.critic.model.lora_rank == 4 and cfg.critic.model.target_modules == "all-linear"
    assert {k for k, _, _ in keys.no_effect} == {
        "actor_rollout_ref.model.use_shm",
        "actor_rollout_ref.rollout.layered_summon",
    }
    with pytest.raises(ConfigError, match="LoRA in the Megatron engine"):
        load_config(None, ["actor_rollout_ref.model.lora.rank=8"])


def test_total_epochs_sets_the_length_as_in_verl(tmp_path):
    """The main job stops after 20 steps (our schema's default); a run that names trainer.total_epochs and not
    trainer.total_training_steps lasts its epochs (verl's default: total_training_steps null), whether the
    override or a verl-style YAML names it."""
    assert load_config(None, []).trainer.total_training_steps == 20
    assert load_config(None, ["trainer.total_epochs=3"]).trainer.total_training_steps is None
    assert load_config("dapo", ["++trainer.total_epochs=2"]).trainer.total_training_steps is None
    both = ["trainer.total_epochs=3", "trainer.total_training_steps=7"]
    assert load_config(None, both).trainer.total_training_steps == 7
    recipe = tmp_path / "run.yaml"
    recipe.write_text("trainer:\n  total_epochs: 4\n")
    cfg = load_config(str(recipe), [])
    assert (cfg.trainer.total_epochs, cfg.trainer.total_training_steps) == (4, None)
