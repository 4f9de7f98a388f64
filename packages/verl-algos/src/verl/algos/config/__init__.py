"""Run configuration: the schema, the named recipes, and loading with command-line overrides."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from verl.algos.config.schema import PPOConfig
from verl.algos.config.verl_compat import VerlKeys
from verl.core.config import ConfigError, build_config, load_yaml, parse_override

RECIPE_DIR = Path(__file__).parent / "recipes"


def recipe_names() -> list[str]:
    return sorted(p.stem for p in RECIPE_DIR.glob("*.yaml"))


def recipe_path(name_or_path: str) -> Path:
    """A recipe by name (``grpo``, ``dapo``, ...) or a path to a YAML file."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml"):
        if not candidate.is_file():
            raise ConfigError(f"recipe file {name_or_path!r} does not exist")
        return candidate
    path = RECIPE_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ConfigError(
            f"unknown recipe {name_or_path!r}; built-in recipes: {', '.join(recipe_names())}, or give a YAML path"
        )
    return path


def load_config(
    recipe: str | None = None, overrides: Iterable[str] = (), verl_keys: VerlKeys | None = None
) -> PPOConfig:
    """The schema defaults, then the recipe (default grpo), then ``key=value`` overrides.

    verl's keys that our schema holds elsewhere or not at all go through ``verl_keys`` (see
    ``verl_compat``); without one, the keys accepted with no effect are logged here."""
    path = recipe_path(recipe or "grpo")
    keys = verl_keys if verl_keys is not None else VerlKeys("ppo")
    source = recipe_source(path)
    overrides = [*_length_from_epochs(source, overrides), *overrides]
    cfg = build_config(PPOConfig, sources=[(str(path), source)], overrides=overrides, foreign=keys)
    if verl_keys is None:
        keys.log()
    return cfg


def _length_from_epochs(source: dict, overrides: Iterable[str]) -> list[str]:
    """Our schema caps a run at ``trainer.total_training_steps=20`` (the main job's length); in verl a run lasts
    ``trainer.total_epochs`` unless ``total_training_steps`` is given. A run that names ``total_epochs`` (in its
    recipe or its overrides) and not ``total_training_steps`` lasts its epochs, as in verl."""
    trainer = source.get("trainer") or {}
    named = {parse_override(text)[0] for text in overrides}
    named |= {f"trainer.{key}" for key in trainer}
    named |= {key for key in source if key.startswith("trainer.")}  # a recipe's dotted keys
    if "trainer.total_epochs" in named and "trainer.total_training_steps" not in named:
        return ["trainer.total_training_steps=null"]
    return []


def hydra_recipe(recipe: str | None, config_path: str | None, config_name: str | None) -> str | None:
    """The recipe that verl's ``--config-path/--config-name`` select (``-r`` wins if both are given).

    ``ppo_trainer`` (verl's default) is our default recipe; ``ppo_megatron_trainer`` is refused with how to
    select the Megatron engine instead (``strategy=megatron``); any other name is a YAML file in ``config_path``."""
    if config_name is None or recipe is not None:
        if config_path is not None and config_name is None:
            raise ConfigError("--config-path needs --config-name (the YAML file in that folder to start from)")
        return recipe
    name = config_name.removesuffix(".yaml").removesuffix(".yml")
    candidate = Path(config_path or ".").expanduser() / f"{name}.yaml"
    if config_path is not None and candidate.is_file():
        return str(candidate)
    if name == "ppo_trainer":
        return None
    if name == "ppo_megatron_trainer":
        raise ConfigError(
            "--config-name=ppo_megatron_trainer (verl's Megatron trainer config) is not read here yet; drop "
            "--config-path/--config-name and select the Megatron engine with actor_rollout_ref.actor.strategy=megatron "
            "(its layout under actor_rollout_ref.actor.megatron.*, verl's keys)"
        )
    raise ConfigError(
        f"--config-name={config_name}: no {candidate} and not one of verl's trainer configs (ppo_trainer, "
        "ppo_megatron_trainer); give --config-path the folder that holds it, or use -r RECIPE"
    )


def recipe_source(path: Path) -> dict:
    """A recipe's keys. A verl-style YAML (``--config-path/--config-name``) may carry Hydra's ``defaults``
    list and ``hydra`` section: composition and Hydra's own settings, not settings of the run."""
    data = load_yaml(path)
    defaults = data.pop("defaults", None) or []
    data.pop("hydra", None)
    for entry in defaults:
        name = entry if isinstance(entry, str) else next(iter(entry.values()), "") if isinstance(entry, dict) else ""
        if "megatron" in str(name):
            raise ConfigError(
                f"{path} builds on verl's {name}, which is not read here yet; base the recipe on ppo_trainer "
                "and set actor_rollout_ref.actor.strategy: megatron (and its actor_rollout_ref.actor.megatron section)"
            )
    return data


__all__ = ["ConfigError", "PPOConfig", "hydra_recipe", "load_config", "recipe_names", "recipe_path"]
