"""The CPU platform: built into verl-core so a fresh install runs anywhere."""

from __future__ import annotations

import functools
import os
import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from verl.core.platform.base import PlatformBase
from verl.core.platform.registry import PlatformRegistry


@PlatformRegistry.register(platform="cpu")
class CPUPlatform(PlatformBase):
    device_name = "cpu"
    vendor_name = "cpu"
    dist_backend = "gloo"
    visible_devices_env = None
    ray_resource_name = "CPU"
    priority = -100  # always last

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        return True, f"{os.cpu_count()} logical cores, torch {torch.__version__}"

    def device_count(self) -> int:
        # Workers on CPU are processes, not devices; each process owns "device" 0.
        return 1

    def device(self, index: int | None = None) -> torch.device:
        return torch.device("cpu")

    def mem_get_info(self) -> tuple[int, int]:
        try:
            import psutil  # optional; ray depends on it

            vm = psutil.virtual_memory()
            return int(vm.available), int(vm.total)
        except ImportError:  # pragma: no cover - ray brings psutil
            return (0, 0)

    def memory_allocated(self) -> int:
        # CPU tensors are not tracked by torch; resident set size is the honest figure.
        try:
            import psutil

            return int(psutil.Process().memory_info().rss)
        except ImportError:  # pragma: no cover
            return 0

    def max_memory_allocated(self) -> int:
        import resource

        # ru_maxrss is KiB on Linux.
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024

    def is_bf16_supported(self) -> bool:
        # bf16 runs on CPU, but slower than fp32 without AMX; engines default to fp32 here.
        return True

    def peak_flops(self, dtype: torch.dtype = torch.float32, workers_on_node: int = 1) -> float | None:
        """Measured, not looked up: the node's matmul rate with all its cores, shared by its workers."""
        return _measured_matmul_flops(dtype) / max(1, workers_on_node)

    def decode_compile_options(self) -> dict | None:
        # Measured with SmolLM2-135M on 2 cores: a batch-16 decode step is bound by its matmuls (MKL
        # sgemm at 16 rows), eager and inductor-compiled steps were within the machine's noise of each
        # other, and compiling the 30-layer step took about a minute per run. So: eager by default
        # (``compile_decode=true`` still compiles, with inductor's defaults).
        return None

    def backend_environment(self, backend: str) -> AbstractContextManager[Any]:
        """Megatron-core allocates on "cuda" and checks CUDA tensor types; on the CPU it runs inside a
        cuda -> cpu redirect (:mod:`verl.core.platform.cuda_redirect`). For testing parallel layouts
        (TP, PP over gloo) without an accelerator, not for speed."""
        if backend == "megatron":
            from verl.core.platform.cuda_redirect import CudaToCpuRedirect

            return CudaToCpuRedirect()
        return nullcontext()

    def backend_options(self, backend: str) -> dict[str, Any]:
        """VeOmni's default kernels (Liger, Triton, fused MoE) need a GPU: the reference implementations."""
        if backend == "veomni":
            return {
                "moe_implementation": "eager",
                "cross_entropy_loss_implementation": "eager",
                "rms_norm_implementation": "eager",
                "swiglu_mlp_implementation": "eager",
                "rotary_pos_emb_implementation": "eager",
                "load_balancing_loss_implementation": "eager",
            }
        return {}

    def worker_process_env(self) -> dict[str, str]:
        """glibc's allocator keeping freed memory for reuse (:data:`MALLOC_REUSE`), unless the environment
        already tunes it or ``VERL_CPU_MALLOC_REUSE=0``."""
        if os.environ.get("VERL_CPU_MALLOC_REUSE", "1") == "0" or "GLIBC_TUNABLES" in os.environ:
            return {}
        return {name: value for name, value in MALLOC_REUSE.items() if name not in os.environ}

    def torch_threads_per_worker(self, workers_on_node: int) -> int:
        """Split the node's cores between its worker processes (oversubscription halves throughput)."""
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return max(1, cores // max(1, workers_on_node))


#: glibc gives every freed block over 32 MB back to the system (and trims its heap's top beyond 128 KB), so
#: each training step faults its large tensors (logits, gradients, FSDP's reduce buffers) in afresh: ~2.2 GB
#: of pages per SmolLM2 update on 2 cores, about a quarter of the update's time. Workers instead take large
#: blocks from the heap and never trim it: freed memory is reused, no page is faulted twice, and the resident
#: size stays near the run's peak (+10% over glibc's default measured there). Variables glibc reads at start.
MALLOC_REUSE = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}


@functools.lru_cache(maxsize=4)
def _measured_matmul_flops(dtype: torch.dtype, size: int = 1024, seconds: float = 0.5) -> float:
    """Best-of-several square matmul rate on all cores (what a CPU's "peak" means in practice)."""
    threads = torch.get_num_threads()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(cores)
    try:
        a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
        a @ b  # warm up
        best, deadline = 0.0, time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            a @ b
            best = max(best, 2.0 * size**3 / (time.perf_counter() - start))
        return best
    finally:
        torch.set_num_threads(threads)
