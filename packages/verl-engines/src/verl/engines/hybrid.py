"""The hybrid engine: an actor's training engine and its rollout engine colocated in one worker.

Before generation (:meth:`HybridEngine.to_rollout`): the optimizer state leaves the device, the rollout
engine wakes up, the trained weights stream into it one tensor at a time
(``rollout.update_weights(actor.named_full_parameters())``: no second full copy is ever built; a LoRA
actor sends only its adapter where the rollout engine serves adapters, see :meth:`sync_weights`), and
the actor's parameters leave the device. After generation (:meth:`HybridEngine.to_training`): the
rollout engine sleeps and the actor gets back exactly what it had on the device before.

Every transition is timed into metrics: ``timing_s/rollout_wake_up``, ``timing_s/update_weights``,
``timing_s/actor_offload``, ``timing_s/rollout_generate``, ``timing_s/rollout_sleep`` and
``timing_s/actor_reload``.

Offloading the actor only pays on an accelerator (on CPU, device memory *is* host memory), so by
default it happens when the platform's device is not the CPU.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

from verl.core.engine import RolloutEngine, SamplingParams, TrainingEngine
from verl.core.platform import get_platform
from verl.core.protocol import DataProto

logger = logging.getLogger(__name__)

_ALL_ON_DEVICE = {"model": True, "optimizer": True}


class HybridEngine:
    """Phase transitions between a :class:`TrainingEngine` (actor) and a :class:`RolloutEngine`."""

    def __init__(self, actor: TrainingEngine, rollout: RolloutEngine, offload_actor: bool | None = None):
        self.actor = actor
        self.rollout = rollout
        self.platform = get_platform()
        self.offload_actor = self.platform.device_name != "cpu" if offload_actor is None else offload_actor
        self.in_rollout = False
        self._actor_state: dict[str, bool] = dict(_ALL_ON_DEVICE)
        self._base_in_rollout = False  # LoRA: the rollout holds the actor's (frozen) base weights

    @contextlib.contextmanager
    def _timed(self, metrics: dict[str, float], name: str):
        self.platform.synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.platform.synchronize()
            metrics[name] = metrics.get(name, 0.0) + time.perf_counter() - start

    def sync_weights(self) -> dict[str, float]:
        """Stream the actor's current weights into the rollout engine (the rollout must be awake).

        A LoRA actor and a rollout engine that serves adapters: the base weights go once (again only
        after a sleep that discarded them), then only the adapter (``weight_sync/adapter_only`` = 1 and
        ``weight_sync/adapter_mb`` in the metrics). Otherwise the merged weights, every time."""
        metrics: dict[str, float] = {}
        with self._timed(metrics, "timing_s/update_weights"):
            self.actor.load_to_device(model=True, optimizer=False)
            adapter = self.actor.lora_adapter() if self.rollout.supports_lora_adapters else None
            if adapter is None:
                self.rollout.update_weights(self.actor.named_full_parameters())
            else:
                if not self._base_in_rollout:
                    self.rollout.update_weights(self.actor.named_base_parameters())
                    self._base_in_rollout = True
                self.rollout.update_adapter(adapter)
                metrics["weight_sync/adapter_mb"] = adapter.nbytes / 2**20
            metrics["weight_sync/adapter_only"] = float(adapter is not None)
        return metrics

    def to_rollout(self) -> dict[str, float]:
        """Training -> generation. Returns the timings; a no-op when already in rollout mode."""
        if self.in_rollout:
            return {}
        metrics: dict[str, float] = {}
        # What the actor had on the device, restored by to_training (engines without offload
        # bookkeeping are taken to keep everything on the device).
        self._actor_state = dict(getattr(self.actor, "offload_state", _ALL_ON_DEVICE))
        if self.offload_actor:
            with self._timed(metrics, "timing_s/actor_offload"):
                self.actor.offload_to_host(model=False, optimizer=True)  # not needed for the sync
        with self._timed(metrics, "timing_s/rollout_wake_up"):
            self.rollout.wake_up()
        metrics.update(self.sync_weights())
        if self.offload_actor:
            with self._timed(metrics, "timing_s/actor_offload"):
                self.actor.offload_to_host(model=True, optimizer=False)
        self.in_rollout = True
        return metrics

    def to_training(self) -> dict[str, float]:
        """Generation -> training. Returns the timings; a no-op when already in training mode."""
        if not self.in_rollout:
            return {}
        metrics: dict[str, float] = {}
        with self._timed(metrics, "timing_s/rollout_sleep"):
            self.rollout.sleep()
        if self.rollout.weights_discarded:
            self._base_in_rollout = False
        with self._timed(metrics, "timing_s/actor_reload"):
            now = dict(getattr(self.actor, "offload_state", _ALL_ON_DEVICE))
            want = self._actor_state
            self.actor.load_to_device(
                model=want["model"] and not now["model"], optimizer=want["optimizer"] and not now["optimizer"]
            )
            self.actor.offload_to_host(
                model=now["model"] and not want["model"], optimizer=now["optimizer"] and not want["optimizer"]
            )
        self.in_rollout = False
        return metrics

    def generate(
        self,
        prompts: DataProto,
        sampling: SamplingParams,
        via: Callable[[RolloutEngine, DataProto, SamplingParams], DataProto] | None = None,
    ) -> DataProto:
        """Sync, generate, and go back to training; timings in ``output.meta_info["metrics"]``. ``via``
        generates with the rollout engine in another way (an agent loop's turns); default its ``generate``."""
        metrics = self.to_rollout()
        try:
            with self._timed(metrics, "timing_s/rollout_generate"):
                output = via(self.rollout, prompts, sampling) if via else self.rollout.generate(prompts, sampling)
        finally:
            metrics.update(self.to_training())
        output.meta_info.setdefault("metrics", {}).update(metrics)
        return output
