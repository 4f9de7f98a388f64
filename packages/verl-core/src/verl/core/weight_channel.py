"""``WeightChannel``: a model's weights from one process to many, across worker groups.

The trainer's rank 0 is channel rank 0 and sends; each rollout worker (channel ranks 1..N) receives. They
meet through a store the sender serves (:func:`verl.core.rendezvous.serve_store`) and talk over a process
group apart from their groups' default ones (``Platform.standalone_group``: gloo on CPU, NCCL on CUDA).

Both sides agree on a manifest (name, shape, dtype of every tensor, in the order the sender yields them)
when the channel opens. Tensors then travel as raw bytes (each at an aligned offset) in buckets of whole tensors of at most
``bucket_bytes`` each (one that is larger travels alone), so a sync is a handful of broadcasts rather than
one per tensor, whatever the dtype, and neither side ever holds more than one bucket beyond the model it
already has: the receiver hands each tensor on as soon as its bucket has arrived.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

#: Each tensor starts at a multiple of this many bytes in its bucket, so that it can be viewed in any dtype.
ALIGN = 16
#: Default bucket size: big enough that a small model goes in one or two broadcasts, small enough to
#: be a rounding error next to the model on either side.
BUCKET_BYTES = 64 * 2**20


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # str(torch.dtype), e.g. "torch.float32": plain data for Ray to carry

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype.removeprefix("torch."))

    @property
    def nbytes(self) -> int:
        return int(torch.Size(self.shape).numel()) * torch.empty((), dtype=self.torch_dtype).element_size()

    @property
    def padded_nbytes(self) -> int:
        return -(-self.nbytes // ALIGN) * ALIGN

    @classmethod
    def of(cls, name: str, tensor: torch.Tensor) -> TensorSpec:
        return cls(name, tuple(tensor.shape), str(tensor.dtype))


def manifest_of(named: Iterable[tuple[str, torch.Tensor]]) -> list[TensorSpec]:
    """The manifest of ``named`` (consumed one tensor at a time; none is kept)."""
    return [TensorSpec.of(name, tensor) for name, tensor in named]


def buckets(manifest: list[TensorSpec], bucket_bytes: int = BUCKET_BYTES) -> list[list[TensorSpec]]:
    """``manifest`` cut, in order, into runs of tensors of at most ``bucket_bytes`` together."""
    cut: list[list[TensorSpec]] = []
    size = 0
    for spec in manifest:
        if not cut or size + spec.padded_nbytes > bucket_bytes:
            cut.append([])
            size = 0
        cut[-1].append(spec)
        size += spec.padded_nbytes
    return cut


class WeightChannel:
    """Channel rank 0 sends, every other rank receives; see the module's docstring."""

    def __init__(self, group: Any, rank: int, world_size: int, device: torch.device, bucket_bytes: int):
        self.group = group
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.bucket_bytes = bucket_bytes

    @classmethod
    def join(
        cls,
        store: Any,
        rank: int,
        world_size: int,
        timeout_s: float,
        platform: Any,
        bucket_bytes: int = BUCKET_BYTES,
    ) -> WeightChannel:
        """Join as ``rank`` of ``world_size``; returns once every rank has joined (each must call this
        concurrently)."""
        import torch.distributed as dist

        group = platform.standalone_group(dist.PrefixStore("weight_channel", store), rank, world_size, timeout_s)
        return cls(group, rank, world_size, platform.device(), bucket_bytes)

    def _broadcast(self, payload: torch.Tensor) -> None:
        import torch.distributed as dist

        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.group.broadcast([payload], options).wait()

    def send(self, named: Iterable[tuple[str, torch.Tensor]], manifest: list[TensorSpec]) -> int:
        """Rank 0: broadcast ``named`` (which must match ``manifest``, in order); returns the bytes sent."""
        if self.rank != 0:
            raise RuntimeError(f"only channel rank 0 sends; this is rank {self.rank}")
        stream = iter(named)
        sent = 0
        for bucket in buckets(manifest, self.bucket_bytes):
            parts = []
            for spec in bucket:
                item = next(stream, None)
                if item is None:
                    raise ValueError(f"the weights ended before {spec.name!r}, which the channel's manifest lists")
                name, tensor = item
                if TensorSpec.of(name, tensor) != spec:
                    raise ValueError(
                        f"the weights changed since the channel opened: got {TensorSpec.of(name, tensor)} where the "
                        f"manifest has {spec}; reopen the channel after changing the model"
                    )
                raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8).to(self.device)
                parts.append(raw)
                if spec.padded_nbytes > spec.nbytes:
                    parts.append(raw.new_zeros(spec.padded_nbytes - spec.nbytes))
            payload = torch.cat(parts) if len(parts) > 1 else parts[0]
            self._broadcast(payload)
            sent += payload.numel()
        extra = next(stream, None)
        if extra is not None:
            raise ValueError(f"the weights have {extra[0]!r}, which the channel's manifest does not list")
        return sent

    def receive(self, manifest: list[TensorSpec]) -> Iterator[tuple[str, torch.Tensor]]:
        """Ranks 1..: the sender's tensors, as (name, tensor) on this rank's device, bucket by bucket."""
        if self.rank == 0:
            raise RuntimeError("channel rank 0 sends; it cannot receive")
        for bucket in buckets(manifest, self.bucket_bytes):
            size = sum(spec.padded_nbytes for spec in bucket)
            payload = torch.empty(size, dtype=torch.uint8, device=self.device)
            self._broadcast(payload)
            offset = 0
            for spec in bucket:
                raw = payload[offset : offset + spec.nbytes]
                offset += spec.padded_nbytes
                yield spec.name, raw.view(spec.torch_dtype).reshape(spec.shape)
