"""The model folders a run will load (actor, tokenizer, critic, reward model), checked before Ray starts.

Each error names the config key, the folder and the file at fault, so a missing or half-copied model
fails in a second on the driver instead of minutes later inside a worker.
"""

from __future__ import annotations

from verl.algos.config.schema import PPOConfig
from verl.core.config import ConfigError


def _checked_model(key: str, name_or_path: str) -> str:
    """The local folder of ``name_or_path`` (built-in models are converted on first use), checked."""
    from verl.engines.model_files import ModelFolderError, check_model_files
    from verl.engines.model_zoo import resolve_model_path

    try:
        path = resolve_model_path(name_or_path)
        check_model_files(path)
    except (FileNotFoundError, ModuleNotFoundError, ModelFolderError) as exc:
        raise ConfigError(f"{key}: {exc}") from None
    return path


def check_models(cfg: PPOConfig, uses_critic: bool) -> str:
    """Check every model folder the run needs; returns the actor's resolved local folder."""
    from verl.engines.model_files import ModelFolderError, check_tokenizer_files

    model = cfg.actor_rollout_ref.model
    actor_path = _checked_model("actor_rollout_ref.model.path", model.path)
    tokenizer_key = "actor_rollout_ref.model.tokenizer_path" if model.tokenizer_path else "actor_rollout_ref.model.path"
    try:
        check_tokenizer_files(
            model.tokenizer_path or actor_path,
            hint=", or set actor_rollout_ref.model.tokenizer_path to a folder that has them",
        )
    except ModelFolderError as exc:
        raise ConfigError(f"{tokenizer_key}: {exc}") from None
    if uses_critic and cfg.critic.model.path:
        _checked_model("critic.model.path", cfg.critic.model.path)
    if cfg.reward_model.enable:
        if not cfg.reward_model.model.path:
            raise ConfigError(
                "reward_model.enable=true needs reward_model.model.path (a local sequence-scoring model folder)"
            )
        _checked_model("reward_model.model.path", cfg.reward_model.model.path)
    return actor_path
