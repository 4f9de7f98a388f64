"""Console tracker: a progress bar over training steps and one compact line of key metrics per step."""

from __future__ import annotations

import logging
import sys

from tqdm import tqdm

from verl.algos.tracking.base import TRACKERS, RunInfo, TrackerBackend

logger = logging.getLogger("verl.train")

#: Shown first, in this order, when present; the rest of the step's metrics go to the log at DEBUG.
KEY_METRICS = (
    "critic/score/mean",
    "val/acc",
    # agent loops: whether the model's tool calls are well-formed and run
    "agent/good_call_rate",
    "val/agent/good_call_rate",
    "actor/pg_loss",
    "actor/entropy",
    "actor/grad_norm",
    "response_length/mean",
    "timing_s/step",
    "perf/throughput",
    "sft/loss",
    "val/loss",
)


@TRACKERS.register("console")
class ConsoleTracker(TrackerBackend):
    def __init__(self, run: RunInfo):
        super().__init__(run)
        self.bar = tqdm(total=run.total_steps, desc="training", unit="step", file=sys.stderr, dynamic_ncols=True)

    def log(self, metrics: dict[str, float], step: int) -> None:
        shown = {k: metrics[k] for k in KEY_METRICS if k in metrics}
        shown.update({k: v for k, v in metrics.items() if k.startswith("val/") and k.endswith("/acc")})
        line = " ".join(f"{k}={_fmt(v)}" for k, v in shown.items())
        self.bar.write(f"step {step}: {line}")
        logger.debug("step %d metrics: %s", step, metrics)
        if self.bar.total is None or self.bar.n < self.bar.total:
            self.bar.update(max(0, step - self.bar.n))

    def finish(self) -> None:
        self.bar.close()


def _fmt(value: float) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
