"""``verl train`` and ``verl eval``: config and input checks before Ray starts, then the trainer."""

from __future__ import annotations

import copy
import logging
import tempfile
from pathlib import Path

from verl.algos.config import load_config
from verl.algos.config.consistency import check_consistency
from verl.algos.config.names import check_registered_names
from verl.algos.config.schema import PPOConfig
from verl.algos.config.verl_compat import VerlKeys
from verl.algos.rewards.scoring import RewardSetupError
from verl.algos.run import checkpoint_layout as layout
from verl.algos.run import folder_lock as run_folder_lock
from verl.algos.run.log import log_to_run_folder, note_failure
from verl.algos.run.start import RunStart, plan_start
from verl.algos.trainer.model_checks import check_models
from verl.algos.trainer.preflight import check_loggers, check_run_folder
from verl.core.config import ConfigError, to_yaml
from verl.core.controller import WorkerDiedError, WorkerTimeoutError

logger = logging.getLogger("verl.train")


def build_trainer(cfg: PPOConfig, data_cache: str | None = None, start: RunStart | None = None):
    """Everything that can fail on bad input happens here, before Ray starts (``data_cache``: where
    built-in tasks are generated; default the run folder; ``start``: where the run starts, when the caller
    has planned it already)."""
    from verl.algos.advantages.registry import uses_critic
    from verl.algos.trainer.ppo_trainer import PPOTrainer

    check_registered_names(cfg)
    check_consistency(cfg)
    check_loggers(cfg.trainer.logger)
    check_run_folder(cfg.trainer.default_local_dir)
    model_path = check_models(cfg, uses_critic=uses_critic(cfg.algorithm.adv_estimator))
    if start is None:
        plan_start(cfg.trainer, writes_checkpoints=not cfg.trainer.val_only)
    trainer_class = PPOTrainer
    if cfg.async_training.mode == "one_step_off":
        from verl.algos.async_training.one_step_off import OneStepOffTrainer

        trainer_class = OneStepOffTrainer
    elif cfg.async_training.mode == "fully_async":
        from verl.algos.async_training.fully_async import FullyAsyncTrainer

        trainer_class = FullyAsyncTrainer
    trainer = trainer_class(cfg, model_path)
    try:
        trainer.setup_data(data_cache)
    except (FileNotFoundError, ValueError, RewardSetupError) as exc:  # bad data, tokenizer or reward function
        raise ConfigError(str(exc)) from None
    return trainer


def run(cfg: PPOConfig) -> dict[str, float]:
    """Train with ``cfg``; returns {"val_before": ..., "val_after": ..., "steps": ..., "restarts": ...}.

    The run folder is locked first (a second run on it is refused, naming this one); then where the run
    starts is decided (refusing to write over another run's checkpoints) before anything is written.

    On a worker fault (a worker process died or hung) the workers are torn down, new ones started and the
    run resumed from the last complete checkpoint, up to ``trainer.max_restarts`` times. Past that, or on
    any other error, the run stops with the error; the last complete checkpoint and the logs are kept."""
    with run_folder_lock.acquire(cfg.trainer.default_local_dir) as lock:
        start = plan_start(cfg.trainer, writes_checkpoints=not cfg.trainer.val_only)
        start.apply(lock)
        log = log_to_run_folder(cfg.trainer.default_local_dir)
        try:
            return _run(cfg, start)
        except BaseException as exc:
            note_failure(log, exc, what_is_kept(cfg.trainer.default_local_dir))
            raise


