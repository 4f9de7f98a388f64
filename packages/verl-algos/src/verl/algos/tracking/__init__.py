"""Experiment tracking: ``Tracking`` fans each step's metrics out to the backends in ``trainer.logger``."""

from __future__ import annotations

import logging

from verl.algos.tracking import console, file, mlflow_backend, tensorboard, wandb_backend  # noqa: F401  (register)
from verl.algos.tracking.base import TRACKERS, RunInfo, TrackerBackend
from verl.algos.tracking.file import read_metrics
from verl.algos.tracking.plot import plot_curves

logger = logging.getLogger(__name__)


class Tracking:
    def __init__(self, backends: list[str], run: RunInfo):
        self.backends: list[TrackerBackend] = [TRACKERS.get(name)(run) for name in backends]

    def log(self, metrics: dict[str, float], step: int) -> None:
        for backend in self.backends:
            backend.log(metrics, step)

    def finish(self) -> None:
        for backend in self.backends:
            try:
                backend.finish()
            except Exception:  # one backend failing to close must not hide the others' output
                logger.exception("tracking backend %s failed to finish", type(backend).__name__)


__all__ = ["TRACKERS", "RunInfo", "TrackerBackend", "Tracking", "plot_curves", "read_metrics"]
