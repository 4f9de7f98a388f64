"""``Rollouter``: a driver thread that keeps the rollout pool generating, one training step's prompts at a
time, into a queue the trainer takes from (``async_training.mode=fully_async``).

- **Freshness.** Between two weight pushes the rollouter draws at most ``max_units`` units (verl's
  ``(1 + staleness_threshold) x trigger_parameter_sync_step`` steps' worth of prompts), less the units
  drawn before the push and not trained yet (they are stale already); then it waits for the next push.
  With ``staleness_threshold=0`` and ``trigger_parameter_sync_step=1`` that is synchronous training.
- **Pushes** (``sync``) take the generation lock, so they land between two generation calls: between two
  units, or, with partial rollouts, between two segments of one unit, whose unfinished rows then continue
  with the new weights (``segments.generate_in_segments``). Each row records the policy versions that
  generated its first and last tokens (``param_version_start``, ``param_version_end``).
- **Checkpoints** record the data order's position before the oldest unit not yet trained
  (``trained_position``): the queue's contents are not saved, a resumed run draws those prompts again.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from verl.algos.async_training.segments import generate_in_segments
from verl.algos.trainer import rollout_phase as rollout
from verl.core.protocol import DataProto


@dataclass
class Unit:
    """One training step's prompts, drawn for step ``step``."""

    step: int
    #: the data order's position before these prompts were drawn
    position: dict[str, int]
    batch: DataProto | None = None
    metrics: dict[str, float] = field(default_factory=dict)


class Rollouter:
    def __init__(
        self,
        trainer: Any,
        max_units: int,
        segment_tokens: int | None,
        eos_token_ids: list[int],
        pad_token_id: int,
        first_step: int,
    ):
        self.trainer = trainer
        self.max_units = max_units
        self.segment_tokens = segment_tokens  # None: whole units (no partial rollouts)
        self.eos_token_ids = eos_token_ids
        self.pad_token_id = pad_token_id
        self.cond = threading.Condition()
        #: held while a generation call runs; a push takes it to land between two calls
        self.generation_lock = threading.Lock()
        #: drawn and not trained yet, oldest first (generated or still generating)
        self.units: deque[Unit] = deque()
        self.version = trainer.policy_version
        #: units the rollouter may still draw before the next push
        self.budget = max_units
        self.next_step = first_step
        self.error: BaseException | None = None
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="rollouter", daemon=True)

    # -- the trainer's side ---------------------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def take(self, step: int) -> Unit:
        """Step ``step``'s unit, once generated and scored (waits for it)."""
        with self.cond:
            while not self._ready() and self.error is None:
                self.cond.wait()
            if not self._ready():
                # what failed generating or scoring this step's unit, as the synchronous trainer would have
                # raised it at this step (a worker fault restarts the run, ...); units before it train first
                raise self.error  # type: ignore[misc]
            unit = self.units.popleft()
            self.cond.notify_all()
        if unit.step != step:
            raise RuntimeError(f"the rollouter's next unit is step {unit.step}'s, but this is step {step}")
        return unit

    def _ready(self) -> bool:
        return bool(self.units) and self.units[0].batch is not None

    def sync(self, push: Callable[[], dict[str, float]], version: int) -> dict[str, float]:
        """Push new weights (``push``) between two generation calls; the budget of units starts again."""
        waited = time.perf_counter()
        with self.generation_lock:
            waited = time.perf_counter() - waited
            metrics = push()
            with self.cond:
                self.version = version
                self.budget = self.max_units - len(self.units)
                self.cond.notify_all()
        metrics["timing_s/wait_for_rollout_pause"] = waited
        return metrics

    def trained_position(self) -> dict[str, int]:
        with self.cond:
            return dict(self.units[0].position) if self.units else self.trainer.batch_order.state_dict()

    def queued(self) -> int:
        with self.cond:
            return sum(1 for unit in self.units if unit.batch is not None)

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()

    # -- the thread -------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self.cond:
                    while not self.stopping and (self.budget <= 0 or self.next_step > self.trainer.total_steps):
                        self.cond.wait()
                    if self.stopping:
                        return
                    unit = Unit(self.next_step, self.trainer.batch_order.state_dict())
                    prompts = self.trainer._next_prompts(0, unit.step)
                    self.units.append(unit)
                    self.next_step += 1
                    self.budget -= 1
                batch = self._generate(unit, prompts)
                with self.cond:
                    unit.batch = batch
                    self.cond.notify_all()
        except BaseException as exc:  # the trainer raises it from take()
            with self.cond:
                if not self.stopping:
                    self.error = exc
                self.cond.notify_all()

    def _generate(self, unit: Unit, prompts: DataProto) -> DataProto:
        trainer = self.trainer
        sampling = rollout.training_sampling(trainer.config, trainer.generation_seed(unit.step))
        workers = trainer.rollout_workers
        if self.segment_tokens is None:
            with self.generation_lock:
                generated_by = self.version
                pending = rollout.submit_generation(workers, prompts, sampling)
                batch = pending.result(unit.metrics)
            versions = np.full(len(batch), generated_by, dtype=np.int64)
            batch.non_tensor_batch["param_version_start"] = versions
            batch.non_tensor_batch["param_version_end"] = versions.copy()
        else:
            last = {"version": self.version}

            def generate(part: DataProto, part_sampling):
                with self.generation_lock:
                    last["version"] = self.version
                    return workers.generate_sequences(part, part_sampling)

            rest, gen_input = rollout.split_for_generation(prompts)
            start = time.perf_counter()
            output = generate_in_segments(
                generate,
                gen_input,
                sampling,
                self.segment_tokens,
                self.eos_token_ids,
                self.pad_token_id,
                version=lambda: last["version"],
            )
            unit.metrics["timing_s/gen"] = time.perf_counter() - start
            batch = rollout.merge_output(rest, sampling, output, unit.metrics)
        return rollout.score(trainer.reward_fn, trainer.rm, batch, unit.metrics)
