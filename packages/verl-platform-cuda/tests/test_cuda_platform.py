"""The cuda platform plugin: discovery through its entry point, its description, availability and
forced selection on this machine, and (marked ``cuda``, skipped without an NVIDIA GPU) the real device
methods and a two-process NCCL all-reduce."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch

from verl.core.platform import (
    PlatformNotAvailableError,
    get_platform,
    platform_names,
    reset_platform,
    select_platform_class,
)
from verl.core.registry import RegistryError
from verl.platforms.cuda import CUDAPlatform

CUDA_OK, CUDA_REASON = CUDAPlatform.availability()
needs_cuda = pytest.mark.skipif(not CUDA_OK, reason=f"no usable NVIDIA GPU: {CUDA_REASON}")


@pytest.fixture(autouse=True)
def fresh_selection(monkeypatch):
    """Every test selects the platform from scratch, from its own environment."""
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    reset_platform()
    yield
    reset_platform()


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    """Run ``code`` in a fresh interpreter (nothing imported yet, as for a user) and return stdout."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, f"subprocess failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


# -- discovery ------------------------------------------------------------------------------------------


def test_loaded_through_its_entry_point_from_its_distribution():
    out = run_python(
        """
        import json
        from verl.core.platform import PlatformRegistry
        from verl.core.plugins import load_plugins, plugin_records
        load_plugins()
        record = plugin_records()["cuda"]
        entry = next(e for e in PlatformRegistry.entries() if e.key == ("cuda",))
        print(json.dumps({"module": record.module, "distribution": record.distribution, "error": record.error,
                          "origin": entry.origin, "cls": f"{entry.obj.__module__}.{entry.obj.__qualname__}"}))
        """
    )
    info = json.loads(out.strip().splitlines()[-1])
    assert info == {
        "module": "verl.platforms.cuda",
        "distribution": "verl-platform-cuda",
        "error": None,
        "origin": "verl-platform-cuda",
        "cls": "verl.platforms.cuda.platform.CUDAPlatform",
    }


def test_describes_nvidia_gpus():
    assert CUDAPlatform.name == "cuda"
    assert CUDAPlatform.device_name == "cuda"
    assert CUDAPlatform.vendor_name == "nvidia"
    assert CUDAPlatform.dist_backend == "nccl"
    assert CUDAPlatform.visible_devices_env == "CUDA_VISIBLE_DEVICES"
    assert CUDAPlatform.ray_resource_name == "GPU"
    assert CUDAPlatform.priority > 0  # above the CPU platform in auto-detection


def test_visible_devices_for_restricts_to_the_given_gpus():
    platform = CUDAPlatform()
    assert platform.visible_devices_for([2, 3]) == {"CUDA_VISIBLE_DEVICES": "2,3"}
    assert platform.visible_devices_for([0]) == {"CUDA_VISIBLE_DEVICES": "0"}


def test_worker_threads_stay_few():
    threads = CUDAPlatform().torch_threads_per_worker(workers_on_node=1)
    assert 1 <= threads <= 4


# -- on a machine without a CUDA build or GPU (like CPU CI) ---------------------------------------------


@pytest.mark.skipif(torch.version.cuda is not None or bool(torch.version.hip), reason="torch is a GPU build here")
def test_cpu_build_of_torch_is_refused_with_the_reason():
    ok, reason = CUDAPlatform.availability()
    assert not ok
    assert "built without CUDA" in reason and "torch.version.cuda is None" in reason
    assert torch.__version__ in reason


@pytest.mark.skipif(CUDA_OK, reason="an NVIDIA GPU is available here")
def test_forcing_cuda_where_it_is_absent_fails_naming_it_and_why(monkeypatch):
    monkeypatch.setenv("VERL_PLATFORM", "cuda")
    for select in (select_platform_class, get_platform):
        with pytest.raises(PlatformNotAvailableError) as info:
            select()
        message = str(info.value)
        assert "VERL_PLATFORM='cuda'" in message and "not available" in message
        assert CUDA_REASON in message
        assert "Unset VERL_PLATFORM" in message


def test_unknown_platform_name_lists_the_registered_ones(monkeypatch):
    monkeypatch.setenv("VERL_PLATFORM", "no-such-chip")
    with pytest.raises(RegistryError) as info:
        get_platform()
    message = str(info.value)
    assert "'no-such-chip' is not a registered platform" in message
    registered = platform_names()
    assert {"cpu", "cuda"} <= set(registered)
    for name in registered:
        assert repr(name) in message


