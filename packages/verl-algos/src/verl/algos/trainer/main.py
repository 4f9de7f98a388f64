"""``verl train`` and ``verl eval``: config and input checks before Ray starts, then the trainer."""

from __future__ import annotations

import logging
from pathlib import Path

from verl.algos.config import load_config
from verl.algos.config.names import check_registered_names
from verl.algos.config.schema import PPOConfig
from verl.algos.trainer import checkpoint_layout as layout
from verl.algos.trainer.run_log import log_to_run_folder
from verl.core.config import ConfigError

logger = logging.getLogger("verl.train")


def _resolve_model(cfg: PPOConfig) -> str:
    from verl.engines.model_zoo import resolve_model_path

    try:
        return resolve_model_path(cfg.actor_rollout_ref.model.path)
    except (FileNotFoundError, ModuleNotFoundError) as exc:
        raise ConfigError(f"actor_rollout_ref.model.path: {exc}") from None


def build_trainer(cfg: PPOConfig):
    """Everything that can fail on bad input happens here, before Ray starts."""
    from verl.algos.trainer.ppo_trainer import PPOTrainer

    check_registered_names(cfg)
    model_path = _resolve_model(cfg)
    trainer = PPOTrainer(cfg, model_path)
    try:
        trainer.setup_data()
    except (FileNotFoundError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    return trainer


def run(cfg: PPOConfig) -> dict[str, float]:
    """Train with ``cfg``; returns {"val_before": ..., "val_after": ...} (validation accuracy)."""
    log_to_run_folder(cfg.trainer.default_local_dir)
    trainer = build_trainer(cfg)
    before: float | None = None
    try:
        trainer.start_workers()
        trainer.start_tracking()
        trainer.resume()
        resumed_at = trainer.global_step
        if cfg.trainer.val_before_train or cfg.trainer.val_only:
            before_metrics = trainer.validate()
            trainer.tracking.log(before_metrics, trainer.global_step)
            before = before_metrics["val/acc"]
            logger.info("validation accuracy before training (step %d): %.3f", resumed_at, before)
            if cfg.trainer.val_only:
                return {"val_before": before}
        after_metrics = trainer.fit(validate_first=False)  # the before-training validation is done above
        after = after_metrics.get("val/acc")
        summary = {"val_before": before, "val_after": after, "steps": trainer.global_step}
        logger.info(
            "done: %d steps; validation accuracy %s -> %s; run folder %s",
            trainer.global_step,
            "n/a" if before is None else f"{before:.3f}",
            "n/a" if after is None else f"{after:.3f}",
            cfg.trainer.default_local_dir,
        )
        return summary
    except BaseException:
        logger.exception(
            "the run stopped on an error; the last complete checkpoint and the logs in %s are kept",
            cfg.trainer.default_local_dir,
        )
        raise
    finally:
        trainer.close()


def train(recipe: str | None, overrides: list[str]) -> int:
    cfg = load_config(recipe, overrides)
    summary = run(cfg)
    if summary.get("val_before") is not None and summary.get("val_after") is not None:
        print(f"validation accuracy: before {summary['val_before']:.3f} -> after {summary['val_after']:.3f}")
    curves = Path(cfg.trainer.default_local_dir) / "curves.png"
    if curves.exists():
        print(f"curves: {curves}")
    return 0


def evaluate(model: str, recipe: str | None, overrides: list[str]) -> int:
    """Score a model folder, a built-in model, or a ``global_step_<N>`` checkpoint on the validation set."""
    extra = ["trainer.val_only=true", "trainer.logger=[console]"]
    path = Path(model).expanduser()
    if path.is_dir() and path.name.startswith("global_step_"):
        if not layout.is_complete(path):
            raise ConfigError(f"{path} is not a complete checkpoint (interrupted while being written)")
        state = layout.read_trainer_state(path)
        extra += [f"actor_rollout_ref.model.path={state['model_path']}", f"trainer.resume_mode={path.resolve()}"]
    else:
        extra += [f"actor_rollout_ref.model.path={model}", "trainer.resume_mode=disable"]
    cfg = load_config(recipe, [*overrides, *extra])
    summary = run(cfg)
    print(f"validation accuracy: {summary['val_before']:.3f}")
    return 0
