from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from verl.core.checks import check_literals
from verl.core.config import ConfigError, as_node, build_config, parse_override, schema_keys, to_yaml


@dataclass
class OptimConfig:
    lr: float = 1e-6
    warmup_steps: int = 0


@dataclass
class ActorConfig:
    optim: OptimConfig = field(default_factory=OptimConfig)
    ppo_mini_batch_size: int = 16
    loss_agg_mode: str = "token-mean"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.loss_agg_mode not in ("token-mean", "seq-mean-token-sum"):
            raise ValueError(f"loss_agg_mode={self.loss_agg_mode!r} is not one of token-mean, seq-mean-token-sum")


@dataclass
class TrainerConfig:
    total_epochs: int = 1
    resume_mode: Literal["auto", "disable"] = "auto"
    logger: list[str] = field(default_factory=lambda: ["console"])
    ray_address: str | None = None


@dataclass
class RunConfig:
    actor: ActorConfig = field(default_factory=ActorConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


def test_parse_override_reads_yaml_values():
    assert parse_override("a.b=3") == ("a.b", 3)
    assert parse_override("a.b=1e-5") == ("a.b", 1e-5)
    assert parse_override("a=[console,file]") == ("a", ["console", "file"])
    assert parse_override("a=false") == ("a", False)
    assert parse_override("a=hello world") == ("a", "hello world")
    with pytest.raises(ConfigError, match="key.path=value"):
        parse_override("nonsense")


def test_defaults_sources_then_overrides():
    cfg = build_config(
        RunConfig,
        sources=[("recipe.yaml", {"actor": {"optim": {"lr": 2e-5}}, "trainer": {"total_epochs": 3}})],
        overrides=["trainer.total_epochs=5", "trainer.logger=[console,file]", "actor.extra.foo=1"],
    )
    assert isinstance(cfg, RunConfig)
    assert cfg.actor.optim.lr == 2e-5
    assert cfg.trainer.total_epochs == 5
    assert cfg.trainer.logger == ["console", "file"]
    assert cfg.actor.extra == {"foo": 1}
    assert cfg.trainer.ray_address is None
    assert "lr: 2.0e-05" in to_yaml(cfg)


def test_unknown_key_names_the_nearest():
    with pytest.raises(ConfigError) as exc:
        build_config(RunConfig, overrides=["actor.optim.lrr=1"])
    assert "unknown config key 'actor.optim.lrr'" in str(exc.value)
    assert "actor.optim.lr" in str(exc.value)
    with pytest.raises(ConfigError, match="trainer.total_epochs"):
        build_config(RunConfig, sources=[("r.yaml", {"total_epochs": 1})])


def test_wrong_type_names_key_and_expected_type():
    with pytest.raises(ConfigError) as exc:
        build_config(RunConfig, overrides=["actor.ppo_mini_batch_size=lots"])
    assert "'actor.ppo_mini_batch_size'" in str(exc.value) and "expected int" in str(exc.value)


def test_a_choice_outside_a_literal_names_the_key_and_the_choices():
    assert build_config(RunConfig, overrides=["trainer.resume_mode=disable"]).trainer.resume_mode == "disable"
    with pytest.raises(ConfigError) as exc:
        build_config(RunConfig, overrides=["trainer.resume_mode=sometimes"])
    assert "'trainer.resume_mode'" in str(exc.value) and "'sometimes'; expected one of: auto, disable" in str(exc.value)


def test_post_init_validation_is_a_config_error():
    with pytest.raises(ConfigError, match="^actor.loss_agg_mode=.median."):
        build_config(RunConfig, overrides=["actor.loss_agg_mode=median"])


def test_schema_keys_lists_nested_paths():
    keys = schema_keys(RunConfig)
    assert "actor.optim.lr" in keys and "trainer.logger" in keys and "actor" in keys


# -- verl's and Hydra's habits --------------------------------------------------------------------------------
def test_a_single_value_where_a_list_is_expected_is_a_list_of_one():
    cfg = build_config(RunConfig, overrides=["trainer.logger=wandb"])
    assert cfg.trainer.logger == ["wandb"]


def test_hydra_prefixes_set_and_tilde_restores_the_default():
    cfg = build_config(
        RunConfig, overrides=["+trainer.total_epochs=3", "++actor.ppo_mini_batch_size=4", "~actor.ppo_mini_batch_size"]
    )
    assert cfg.trainer.total_epochs == 3
    assert cfg.actor.ppo_mini_batch_size == 16


def test_null_and_env_interpolations(monkeypatch):
    monkeypatch.setenv("VERL_TEST_LR", "3e-6")
    cfg = build_config(
        RunConfig,
        overrides=["trainer.ray_address=null", "actor.optim.lr=${oc.env:VERL_TEST_LR}", "trainer.logger=${oc.env:X,a}"],
    )
    assert cfg.trainer.ray_address is None
    assert cfg.actor.optim.lr == 3e-6
    assert cfg.trainer.logger == ["a"]


class Renames:
    """A ForeignKeys that knows one other project's name for a key and one key it accepts and ignores."""

    def __init__(self):
        self.ignored = []

    def translate(self, key, value, source):
        if key == "actor.optim.clip_grad":
            return "trainer.total_epochs", int(value)
        if key == "actor.use_torch_compile":
            self.ignored.append(key)
            return None
        raise KeyError(key)


def test_foreign_keys_are_translated_ignored_or_refused():
    foreign = Renames()
    cfg = build_config(
        RunConfig, overrides=["actor.optim.clip_grad=5", "actor.use_torch_compile=true"], foreign=foreign
    )
    assert cfg.trainer.total_epochs == 5
    assert foreign.ignored == ["actor.use_torch_compile"]
    with pytest.raises(ConfigError, match="unknown config key 'actor.nope'"):
        build_config(RunConfig, overrides=["actor.nope=1"], foreign=foreign)


# ------------------------------------------------------------------ nodes built by the code that owns them


@dataclass
class _Correction:
    level: Literal["token", "sequence"] | None = None
    threshold: float = 2.0

    def __post_init__(self) -> None:
        check_literals(self)


def test_check_literals_takes_an_optional_literal():
    assert _Correction().level is None and _Correction(level="token").level == "token"
    with pytest.raises(ValueError, match="level='seq' is not valid; choose one of: token, sequence"):
        _Correction(level="seq")


def test_as_node_keeps_instances_builds_mappings_strictly_and_names_unknown_keys():
    node = _Correction(threshold=3.0)
    assert as_node(_Correction, node, "x") is node
    assert as_node(_Correction, None, "x") == _Correction()
    assert as_node(_Correction, {"threshold": 5.0}, "x").threshold == 5.0
    with pytest.raises(ConfigError, match=r"algorithm.rc has no key\(s\) \['treshold'\]"):
        as_node(_Correction, {"treshold": 5.0}, "algorithm.rc")
    with pytest.raises(TypeError, match="must be a _Correction"):
        as_node(_Correction, 3, "algorithm.rc")
