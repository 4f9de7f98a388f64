"""TensorBoard tracker: event files under ``<trainer.default_local_dir>/tensorboard``."""

from __future__ import annotations

import os

from verl.algos.tracking.base import TRACKERS, RunInfo, TrackerBackend


@TRACKERS.register("tensorboard")
class TensorBoardTracker(TrackerBackend):
    def __init__(self, run: RunInfo):
        super().__init__(run)
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = os.environ.get("TENSORBOARD_DIR") or os.path.join(run.local_dir, "tensorboard")
        self.writer = SummaryWriter(log_dir=self.log_dir)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            if isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()
