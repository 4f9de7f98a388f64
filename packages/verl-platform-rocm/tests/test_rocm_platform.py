"""The rocm platform plugin: discovery through its entry point (without stealing the cuda platform's
origin), a subclass of the CUDA platform that accepts only HIP builds, device visibility through
ROCR/HIP variables set together, forced selection on this machine, and (marked ``rocm``, skipped
without an AMD GPU) the real device methods and a two-process RCCL all-reduce."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch

from verl.core.platform import PlatformNotAvailableError, get_platform, reset_platform, select_platform_class
from verl.platforms.cuda import CUDAPlatform
from verl.platforms.rocm import ROCmPlatform

ROCM_OK, ROCM_REASON = ROCmPlatform.availability()
needs_rocm = pytest.mark.skipif(not ROCM_OK, reason=f"no usable AMD GPU: {ROCM_REASON}")
needs_hip_build = pytest.mark.skipif(not torch.version.hip, reason="torch is not a ROCm (HIP) build here")


@pytest.fixture(autouse=True)
def fresh_selection(monkeypatch):
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    reset_platform()
    yield
    reset_platform()


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 120) -> str:
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


def test_loaded_through_its_entry_point_even_before_the_cuda_plugin():
    # Entry points come in no fixed order. Loaded first, the rocm plugin imports verl.platforms.cuda,
    # which registers the CUDA platform from inside the rocm plugin's import: the registration must still
    # be credited to verl-platform-cuda. The real entry points are loaded, rocm's put first.
    out = run_python(
        """
        import json
        from importlib.metadata import entry_points
        import verl.core.plugins as plugins
        from verl.core.platform import PlatformRegistry
        installed = {g: list(entry_points(group=g)) for g in (plugins.PLATFORM_GROUP, plugins.ENTRY_POINT_GROUP)}
        plugins.entry_points = lambda group: sorted(installed[group], key=lambda ep: ep.name != "rocm")
        plugins.load_plugins()
        records = plugins.plugin_records()
        assert next(iter(records)) == "rocm", list(records)
        origins = {e.key[0]: e.origin for e in PlatformRegistry.entries()}
        print(json.dumps({
            "rocm": [records["rocm"].module, records["rocm"].distribution, records["rocm"].error],
            "cuda": [records["cuda"].module, records["cuda"].distribution, records["cuda"].error],
            "origins": {k: origins[k] for k in ("rocm", "cuda")},
            "rocm_cls": PlatformRegistry.get(platform="rocm").__qualname__,
        }))
        """
    )
    info = json.loads(out.strip().splitlines()[-1])
    assert info["rocm"] == ["verl.platforms.rocm", "verl-platform-rocm", None]
    assert info["cuda"] == ["verl.platforms.cuda", "verl-platform-cuda", None]
    assert info["origins"] == {"rocm": "verl-platform-rocm", "cuda": "verl-platform-cuda"}
    assert info["rocm_cls"] == "ROCmPlatform"


def test_is_the_cuda_platform_with_amd_identity():
    assert issubclass(ROCmPlatform, CUDAPlatform) and ROCmPlatform is not CUDAPlatform
    assert ROCmPlatform.name == "rocm"
    assert ROCmPlatform.vendor_name == "amd"
    assert ROCmPlatform.device_name == "cuda"  # HIP builds expose AMD GPUs as torch "cuda" devices
    assert ROCmPlatform.dist_backend == "nccl"  # RCCL, under NCCL's name
    assert ROCmPlatform.visible_devices_env == "HIP_VISIBLE_DEVICES"
    assert ROCmPlatform.ray_resource_name == "GPU"
    assert ROCmPlatform.priority > CUDAPlatform.priority


def test_visible_devices_are_selected_at_the_rocr_level_and_renumbered(monkeypatch):
    monkeypatch.delenv("ROCR_VISIBLE_DEVICES", raising=False)
    assert ROCmPlatform().visible_devices_for([2, 3]) == {
        "ROCR_VISIBLE_DEVICES": "2,3",
        "HIP_VISIBLE_DEVICES": "0,1",
        "CUDA_VISIBLE_DEVICES": "0,1",
    }


def test_an_inherited_rocr_filter_is_indexed_not_overwritten(monkeypatch):
    # The node (or job scheduler) already hides devices: HIP index i is the i-th device ROCR leaves.
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "4,5,6,7")
    assert ROCmPlatform().visible_devices_for([1, 3]) == {
        "ROCR_VISIBLE_DEVICES": "5,7",
        "HIP_VISIBLE_DEVICES": "0,1",
        "CUDA_VISIBLE_DEVICES": "0,1",
    }
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "GPU-aaaa,GPU-bbbb")
    assert ROCmPlatform().visible_devices_for([1])["ROCR_VISIBLE_DEVICES"] == "GPU-bbbb"


def test_an_index_outside_the_inherited_rocr_filter_is_an_error(monkeypatch):
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "4,5")
    with pytest.raises(ValueError, match=r"device indices \[2\] are outside ROCR_VISIBLE_DEVICES='4,5'"):
        ROCmPlatform().visible_devices_for([0, 2])


# -- on a machine without a ROCm build or AMD GPU (like CPU CI) ------------------------------------------


@pytest.mark.skipif(bool(torch.version.hip), reason="torch is a ROCm build here")
def test_a_build_without_hip_is_refused_with_the_reason():
    ok, reason = ROCmPlatform.availability()
    assert not ok
    assert "not a ROCm build" in reason and "torch.version.hip is None" in reason
    kind = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only"
    assert kind in reason


def test_cuda_and_rocm_are_never_available_together():
    assert not (CUDAPlatform.is_available() and ROCmPlatform.is_available())


@pytest.mark.skipif(ROCM_OK, reason="an AMD GPU is available here")
def test_forcing_rocm_where_it_is_absent_fails_naming_it_and_why(monkeypatch):
    monkeypatch.setenv("VERL_PLATFORM", "rocm")
    for select in (select_platform_class, get_platform):
        with pytest.raises(PlatformNotAvailableError) as info:
            select()
        message = str(info.value)
        assert "VERL_PLATFORM='rocm'" in message and "not available" in message
        assert ROCM_REASON in message


# -- on a ROCm build / AMD hardware ---------------------------------------------------------------------


@pytest.mark.rocm
@needs_hip_build
def test_the_cuda_platform_refuses_a_hip_build():
    ok, reason = CUDAPlatform.availability()
    assert not ok
    assert "ROCm" in reason and "'rocm' platform" in reason


@pytest.fixture
def gpu():
    platform = ROCmPlatform()
    platform.set_device(0)
    return platform


@pytest.mark.rocm
@needs_rocm
def test_rocm_wins_auto_detection_and_can_be_forced(monkeypatch):
    assert select_platform_class() is ROCmPlatform
    monkeypatch.setenv("VERL_PLATFORM", "rocm")
    assert isinstance(get_platform(), ROCmPlatform)


@pytest.mark.rocm
@needs_rocm
def test_device_and_memory_statistics_follow_an_allocation(gpu):
    assert gpu.device() == torch.device("cuda", 0)
    gpu.empty_cache()
    before = gpu.memory_allocated()
    block = torch.empty(64 * 1024 * 1024, dtype=torch.uint8, device=gpu.device())  # 64 MiB
    gpu.synchronize()
    assert gpu.memory_allocated() - before >= block.numel()
    assert gpu.max_memory_allocated() >= gpu.memory_allocated()
    free, total = gpu.mem_get_info()
    assert 0 < free <= total
    del block
    gpu.empty_cache()
    gpu.reset_peak_memory_stats()
    assert gpu.max_memory_allocated() == gpu.memory_allocated() == before


@pytest.mark.rocm
@needs_rocm
def test_seeding_and_rng_state_make_device_sampling_repeatable(gpu):
    gpu.manual_seed(7)
    first = torch.randn(16, device=gpu.device())
    gpu.manual_seed(7)
    assert torch.equal(torch.randn(16, device=gpu.device()), first)
    state = gpu.get_rng_state()
    expected = torch.randn(16, device=gpu.device())
    gpu.set_rng_state(state)
    assert torch.equal(torch.randn(16, device=gpu.device()), expected)
    assert isinstance(gpu.is_bf16_supported(), bool)


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


@pytest.mark.rocm
@needs_rocm
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two AMD GPUs")
def test_two_processes_all_reduce_over_rccl_on_their_own_gpus():
    platform = ROCmPlatform()
    # Indices as HIP counts them (what Ray hands out): the runner's HIP_VISIBLE_DEVICES list, else 0, 1.
    inherited = [d for d in os.environ.get("HIP_VISIBLE_DEVICES", "").split(",") if d.strip()]
    devices = [int(d) for d in inherited[:2]] if inherited else [0, 1]
    init_method = f"tcp://127.0.0.1:{free_port()}"
    procs = []
    for rank in range(2):
        env = {**os.environ, "VERL_PLATFORM": "rocm", "RANK": str(rank), "INIT_METHOD": init_method}
        env.update(platform.visible_devices_for([devices[rank]]))
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", ALL_REDUCE], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out
        assert "all_reduce ok rocm 1" in out, out
