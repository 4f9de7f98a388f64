"""Weights & Biases tracker (extra ``verl-algos[wandb]``). ``WANDB_MODE=offline`` writes locally."""

from __future__ import annotations

import os

from verl.algos.tracking.base import TRACKERS, RunInfo, TrackerBackend, import_tracker_package


@TRACKERS.register("wandb")
class WandbTracker(TrackerBackend):
    def __init__(self, run: RunInfo):
        super().__init__(run)
        self.wandb = wandb = import_tracker_package("wandb")
        self.run_handle = wandb.init(
            project=run.project,
            name=run.experiment,
            config=run.config,
            dir=os.environ.get("WANDB_DIR") or run.local_dir,
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run_handle.log(metrics, step=step)

    def finish(self) -> None:
        self.run_handle.finish()