# -- on NVIDIA hardware ---------------------------------------------------------------------------------


@pytest.fixture
def gpu():
    platform = CUDAPlatform()
    platform.set_device(0)
    return platform


@pytest.mark.cuda
@needs_cuda
def test_cuda_is_selected_when_forced_and_when_auto_detected(monkeypatch):
    assert select_platform_class() is CUDAPlatform
    monkeypatch.setenv("VERL_PLATFORM", "cuda")
    assert isinstance(get_platform(), CUDAPlatform)


@pytest.mark.cuda
@needs_cuda
def test_device_and_memory_statistics_follow_an_allocation(gpu):
    assert gpu.device_count() >= 1
    assert gpu.current_device() == 0
    assert gpu.device() == torch.device("cuda", 0)
    gpu.empty_cache()
    gpu.reset_peak_memory_stats()
    before = gpu.memory_allocated()
    block = torch.empty(64 * 1024 * 1024, dtype=torch.uint8, device=gpu.device())  # 64 MiB
    gpu.synchronize()
    assert gpu.memory_allocated() - before >= block.numel()
    assert gpu.max_memory_allocated() >= gpu.memory_allocated()
    free, total = gpu.mem_get_info()
    assert 0 < free <= total
    stats = gpu.memory_stats()
    assert stats["memory_total_gb"] > 0 and stats["memory_allocated_gb"] > 0
    del block
    gpu.empty_cache()
    assert gpu.memory_allocated() == before
    gpu.reset_peak_memory_stats()
    assert gpu.max_memory_allocated() == before


@pytest.mark.cuda
@needs_cuda
def test_seeding_and_rng_state_make_device_sampling_repeatable(gpu):
    gpu.manual_seed(1234)
    first = torch.randn(16, device=gpu.device())
    gpu.manual_seed(1234)
    assert torch.equal(torch.randn(16, device=gpu.device()), first)

    state = gpu.get_rng_state()
    assert set(state) == {"cpu", "cuda"}
    expected_gpu, expected_cpu = torch.randn(16, device=gpu.device()), torch.randn(4)
    gpu.set_rng_state(state)
    assert torch.equal(torch.randn(16, device=gpu.device()), expected_gpu)
    assert torch.equal(torch.randn(4), expected_cpu)


@pytest.mark.cuda
@needs_cuda
def test_bf16_support_is_reported_truthfully(gpu):
    supported = gpu.is_bf16_supported()
    assert isinstance(supported, bool)
    if supported:
        a = torch.ones(8, 8, dtype=torch.bfloat16, device=gpu.device())
        assert (a @ a).float().sum().item() == 8 * 8 * 8


ALL_REDUCE = """
import os, torch, torch.distributed as dist
from verl.core.platform import get_platform
platform = get_platform()
rank = int(os.environ["RANK"])
platform.set_device(0)  # visible_devices_for left exactly one device to this process
dist.init_process_group(platform.dist_backend, init_method=os.environ["INIT_METHOD"], rank=rank, world_size=2)
x = torch.full((4,), float(rank + 1), device=platform.device())
dist.all_reduce(x)
platform.synchronize()
assert x.tolist() == [3.0] * 4, x
print("all_reduce ok", platform.name, platform.device_count())
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_device_ids(visible_devices_env: str, count: int) -> list:
    """The first ``count`` devices this test may use, in the node's numbering (as Ray would hand them
    out): the ones the runner's visible-devices variable lists, else 0..count-1."""
    inherited = os.environ.get(visible_devices_env, "").strip()
    if not inherited:
        return list(range(count))
    return [int(d) if d.strip().isdigit() else d.strip() for d in inherited.split(",")][:count]


@pytest.mark.cuda
@needs_cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_processes_all_reduce_over_nccl_on_their_own_gpus():
    platform = CUDAPlatform()
    init_method = f"tcp://127.0.0.1:{free_port()}"
    devices = node_device_ids("CUDA_VISIBLE_DEVICES", 2)
    procs = []
    for rank in range(2):
        env = {**os.environ, "VERL_PLATFORM": "cuda", "RANK": str(rank), "INIT_METHOD": init_method}
        env.update(platform.visible_devices_for([devices[rank]]))
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", ALL_REDUCE], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out
        assert "all_reduce ok cuda 1" in out, out