def _run(cfg: PPOConfig, start: RunStart) -> dict[str, float]:
    trainer = build_trainer(cfg, start=start)
    before: float | None = None
    restarts = 0
    resume_point = None  # the newest complete checkpoint written by this run, across restarts
    try:
        while True:
            try:
                trainer.start_workers()
                if trainer.tracking is None:  # a restarted trainer keeps the run's tracking
                    trainer.start_tracking()
                trainer.resume()
                resumed_at = trainer.global_step
                if cfg.trainer.val_only or (cfg.trainer.val_before_train and restarts == 0):
                    before_metrics = trainer.validate()
                    trainer.tracking.log(before_metrics, trainer.global_step)
                    before = before_metrics["val/acc"]
                    logger.info("validation accuracy before training (step %d): %.3f", resumed_at, before)
                    if cfg.trainer.val_only:
                        return {"val_before": before}
                after_metrics = trainer.fit()  # after the before-training validation above
                break
            except WORKER_FAULTS as fault:
                if restarts >= cfg.trainer.max_restarts:
                    fault.add_note(
                        f"the run restarted {restarts} time(s) after worker faults (trainer.max_restarts="
                        f"{cfg.trainer.max_restarts}); raise trainer.max_restarts to restart automatically"
                    )
                    raise
                restarts += 1
                resume_point = trainer.last_checkpoint or resume_point
                trainer = _restart(trainer, cfg, fault, restarts, resume_point)
        after = after_metrics.get("val/acc")
        summary = {"val_before": before, "val_after": after, "steps": trainer.global_step, "restarts": restarts}
        logger.info(
            "done: %d steps; validation accuracy %s -> %s; run folder %s",
            trainer.global_step,
            "n/a" if before is None else f"{before:.3f}",
            "n/a" if after is None else f"{after:.3f}",
            cfg.trainer.default_local_dir,
        )
        return summary
    finally:
        trainer.close()


#: Faults of the worker processes themselves (not of the config, the data or the numbers), which fresh
#: processes may not repeat: what ``trainer.max_restarts`` restarts.
WORKER_FAULTS = (WorkerDiedError, WorkerTimeoutError)


def _restart(old, cfg: PPOConfig, fault: BaseException, restarts: int, resume_from: Path | None):
    """A new trainer, with new workers, that resumes from ``resume_from`` (the newest complete checkpoint
    this run wrote; None: start as the run did); ``old``'s workers and placement groups are freed."""
    logger.error("worker fault: %s", fault)
    logger.warning(
        "restart %d of %d (trainer.max_restarts): stopping the workers, starting new ones, resuming from %s",
        restarts,
        cfg.trainer.max_restarts,
        resume_from or "where the run started",
    )
    old.stop_workers()
    restart_cfg = cfg
    if resume_from is not None:
        restart_cfg = copy.deepcopy(cfg)
        restart_cfg.trainer.resume_mode = str(Path(resume_from).resolve())
        restart_cfg.trainer.resume_from_path = None
    new = build_trainer(restart_cfg)
    new.tracking, old.tracking = old.tracking, None  # one tracking run (one wandb run, one metrics file)
    return new


def what_is_kept(local_dir: str) -> str:
    latest = layout.latest_complete(local_dir)
    log = Path(local_dir) / "train.log"
    if latest is None:
        return f"no complete checkpoint was written; the log is {log}"
    return (
        f"the last complete checkpoint is {latest} and the log is {log}; a run with the same "
        "trainer.default_local_dir resumes from it (trainer.resume_mode=auto, the default)"
    )


def show_config(recipe: str | None, overrides: list[str]) -> int:
    """``verl config show``: the resolved config after every check ``verl train`` runs before Ray starts
    (registered names, cross-section rules, the model folders, the data and the reward function), and the
    verl keys accepted with no effect here."""
    verl_keys = VerlKeys("ppo")
    cfg = load_config(recipe, overrides, verl_keys)
    with tempfile.TemporaryDirectory(prefix="verl-config-show-") as scratch:  # writes nothing to the run folder
        build_trainer(cfg, data_cache=scratch)
    print(to_yaml(cfg), end="")
    for line in verl_keys.report():
        print(f"# {line}")
    return 0


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
        layout.verify_checkpoint(path)  # before its trainer state names the model to build
        state = layout.read_trainer_state(path)
        extra += [f"actor_rollout_ref.model.path={state['model_path']}", f"trainer.resume_mode={path.resolve()}"]
    else:
        extra += [f"actor_rollout_ref.model.path={model}", "trainer.resume_mode=disable"]
    cfg = load_config(recipe, [*overrides, *extra])
    summary = run(cfg)
    print(f"validation accuracy: {summary['val_before']:.3f}")
    return 0
