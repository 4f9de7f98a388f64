"""The model folders a run will load (actor, tokenizer, critic, reward model), checked before Ray starts.

Each error names the config key, the folder and the file at fault, so a missing or half-copied model
fails in a second on the driver instead of minutes later inside a worker.
"""

from __future__ import annotations

from verl.algos.config.schema import PPOConfig
from verl.core.config import ConfigError


def _checked_model(
    key: str,
    name_or_path: str,
    trust_remote_code: bool = False,
    causal_lm: bool = False,
    overrides: dict | None = None,
) -> str:
    """The local folder of ``name_or_path`` (built-in models are converted on first use), checked, with
    ``overrides`` (the section's ``override_config``) naming only attributes its config has."""
    from verl.engines.model_files import ModelFolderError, check_model_files
    from verl.engines.model_zoo import resolve_model_path

    try:
        path = resolve_model_path(name_or_path)
        check_model_files(path)
    except (FileNotFoundError, ModuleNotFoundError, ModelFolderError) as exc:
        raise ConfigError(f"{key}: {exc}") from None
    check_model_type(key, path, trust_remote_code, causal_lm)
    if overrides:
        from verl.engines.models import load_config

        try:
            load_config(path, trust_remote_code=trust_remote_code, overrides=dict(overrides))
        except ValueError as exc:  # "model.override_config.<attr>: why"
            section = key.rsplit(".", 1)[0]
            raise ConfigError(f"{section}.override_config{str(exc).split('override_config', 1)[-1]}") from None
    return path


def check_model_type(key: str, folder: str, trust_remote_code: bool = False, causal_lm: bool = False) -> None:
    """config.json's ``model_type`` is one this transformers knows (and, with ``causal_lm``, one it has a
    causal language model for); a folder that ships its own code (``auto_map``) needs trust_remote_code."""
    import difflib
    import json
    from pathlib import Path

    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = json.loads((Path(folder) / "config.json").read_text())
    model_type = config.get("model_type")
    trust_key = key.rsplit(".", 1)[0] + ".trust_remote_code"
    if config.get("auto_map"):
        if not trust_remote_code:
            raise ConfigError(
                f"{key}: {folder}/config.json declares its own model code (auto_map); verl runs it only when "
                f"told to: set {trust_key}=true if you trust that code"
            )
        return
    if not isinstance(model_type, str) or not model_type:
        raise ConfigError(
            f"{key}: {folder}/config.json has no model_type, so transformers cannot tell which model it is; "
            "give the folder that save_pretrained wrote"
        )
    known = CONFIG_MAPPING_NAMES if not causal_lm else MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    if model_type not in known:
        nearest = difflib.get_close_matches(model_type, list(known), n=3, cutoff=0.6)
        what = "a model type" if model_type not in CONFIG_MAPPING_NAMES else "a causal language model type"
        hint = f" (nearest: {', '.join(nearest)})" if nearest else ""
        raise ConfigError(
            f"{key}: {folder}/config.json has model_type {model_type!r}, which is not {what} that transformers "
            f"{transformers.__version__} knows{hint}; fix model_type, upgrade transformers, or set {trust_key}=true "
            "for a folder that ships its own code"
        )


def check_models(cfg: PPOConfig, uses_critic: bool) -> str:
    """Check every model folder the run needs; returns the actor's resolved local folder."""
    from verl.engines.model_files import ModelFolderError, check_tokenizer_files

    model = cfg.actor_rollout_ref.model
    actor_path = _checked_model(
        "actor_rollout_ref.model.path", model.path, model.trust_remote_code, True, model.override_config
    )
    tokenizer_key = "actor_rollout_ref.model.tokenizer_path" if model.tokenizer_path else "actor_rollout_ref.model.path"
    try:
        check_tokenizer_files(
            model.tokenizer_path or actor_path,
            hint=", or set actor_rollout_ref.model.tokenizer_path to a folder that has them",
        )
    except ModelFolderError as exc:
        raise ConfigError(f"{tokenizer_key}: {exc}") from None
    if uses_critic and cfg.critic.model.path:
        critic = cfg.critic.model
        _checked_model("critic.model.path", critic.path, critic.trust_remote_code, overrides=critic.override_config)
    if cfg.reward_model.enable:
        if not cfg.reward_model.model.path:
            raise ConfigError(
                "reward_model.enable=true needs reward_model.model.path (a local sequence-scoring model folder)"
            )
        _checked_model("reward_model.model.path", cfg.reward_model.model.path, cfg.reward_model.model.trust_remote_code)
    return actor_path


def check_sft_models(cfg) -> str:
    """``verl sft``'s model and tokenizer folders (``model.path``, ``model.tokenizer_path``), checked as
    ``verl train`` checks the actor's; returns the model's resolved local folder."""
    from verl.engines.model_files import ModelFolderError, check_tokenizer_files

    model = cfg.model
    path = _checked_model("model.path", model.path, model.trust_remote_code, True, model.override_config)
    tokenizer_key = "model.tokenizer_path" if model.tokenizer_path else "model.path"
    try:
        check_tokenizer_files(
            model.tokenizer_path or path, hint=", or set model.tokenizer_path to a folder that has them"
        )
    except ModelFolderError as exc:
        raise ConfigError(f"{tokenizer_key}: {exc}") from None
    return path
