"""``CUDAPlatform``: NVIDIA GPUs through ``torch.cuda`` and NCCL."""

from __future__ import annotations

import logging
import os
from typing import Any, ClassVar

import torch

from verl.core.platform import PlatformBase, PlatformRegistry

logger = logging.getLogger(__name__)


@PlatformRegistry.register(platform="cuda")
class CUDAPlatform(PlatformBase):
    """NVIDIA GPUs with a CUDA build of torch.

    Every method acts on the current device of this process. Worker processes are started with
    ``visible_devices_for`` restricting them to their GPU, so "current device" is usually device 0.
    """

    device_name = "cuda"
    vendor_name = "nvidia"
    dist_backend = "nccl"
    visible_devices_env = "CUDA_VISIBLE_DEVICES"
    ray_resource_name = "GPU"
    priority = 100
    #: What a device of this platform is called in messages.
    hardware_noun = "NVIDIA GPU"
    #: The vendor tool that shows whether the driver sees the devices.
    driver_check = "nvidia-smi"

    # -- availability -----------------------------------------------------------------------------
    @classmethod
    def build_problem(cls) -> str | None:
        """Why this build of torch cannot drive this platform's devices (None: it can)."""
        if torch.version.hip:
            # A HIP build also answers torch.cuda calls, with AMD GPUs behind them: that is ROCm.
            return (
                f"torch {torch.__version__} is a ROCm (HIP {torch.version.hip}) build, which drives AMD GPUs; "
                "use the 'rocm' platform (pip install verl-platform-rocm), or install a CUDA build of torch "
                "for NVIDIA GPUs"
            )
        if torch.version.cuda is None:
            return (
                f"torch {torch.__version__} was built without CUDA (torch.version.cuda is None); "
                "install a CUDA build of torch (https://pytorch.org/get-started/locally/) to use NVIDIA GPUs"
            )
        return None

    @classmethod
    def build_description(cls) -> str:
        return f"torch {torch.__version__} (CUDA {torch.version.cuda})"

    @classmethod
    def visibility_settings(cls) -> str:
        """The environment variables that hide devices, as set now (for 'no device' messages)."""
        names = [cls.visible_devices_env] if cls.visible_devices_env else []
        shown = [f"{n}={os.environ[n]!r}" for n in names if n in os.environ]
        return ", ".join(shown) if shown else f"{' / '.join(names) or 'no visibility variable'} unset"

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        # Counting devices does not create a CUDA context, so probing leaves the driver process free to
        # fork; names and capabilities would (torch.cuda.get_device_name initializes CUDA).
        try:
            problem = cls.build_problem()
            if problem:
                return False, problem
            count = torch.cuda.device_count()
        except Exception as exc:  # availability must never raise; say what went wrong instead
            return False, f"probing {cls.name or cls.__name__} failed: {type(exc).__name__}: {exc}"
        if count == 0:
            return False, (
                f"{cls.build_description()} sees no {cls.hardware_noun} ({cls.visibility_settings()}); "
                f"check that `{cls.driver_check}` lists the devices and that the visible-devices variable is right"
            )
        return True, f"{count} {cls.hardware_noun}(s) visible, {cls.build_description()}"

    # -- devices ----------------------------------------------------------------------------------
    def device_count(self) -> int:
        return torch.cuda.device_count()

    def current_device(self) -> int:
        return torch.cuda.current_device()

    def set_device(self, index: int) -> None:
        torch.cuda.set_device(index)

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def standalone_group(self, store: Any, rank: int, world_size: int, timeout_s: float) -> Any:
        """An NCCL group apart from the default one (RCCL on ROCm, which subclasses this platform)."""
        from datetime import timedelta

        import torch.distributed as dist

        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timedelta(seconds=timeout_s)
        return dist.ProcessGroupNCCL(store, rank, world_size, options)

    # -- memory -----------------------------------------------------------------------------------
    def memory_allocated(self) -> int:
        return torch.cuda.memory_allocated()

    def max_memory_allocated(self) -> int:
        return torch.cuda.max_memory_allocated()

    def reset_peak_memory_stats(self) -> None:
        torch.cuda.reset_peak_memory_stats()

    def mem_get_info(self) -> tuple[int, int]:
        free, total = torch.cuda.mem_get_info()
        return int(free), int(total)

    # -- numerics ---------------------------------------------------------------------------------
    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)
        # torch.manual_seed seeds CUDA too, but only lazily once CUDA initializes; seeding every device
        # explicitly makes the intent visible and does not depend on that detail.
        torch.cuda.manual_seed_all(seed)

    def get_rng_state(self) -> dict[str, Any]:
        # Only the current device's generator: a worker owns one device, and a checkpoint taken with N
        # devices per process must still load where a process sees a different number of devices.
        state = super().get_rng_state()
        state[self.device_name] = torch.cuda.get_rng_state()
        return state

    def set_rng_state(self, state: dict[str, Any]) -> None:
        super().set_rng_state(state)
        device_state = state.get(self.device_name)
        if device_state is None:
            logger.warning(
                "RNG state has no %r generator (saved on %s?); the %s generator keeps its current state",
                self.device_name,
                ", ".join(sorted(state)) or "nothing",
                self.device_name,
            )
            return
        torch.cuda.set_rng_state(device_state)

    def is_bf16_supported(self) -> bool:
        return torch.cuda.is_bf16_supported()

    #: Dense (no sparsity) tensor-core peaks from NVIDIA's datasheets, FLOP/s: (bf16/fp16, tf32/fp32).
    PEAK_FLOPS: ClassVar[dict[str, tuple[float, float]]] = {
        "H200": (989e12, 494e12),
        "H100": (989e12, 494e12),  # SXM; the PCIe card is ~756e12 and is matched below first
        "H100 PCIe": (756e12, 378e12),
        "A100": (312e12, 156e12),
        "L40S": (362e12, 183e12),
        "A10": (125e12, 62.5e12),
    }

    def peak_flops(self, dtype: torch.dtype = torch.bfloat16, workers_on_node: int = 1) -> float | None:
        name = torch.cuda.get_device_name(self.current_device())
        for key in sorted(self.PEAK_FLOPS, key=len, reverse=True):  # most specific name first
            if key in name:
                half, single = self.PEAK_FLOPS[key]
                return half if dtype in (torch.bfloat16, torch.float16) else single
        return None

    def decode_compile_options(self) -> dict | None:
        """Inductor with CUDA graphs: a decode step of a small model is hundreds of short kernels, whose
        launches cost more than their work; a captured graph replays them in one launch. The step's
        static KV cache keeps its addresses, which graph replay needs."""
        return {"mode": "reduce-overhead", "fullgraph": True}

    # -- process setup ----------------------------------------------------------------------------
    def torch_threads_per_worker(self, workers_on_node: int) -> int:
        """GPU workers spend their CPU time launching kernels and collating batches: a few intra-op
        threads are enough, and more oversubscribe the node when 8 workers share it."""
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return max(1, min(4, cores // max(1, workers_on_node)))
