"""Run configuration: the schema, the named recipes, and loading with command-line overrides."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from verl.algos.config.schema import PPOConfig
from verl.core.config import ConfigError, build_config, load_yaml

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


def load_config(recipe: str | None = None, overrides: Iterable[str] = ()) -> PPOConfig:
    """The schema defaults, then the recipe (default grpo), then ``key=value`` overrides."""
    path = recipe_path(recipe or "grpo")
    return build_config(PPOConfig, sources=[(str(path), load_yaml(path))], overrides=list(overrides))


__all__ = ["ConfigError", "PPOConfig", "load_config", "recipe_names", "recipe_path"]
