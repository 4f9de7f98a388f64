"""File tracker: ``<trainer.default_local_dir>/metrics.jsonl``, one JSON object per step with ``step``
and every metric (DESIGN.md). Appends, so a resumed run continues the same file; each line is flushed
so a killed run keeps every completed step. A full disk stops the run with ``RunFolderDiskFullError`` naming
the file, the last complete checkpoint and what to do, as a full disk during a checkpoint does."""

from __future__ import annotations

import json
import math
import os

from verl.algos.tracking.base import TRACKERS, RunInfo, TrackerBackend

METRICS_FILE = "metrics.jsonl"


@TRACKERS.register("file")
class FileTracker(TrackerBackend):
    def __init__(self, run: RunInfo):
        super().__init__(run)
        os.makedirs(run.local_dir, exist_ok=True)
        self.path = os.path.join(run.local_dir, METRICS_FILE)
        _drop_torn_last_line(self.path)
        self.fh = open(self.path, "a", encoding="utf-8")

    def log(self, metrics: dict[str, float], step: int) -> None:
        from verl.algos.run.checkpoint_layout import close_unflushable, disk_full_error, is_disk_full

        if self.fh is None:
            raise RuntimeError(f"{self.path} could not be written before (the disk was full); the run has stopped")
        record = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        try:
            self.fh.write(json.dumps(record) + "\n")
            self.fh.flush()
            os.fsync(self.fh.fileno())
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            fh, self.fh = self.fh, None
            close_unflushable(fh)  # a torn line is cut when the run resumes
            raise disk_full_error(self.run.local_dir, f"the metrics {self.path}") from exc

    def finish(self) -> None:
        if self.fh is not None:
            self.fh.close()


def _drop_torn_last_line(path: str) -> None:
    """A run killed in the middle of a write can leave a last line without its newline: cut it, so the
    resumed run's first record starts on a line of its own (that step is logged again anyway)."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return
    with open(path, "rb+") as fh:
        data = fh.read()
        if data.endswith(b"\n"):
            return
        fh.truncate(data.rfind(b"\n") + 1)


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep them visible rather than dropping them
    return value


def read_metrics(local_dir: str) -> list[dict]:
    """One record per step, in step order. Records of the same step (a resumed run validates at the step
    it resumed from; a rerun of a step after a crash) are merged, later values winning. A torn last line
    (no newline) is left out."""
    path = os.path.join(local_dir, METRICS_FILE)
    if not os.path.exists(path):
        return []
    by_step: dict[int, dict] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.endswith("\n"):
                break  # a last line torn by a kill or a full disk: the run resumes before that step
            line = line.strip()
            if line:
                record = json.loads(line)
                by_step.setdefault(record["step"], {}).update(record)
    return [by_step[s] for s in sorted(by_step)]
