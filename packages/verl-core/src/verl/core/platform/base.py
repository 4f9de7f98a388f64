"""The hardware abstraction every device-specific call goes through.

Code outside platform packages never touches ``torch.cuda`` (or ``torch.npu``) directly: it asks
``get_platform()``. A platform for a chip driven through an existing torch device type subclasses the
matching platform (ROCm subclasses CUDA); a new device type subclasses :class:`PlatformBase`.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import torch


class PlatformBase(ABC):
    """One kind of accelerator (or the CPU), as seen by verl.

    Class attributes describe the platform; methods act on the current process's devices.
    """

    #: Registry name, set by ``PlatformRegistry.register(platform=...)``.
    name: ClassVar[str] = ""
    #: torch device type string: "cpu", "cuda", "npu", ...
    device_name: ClassVar[str]
    #: Who makes the chip: "cpu", "nvidia", "amd", "huawei", ...
    vendor_name: ClassVar[str]
    #: torch.distributed backend: "gloo", "nccl", "hccl", ...
    dist_backend: ClassVar[str]
    #: Environment variable that restricts the devices a process sees (None: there is none).
    visible_devices_env: ClassVar[str | None] = None
    #: Ray resource name a worker asks one unit of per process ("CPU", "GPU", "NPU").
    ray_resource_name: ClassVar[str]
    #: Auto-detection order: the available platform with the highest priority wins. CPU is lowest.
    priority: ClassVar[int] = 0

    # -- availability -----------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def availability(cls) -> tuple[bool, str]:
        """(available, reason). The reason says why not (a missing library, no device) or what was
        found. Must not raise and must not import a vendor library that is absent."""

    @classmethod
    def is_available(cls) -> bool:
        return cls.availability()[0]

    # -- devices ------------------------------------------------------------------------------------
    @abstractmethod
    def device_count(self) -> int:
        """Devices visible to this process."""

    def device(self, index: int | None = None) -> torch.device:
        if index is None:
            index = self.current_device()
        return torch.device(self.device_name, index)

    def current_device(self) -> int:
        return 0

    def set_device(self, index: int) -> None:
        """Make ``index`` the current device of this process."""

    def synchronize(self) -> None:
        """Wait for all queued work on the current device."""

    def empty_cache(self) -> None:
        """Return cached, unused device memory to the driver."""

    # -- memory -------------------------------------------------------------------------------------
    def memory_allocated(self) -> int:
        """Bytes held by live tensors on the current device."""
        return 0

    def max_memory_allocated(self) -> int:
        return 0

    def reset_peak_memory_stats(self) -> None:
        pass

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes of the current device."""
        return (0, 0)

    def memory_stats(self) -> dict[str, float]:
        """Memory figures in GiB under stable names, for metrics (``perf/max_memory_allocated_gb``...)."""
        gib = 1024**3
        free, total = self.mem_get_info()
        return {
            "memory_allocated_gb": self.memory_allocated() / gib,
            "max_memory_allocated_gb": self.max_memory_allocated() / gib,
            "memory_free_gb": free / gib,
            "memory_total_gb": total / gib,
        }

    # -- numerics -----------------------------------------------------------------------------------
    def manual_seed(self, seed: int) -> None:
        """Seed torch's generators, including this device's."""
        torch.manual_seed(seed)

    def get_rng_state(self) -> dict[str, Any]:
        return {"cpu": torch.get_rng_state()}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["cpu"])

    def is_bf16_supported(self) -> bool:
        return False

    def peak_flops(self, dtype: torch.dtype = torch.float32, workers_on_node: int = 1) -> float | None:
        """Peak dense matmul FLOP/s of one worker's device in ``dtype`` (for ``perf/mfu``); None when
        unknown. ``workers_on_node``: how many worker processes share the node (CPU workers share cores)."""
        return None

    def decode_compile_options(self) -> dict[str, Any] | None:
        """``torch.compile`` keyword arguments for a rollout engine's one-token decode step, or None where
        compiling that step does not pay for its warm-up (engines then decode eagerly unless told to
        compile). A decode step is a whole-model forward of one token per row: on a GPU its time is mostly
        kernel launches, which CUDA-graph-style capture removes."""
        return None

    def standalone_group(self, store: Any, rank: int, world_size: int, timeout_s: float) -> Any:
        """A process group of ``world_size`` processes that meet through ``store``, apart from the default
        group (whose members it may mix across worker groups: a weight channel from the trainer's ranks to a
        rollout pool's). The base class builds it for gloo; an accelerator platform builds its own backend's."""
        from datetime import timedelta

        import torch.distributed as dist

        if self.dist_backend != "gloo":
            raise NotImplementedError(
                f"the {self.name} platform ({self.dist_backend}) cannot build a process group apart from the "
                "default one yet, so weights cannot travel between worker groups here: keep "
                "actor_rollout_ref.hybrid_engine=true (the rollout shares the actor's processes)"
            )
        return dist.ProcessGroupGloo(store, rank, world_size, timedelta(seconds=timeout_s))

    # -- process setup ------------------------------------------------------------------------------
    def worker_process_env(self) -> dict[str, str]:
        """Environment variables worker processes must start with (read when the process starts, e.g. by
        the C library's allocator): a local Ray started by ``init_ray`` gives them to every worker."""
        return {}

    def torch_threads_per_worker(self, workers_on_node: int) -> int:
        """How many intra-op threads a worker process should use. Accelerator workers need few."""
        return 1

    def visible_devices_for(self, local_ids: list[int]) -> dict[str, str]:
        """Environment that restricts a worker to ``local_ids`` (empty where there is no variable)."""
        if not self.visible_devices_env:
            return {}
        return {self.visible_devices_env: ",".join(str(i) for i in local_ids)}

    def backend_environment(self, backend: str) -> AbstractContextManager[Any]:
        """What a process must be inside to run the training backend ``backend`` ("megatron", ...) on this
        platform: a vendor's adaptor imported first, or substitutes for what the backend assumes of CUDA.
        Engines enter it around their work in the processes that run them. Default: nothing to do."""
        return contextlib.nullcontext()

    def backend_options(self, backend: str) -> dict[str, Any]:
        """Choices a training backend ``backend`` ("veomni", ...) asks the platform for, such as which op
        kernels run here. Default: none (the backend's own defaults, written for accelerators)."""
        return {}

    def describe(self) -> str:
        ok, reason = self.availability()
        return (
            f"{self.name} (device={self.device_name}, vendor={self.vendor_name}, backend={self.dist_backend}): {reason}"
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} device={self.device_name!r} vendor={self.vendor_name!r}>"
