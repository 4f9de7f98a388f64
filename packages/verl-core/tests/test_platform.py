import subprocess
import sys

import pytest
import torch

from verl.core.platform import (
    CPUPlatform,
    PlatformBase,
    PlatformNotAvailableError,
    PlatformRegistry,
    get_platform,
    reset_platform,
    select_platform_class,
)
from verl.core.registry import RegistryError


@pytest.fixture(autouse=True)
def _fresh_selection(monkeypatch):
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    reset_platform()
    yield
    reset_platform()


def test_cpu_is_selected_here_and_describes_itself():
    platform = get_platform()
    assert isinstance(platform, CPUPlatform)
    assert platform.name == "cpu"
    assert (platform.device_name, platform.vendor_name, platform.dist_backend) == ("cpu", "cpu", "gloo")
    assert platform.ray_resource_name == "CPU"
    assert platform.visible_devices_for([0, 1]) == {}
    assert platform.device() == torch.device("cpu")
    assert get_platform() is platform  # cached


def test_cpu_platform_numerics_and_memory():
    platform = CPUPlatform()
    platform.manual_seed(123)
    a = torch.rand(3)
    state = platform.get_rng_state()
    b = torch.rand(3)
    platform.set_rng_state(state)
    assert torch.equal(torch.rand(3), b)
    platform.manual_seed(123)
    assert torch.equal(torch.rand(3), a)
    stats = platform.memory_stats()
    assert stats["memory_total_gb"] > 0 and stats["max_memory_allocated_gb"] > 0
    assert platform.torch_threads_per_worker(workers_on_node=1) >= 1
    assert platform.torch_threads_per_worker(workers_on_node=64) == 1


def test_verl_platform_forces_a_registered_platform(monkeypatch):
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    assert select_platform_class() is CPUPlatform


def test_unknown_verl_platform_lists_registered(monkeypatch):
    monkeypatch.setenv("VERL_PLATFORM", "tpu9000")
    with pytest.raises(RegistryError) as exc:
        get_platform()
    assert "VERL_PLATFORM='tpu9000'" in str(exc.value)
    assert "'cpu'" in str(exc.value)


def test_priority_decides_among_available_platforms():
    @PlatformRegistry.register(platform="test-fast")
    class FastPlatform(CPUPlatform):
        priority = 50

    @PlatformRegistry.register(platform="test-absent")
    class AbsentPlatform(CPUPlatform):
        priority = 100

        @classmethod
        def availability(cls):
            return False, "no test chip here"

    try:
        assert FastPlatform.name == "test-fast"
        assert select_platform_class() is FastPlatform
        with pytest.raises(PlatformNotAvailableError, match="no test chip here"):
            select_platform_class("test-absent")
    finally:
        PlatformRegistry.unregister(platform="test-fast")
        PlatformRegistry.unregister(platform="test-absent")
    assert select_platform_class() is CPUPlatform


def test_platform_base_is_abstract():
    with pytest.raises(TypeError):
        PlatformBase()  # type: ignore[abstract]


def test_selecting_a_platform_imports_no_vendor_library():
    # A fresh interpreter: plugin loading (every installed verl plugin) must not import these.
    code = (
        "import sys; from verl.core.platform import get_platform; p = get_platform(); "
        "print(p.name, sorted(m for m in ('torch_npu', 'vllm', 'sglang', 'megatron') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["cpu", "[]"]


def test_a_platform_without_its_own_standalone_group_says_how_to_run_without_one():
    """The base class builds gloo groups only; an accelerator platform that does not override it cannot send
    weights to a rollout pool, and the error says which setting avoids that."""

    class XPlatform(CPUPlatform):
        name = "xpu-test"
        dist_backend = "xccl"

    with pytest.raises(NotImplementedError, match=r"\(xccl\) cannot build .* actor_rollout_ref.hybrid_engine=true"):
        XPlatform().standalone_group(None, 0, 2, 60.0)


def test_cpu_workers_keep_freed_memory_unless_told_otherwise(monkeypatch):
    from verl.core.platform.cpu import MALLOC_REUSE

    for name in (*MALLOC_REUSE, "GLIBC_TUNABLES", "VERL_CPU_MALLOC_REUSE"):
        monkeypatch.delenv(name, raising=False)
    platform = CPUPlatform()
    assert platform.worker_process_env() == MALLOC_REUSE
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")  # the user's own value stays (workers inherit it)
    assert platform.worker_process_env() == {"MALLOC_MMAP_MAX_": "0"}
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_max=4")  # tuned another way: left alone
    assert platform.worker_process_env() == {}
    monkeypatch.delenv("GLIBC_TUNABLES")
    monkeypatch.setenv("VERL_CPU_MALLOC_REUSE", "0")
    assert platform.worker_process_env() == {}
