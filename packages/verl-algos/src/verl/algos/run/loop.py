"""What every trainer shares, so a trainer only says what one step is: the step cadence with validation and
checkpoints, resume, the metrics of the ranks reduced to one record, tracking, and closing down.

A trainer subclasses :class:`RunLoop` and provides ``train_step`` (one step's metrics), ``validate`` and
``checkpoint_roles`` (the worker groups a checkpoint holds, by subfolder); ``extra_state`` /
``load_extra_state`` add its own values to ``trainer_state.json``. It sets, before ``fit``: ``config``
(with a ``trainer`` section), ``local_dir``, ``model_path``, ``total_steps``, ``batch_order`` and
``tracking``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from verl.algos.run import checkpoint_layout as layout
from verl.algos.run.timing import timer
from verl.algos.tracking import RunInfo, Tracking, plot_curves
from verl.core.config import to_dict
from verl.core.controller import ResourcePool, init_ray
from verl.core.platform import get_platform
from verl.engines.optim_config import OptimConfig

logger = logging.getLogger("verl.train")


def local_cpu_slots(platform: Any, ray_address: str | None, processes: int) -> int | None:
    """Logical CPUs for a local Ray on the CPU platform: at least one slot per worker process (a worker
    uses its share of the cores whatever the slot count). None: Ray's default, or a cluster's own."""
    if platform.device_name != "cpu" or ray_address or os.environ.get("RAY_ADDRESS"):
        return None
    return max(os.cpu_count() or 1, processes)


def reduce_over_ranks(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """One record from each rank's metrics: the largest value of a ``*_max`` metric, the mean of the rest."""
    keys = per_rank[0].keys()
    return {
        k: max(m[k] for m in per_rank) if k.endswith("_max") else sum(m[k] for m in per_rank) / len(per_rank)
        for k in keys
    }


class RunLoop:
    config: Any
    local_dir: str
    model_path: str
    total_steps: int
    batch_order: Any
    tracking: Tracking | None
    #: The checkpoint rotation's bound (None: keep every checkpoint; incomplete leftovers of this run's
    #: lineage are removed either way).
    checkpoints_to_keep: int | None = None

    def __init__(self) -> None:
        self.global_step = 0
        self.tracking = None
        #: The newest complete checkpoint this trainer wrote (where a restart after a worker fault resumes).
        self.last_checkpoint: Path | None = None

    # -- what a trainer provides ---------------------------------------------------------------------
    def train_step(self) -> dict[str, float]:
        raise NotImplementedError

    def validate(self) -> dict[str, float]:
        raise NotImplementedError

    def checkpoint_roles(self) -> dict[str, Any]:
        """Subfolder of a checkpoint -> the worker group that saves and loads it."""
        raise NotImplementedError

    def extra_state(self) -> dict[str, Any]:
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        pass

    @property
    def strategy(self) -> str:
        raise NotImplementedError

    # -- shared ----------------------------------------------------------------------------------------
    def plan_steps(self, *optims: OptimConfig) -> None:
        """The run's length: trainer.total_epochs over the batch order's batches, capped by
        trainer.total_training_steps; the lr schedules of ``optims`` left at total_training_steps=-1
        follow it."""
        cfg = self.config.trainer
        epochs_steps = cfg.total_epochs * self.batch_order.batches_per_epoch
        self.total_steps = min(epochs_steps, cfg.total_training_steps or epochs_steps)
        if cfg.total_training_steps and cfg.total_training_steps > epochs_steps:
            logger.warning(
                "trainer.total_training_steps=%d is capped at %d: trainer.total_epochs=%d over %d batches per "
                "epoch; raise trainer.total_epochs to train longer",
                cfg.total_training_steps,
                epochs_steps,
                cfg.total_epochs,
                self.batch_order.batches_per_epoch,
            )
        for optim in optims:
            optim.fill_total_training_steps(self.total_steps)

    def start_ray(self, processes: int | None = None) -> ResourcePool:
        """Ray as the trainer section says (address, dashboard, exposure; on a local CPU Ray one slot per
        worker process: ``processes``, default the trainer's) and the pool of ``n_gpus_per_node`` processes
        on each of ``nnodes`` nodes."""
        cfg = self.config.trainer
        if processes is None:
            processes = cfg.n_gpus_per_node * cfg.nnodes
        init_ray(
            address=cfg.ray_address,
            num_cpus=local_cpu_slots(get_platform(), cfg.ray_address, processes),
            include_dashboard=cfg.ray_include_dashboard,
            expose=cfg.ray_expose,
        )
        return ResourcePool(process_on_nodes=[cfg.n_gpus_per_node] * cfg.nnodes)

    def start_tracking(self) -> None:
        cfg = self.config.trainer
        self.tracking = Tracking(
            cfg.logger,
            RunInfo(cfg.project_name, cfg.experiment_name, self.local_dir, to_dict(self.config), self.total_steps),
        )

    def fit(self) -> dict[str, float]:
        """Steps until ``total_steps``, validating every ``test_freq`` and saving every ``save_freq`` steps
        (and at the last step); returns the last validation metrics."""
        cfg = self.config.trainer
        val_metrics: dict[str, float] = {}
        while self.global_step < self.total_steps:
            self.global_step += 1
            metrics = self.train_step()
            last = self.global_step == self.total_steps
            if cfg.test_freq > 0 and (self.global_step % cfg.test_freq == 0 or last):
                with timer("testing", metrics):
                    val_metrics = self.validate()
                metrics.update(val_metrics)
            if cfg.save_freq > 0 and (self.global_step % cfg.save_freq == 0 or last):
                with timer("save_checkpoint", metrics):
                    self.save_checkpoint()
            self.tracking.log(metrics, self.global_step)
        return val_metrics

    def resume(self) -> None:
        cfg = self.config.trainer
        folder = layout.resolve_resume(self.local_dir, cfg.resume_mode, cfg.resume_from_path)
        if folder is None:
            return
        state = layout.read_trainer_state(folder)
        for name, group in self.checkpoint_roles().items():
            group.load_checkpoint(str(folder / name))
        self.global_step = int(state["global_step"])
        self.batch_order.load_state_dict(state["batch_order"])
        self.load_extra_state(state)
        logger.info("resumed from %s (step %d)", folder, self.global_step)

    def trained_position(self) -> dict[str, int]:
        """Where the data order stands after the batches trained so far (a trainer that draws batches ahead
        of training says where it stood before it drew them: a resumed run draws them again)."""
        return self.batch_order.state_dict()

    def save_checkpoint(self) -> None:
        # A full disk removes the partial folder and says so; old checkpoints are pruned only after this one
        # is complete.
        with layout.checkpoint_write(self.local_dir, self.global_step) as folder:
            for name, group in self.checkpoint_roles().items():
                group.save_checkpoint(str(folder / name))
            state = {
                "global_step": self.global_step,
                "batch_order": self.trained_position(),
                **self.extra_state(),
                "model_path": self.model_path,
                "strategy": self.strategy,
            }
            layout.mark_complete(self.local_dir, self.global_step, state)
        layout.prune_old(self.local_dir, self.checkpoints_to_keep)
        self.last_checkpoint = folder
        logger.info("saved checkpoint %s", folder)

    def close(self) -> None:
        if self.tracking is not None:
            self.tracking.finish()
            if self.config.trainer.plot_curves and "file" in self.config.trainer.logger:
                path = plot_curves(self.local_dir)
                if path:
                    logger.info("curves: %s", path)
        self.stop_workers()

    def stop_workers(self) -> None:
        raise NotImplementedError
