"""``NPUPlatform``: Ascend NPUs through ``torch_npu`` (the ``torch.npu`` API) and HCCL."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import os
from contextlib import AbstractContextManager, nullcontext
from types import ModuleType
from typing import Any

import torch

from verl.core.platform import PlatformBase, PlatformNotAvailableError, PlatformRegistry

logger = logging.getLogger(__name__)

INSTALL_HINT = (
    "pip install 'verl-platform-npu[npu]' (torch-npu must match torch "
    f"{torch.__version__.split('+')[0]} and your CANN toolkit; see Ascend's compatibility table)"
)


@functools.cache
def _torch_npu_problem() -> str | None:
    """Why ``torch_npu`` cannot be used here (None: it imported). Imports it on first call; the answer
    is kept, because retrying a failed import of a C extension can leave it half-initialized."""
    if importlib.util.find_spec("torch_npu") is None:
        return f"torch_npu is not installed: {INSTALL_HINT}"
    try:
        # Importing torch_npu registers the "npu" device type and the torch.npu module.
        importlib.import_module("torch_npu")
    except Exception as exc:  # typically libascendcl.so or another CANN library not found
        return (
            f"torch_npu is installed but failed to import ({type(exc).__name__}: {exc}); "
            "is the CANN toolkit installed and its set_env.sh sourced (ASCEND_TOOLKIT_HOME, LD_LIBRARY_PATH)?"
        )
    return None


def _npu() -> ModuleType:
    """``torch.npu``, importing torch_npu on first use; a clear error where it cannot be used."""
    problem = _torch_npu_problem()
    if problem:
        raise PlatformNotAvailableError(f"the npu platform cannot be used here: {problem}")
    return torch.npu  # type: ignore[attr-defined]  # added by torch_npu


@PlatformRegistry.register(platform="npu")
class NPUPlatform(PlatformBase):
    """Huawei Ascend NPUs with torch_npu. Every method acts on this process's current NPU."""

    device_name = "npu"
    vendor_name = "huawei"
    dist_backend = "hccl"
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"
    ray_resource_name = "NPU"
    # Above cuda's: torch_npu is only ever installed on purpose, on an Ascend host; if such a host also
    # shows a CUDA device, the NPUs are what the user installed this package for.
    priority = 120

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        try:
            problem = _torch_npu_problem()
            if problem:
                return False, problem
            count = torch.npu.device_count()  # type: ignore[attr-defined]
            version = getattr(importlib.import_module("torch_npu"), "__version__", "?")
        except Exception as exc:  # availability must never raise; say what went wrong instead
            return False, f"probing npu failed: {type(exc).__name__}: {exc}"
        if count == 0:
            visible = os.environ.get(cls.visible_devices_env or "")
            setting = (
                f"ASCEND_RT_VISIBLE_DEVICES={visible!r}" if visible is not None else "ASCEND_RT_VISIBLE_DEVICES unset"
            )
            return False, f"torch_npu {version} sees no Ascend NPU ({setting}); check that `npu-smi info` lists them"
        return True, f"{count} Ascend NPU(s) visible, torch {torch.__version__}, torch_npu {version}"

    # -- devices ----------------------------------------------------------------------------------
    def device_count(self) -> int:
        return _npu().device_count()

    def device(self, index: int | None = None) -> torch.device:
        _npu()  # the "npu" device type exists only once torch_npu is imported
        return super().device(index)

    def current_device(self) -> int:
        return _npu().current_device()

    def set_device(self, index: int) -> None:
        _npu().set_device(index)

    def synchronize(self) -> None:
        _npu().synchronize()

    def empty_cache(self) -> None:
        _npu().empty_cache()

    def standalone_group(self, store: Any, rank: int, world_size: int, timeout_s: float) -> Any:
        """An HCCL group apart from the default one: ``torch.distributed.ProcessGroupHCCL(store, rank, size,
        timeout)``, which importing torch_npu adds."""
        from datetime import timedelta

        import torch.distributed as dist

        _npu()
        return dist.ProcessGroupHCCL(store, rank, world_size, timedelta(seconds=timeout_s))  # type: ignore[attr-defined]

    # -- memory -----------------------------------------------------------------------------------
    def memory_allocated(self) -> int:
        return _npu().memory_allocated()

    def max_memory_allocated(self) -> int:
        return _npu().max_memory_allocated()

    def reset_peak_memory_stats(self) -> None:
        _npu().reset_peak_memory_stats()

    def mem_get_info(self) -> tuple[int, int]:
        free, total = _npu().mem_get_info()
        return int(free), int(total)

    # -- numerics ---------------------------------------------------------------------------------
    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)
        _npu().manual_seed_all(seed)

    def get_rng_state(self) -> dict[str, Any]:
        # The current device's generator only, as on CUDA: a worker owns one device.
        state = super().get_rng_state()
        state[self.device_name] = _npu().get_rng_state()
        return state

    def set_rng_state(self, state: dict[str, Any]) -> None:
        super().set_rng_state(state)
        device_state = state.get(self.device_name)
        if device_state is None:
            logger.warning(
                "RNG state has no 'npu' generator (saved on %s?); the npu generator keeps its current state",
                ", ".join(sorted(state)) or "nothing",
            )
            return
        _npu().set_rng_state(device_state)

    def is_bf16_supported(self) -> bool:
        return bool(_npu().is_bf16_supported())

    # -- training backends ------------------------------------------------------------------------
    def backend_environment(self, backend: str) -> AbstractContextManager[Any]:
        """Megatron on Ascend runs through MindSpeed: ``mindspeed.megatron_adaptor`` patches megatron-core
        for NPUs and must be imported before megatron is used. Imported here, lazily, only when a process
        runs the megatron engine on this platform."""
        if backend == "megatron":
            import_megatron_adaptor()
        return nullcontext()

    def backend_options(self, backend: str) -> dict[str, Any]:
        """VeOmni maps its default kernels to Ascend ones itself, except the SwiGLU MLP, which has no NPU
        kernel: the reference implementation (what VeOmni asks NPU users to set)."""
        if backend == "veomni":
            return {"swiglu_mlp_implementation": "eager"}
        return {}

    # -- process setup ----------------------------------------------------------------------------
    def torch_threads_per_worker(self, workers_on_node: int) -> int:
        """NPU workers launch kernels and collate batches on the host: a few threads are enough."""
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return max(1, min(4, cores // max(1, workers_on_node)))


MINDSPEED_HINT = (
    "the megatron engine on Ascend NPUs needs MindSpeed (https://gitee.com/ascend/MindSpeed; the PyPI "
    "'mindspeed' is a placeholder): install it from source, matching your megatron-core"
)


def import_megatron_adaptor() -> ModuleType:
    """``mindspeed.megatron_adaptor`` (its import patches megatron-core for NPUs); a clear error without it."""
    try:
        return importlib.import_module("mindspeed.megatron_adaptor")
    except ImportError as exc:
        raise ImportError(f"{MINDSPEED_HINT} ({type(exc).__name__}: {exc})") from exc
