"""Weights from the trainer's pool to a rollout pool of its own (``actor_rollout_ref.hybrid_engine=false``).

The actor's ranks gather each full tensor as they do for the hybrid engine's sync (a collective over the
actor's group); the actor's rank 0 sends it over a :class:`~verl.core.weight_channel.WeightChannel` to
every rollout worker, which streams it into its engine (``rollout.update_weights``). The driver's
:class:`WeightSync` opens the channel once per set of workers and pushes the weights before a generation
whenever the actor has stepped since the last push, timed (``timing_s/weight_sync``) with its size
(``weight_sync/mb``).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from verl.core.controller import Dispatch, register
from verl.core.platform import get_platform
from verl.core.weight_channel import TensorSpec, WeightChannel, manifest_of

#: torch.distributed's timeout on the channel (the worker groups' own); the driver's call timeout
#: (trainer.worker_timeout_s) reports a stuck sync long before.
CHANNEL_TIMEOUT_S = 1800.0


@contextlib.contextmanager
def model_on_device(actor: Any):
    """The actor's parameters on the device for a gather (an engine that offloads them between phases
    gets them back where they were)."""
    was_on_device = dict(getattr(actor, "offload_state", {"model": True})).get("model", True)
    actor.load_to_device(model=True, optimizer=False)
    try:
        yield
    finally:
        if not was_on_device:
            actor.offload_to_host(model=True, optimizer=False)


class WeightSender:
    """The actor's side (a mixin of ``ActorRolloutRefWorker``): every rank gathers, rank 0 sends."""

    actor: Any
    rank: int
    _weight_store: Any = None
    _weight_channel: WeightChannel | None = None
    _weight_manifest: list[TensorSpec] | None = None

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def weight_manifest(self) -> list[TensorSpec]:
        """Name, shape and dtype of every tensor the actor sends, in order (one gather, nothing kept)."""
        with model_on_device(self.actor):
            self._weight_manifest = manifest_of(self.actor.named_full_parameters())
        return self._weight_manifest

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def serve_weight_channel(self, world_size: int) -> tuple[str, int]:
        """Rank 0: serve the channel's store; returns its address."""
        import ray

        from verl.core.rendezvous import serve_store

        if self.rank != 0:
            return "", 0
        host = ray.util.get_node_ip_address()
        self._weight_store = serve_store(host, world_size, CHANNEL_TIMEOUT_S)
        return host, int(self._weight_store.port)

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def join_weight_channel(self, world_size: int) -> None:
        """Rank 0 joins as the channel's sender (the receivers join at the same time)."""
        if self.rank == 0:
            self._weight_channel = WeightChannel.join(
                self._weight_store, 0, world_size, CHANNEL_TIMEOUT_S, get_platform()
            )

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def send_weights(self) -> int:
        """Every rank gathers (a collective); rank 0 sends. Returns the bytes sent."""
        if self._weight_manifest is None:
            raise RuntimeError("send_weights before weight_manifest: open the channel first (WeightSync.open)")
        with model_on_device(self.actor):
            named = self.actor.named_full_parameters()
            if self._weight_channel is None:
                for _ in named:  # the other ranks take part in each gather and drop the tensor
                    pass
                return 0
            return self._weight_channel.send(named, self._weight_manifest)


class WeightReceiver:
    """The rollout's side (a mixin of ``RolloutWorker``): every rank receives into its engine."""

    rollout: Any
    rank: int
    _weight_channel: WeightChannel | None = None
    _weight_manifest: list[TensorSpec] | None = None
    #: How many pushes reached this worker; generation refuses to run on the placeholder weights.
    weight_version = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def join_weight_channel(self, host: str, port: int, world_size: int, manifest: list[TensorSpec]) -> None:
        from verl.core.rendezvous import join_store

        store = join_store(host, port, world_size, CHANNEL_TIMEOUT_S)
        self._weight_manifest = list(manifest)
        self._weight_channel = WeightChannel.join(store, 1 + self.rank, world_size, CHANNEL_TIMEOUT_S, get_platform())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def receive_weights(self) -> None:
        if self._weight_channel is None or self._weight_manifest is None:
            raise RuntimeError("receive_weights before join_weight_channel: open the channel first (WeightSync.open)")
        received = self._weight_channel.receive(self._weight_manifest)
        try:
            self.rollout.update_weights(received)
        finally:
            for _ in received:  # whatever the engine left: the sender's broadcasts must all be met
                pass
        self.weight_version += 1


class WeightSync:
    """The driver's side: the channel between ``sender`` (the actor's role handle) and ``receiver`` (the
    rollout workers'), and when to push."""

    def __init__(self, sender: Any, receiver: Any):
        self.sender = sender
        self.receiver = receiver
        #: the actor has weights the rollout workers have not received (true until the first push)
        self.stale = True

    def open(self) -> None:
        world = 1 + self.receiver.world_size
        manifest = self.sender.weight_manifest()
        host, port = self.sender.serve_weight_channel(world)
        # The channel's group forms only when every member joins: both sides at once.
        sending = self.sender.join_weight_channel.submit(world)
        receiving = self.receiver.join_weight_channel.submit(host, port, world, manifest)
        sending.get()
        receiving.get()

    def push(self) -> dict[str, float]:
        """Send the actor's weights to every rollout worker; returns the timing and size."""
        start = time.perf_counter()
        sending = self.sender.send_weights.submit()
        receiving = self.receiver.receive_weights.submit()
        sent = sending.get()
        receiving.get()
        self.stale = False
        return {"timing_s/weight_sync": time.perf_counter() - start, "weight_sync/mb": sent / 2**20}
