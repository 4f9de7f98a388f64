from dataclasses import dataclass, field
from typing import Any

import pytest

from verl.core.config import ConfigError, build_config, parse_override, schema_keys, to_yaml


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


def test_post_init_validation_is_a_config_error():
    with pytest.raises(ConfigError, match="^actor.loss_agg_mode=.median."):
        build_config(RunConfig, overrides=["actor.loss_agg_mode=median"])


def test_schema_keys_lists_nested_paths():
    keys = schema_keys(RunConfig)
    assert "actor.optim.lr" in keys and "trainer.logger" in keys and "actor" in keys
