"""MLflow tracker (extra ``verl-algos[mlflow]``). Without ``MLFLOW_TRACKING_URI`` it records into a local
SQLite store, ``<trainer.default_local_dir>/mlflow.db`` (no server; MLflow 3 retired the plain file store).
Browse it with ``mlflow ui --backend-store-uri sqlite:///<that path>``."""

from __future__ import annotations

import os
import re

from verl.algos.tracking.base import TRACKERS, RunInfo, TrackerBackend, import_tracker_package


@TRACKERS.register("mlflow")
class MlflowTracker(TrackerBackend):
    def __init__(self, run: RunInfo):
        super().__init__(run)
        self.mlflow = mlflow = import_tracker_package("mlflow")
        os.makedirs(run.local_dir, exist_ok=True)
        uri = os.environ.get("MLFLOW_TRACKING_URI") or local_store_uri(run.local_dir)
        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment(run.project)
        self.active = mlflow.start_run(run_name=run.experiment)
        mlflow.log_params({k: str(v)[:250] for k, v in _flatten(run.config).items()})

    def log(self, metrics: dict[str, float], step: int) -> None:
        # MLflow metric names allow only [\w.\- /]; "@" in "val/mean@4" is replaced.
        clean = {re.sub(r"[^\w.\- /]", "_", k): float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        self.mlflow.log_metrics(clean, step=step)

    def finish(self) -> None:
        self.mlflow.end_run()


def local_store_uri(local_dir: str) -> str:
    return "sqlite:///" + os.path.abspath(os.path.join(local_dir, "mlflow.db"))


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
