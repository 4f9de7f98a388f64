"""The npu platform plugin: discovery through its entry point, lazy import of torch_npu (importing the
plugin never imports it), the reasons it gives where torch_npu is missing or broken, forced selection on
this machine, and (marked ``npu``, skipped without an Ascend NPU) the real device methods and a
two-process HCCL all-reduce."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch

from verl.core.platform import PlatformNotAvailableError, get_platform, reset_platform, select_platform_class
from verl.platforms.npu import NPUPlatform

NPU_OK, NPU_REASON = NPUPlatform.availability()
needs_npu = pytest.mark.skipif(not NPU_OK, reason=f"no usable Ascend NPU: {NPU_REASON}")
TORCH_NPU_INSTALLED = importlib.util.find_spec("torch_npu") is not None


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


# -- discovery and lazy import --------------------------------------------------------------------------


def test_loaded_through_its_entry_point_without_importing_torch_npu():
    out = run_python(
        """
        import json, sys
        from verl.core.platform import PlatformRegistry
        from verl.core.plugins import load_plugins, plugin_records
        load_plugins()
        record = plugin_records()["npu"]
        entry = next(e for e in PlatformRegistry.entries() if e.key == ("npu",))
        print(json.dumps({"module": record.module, "distribution": record.distribution, "error": record.error,
                          "origin": entry.origin, "torch_npu_imported": "torch_npu" in sys.modules}))
        """
    )
    info = json.loads(out.strip().splitlines()[-1])
    assert info == {
        "module": "verl.platforms.npu",
        "distribution": "verl-platform-npu",
        "error": None,
        "origin": "verl-platform-npu",
        "torch_npu_imported": False,
    }


# A torch_npu that is installed but cannot load its CANN libraries, as on a host where the toolkit is
# missing or set_env.sh was not sourced. It records every attempt to import it.
BROKEN_TORCH_NPU = """
import os
with open(os.environ["TORCH_NPU_IMPORT_LOG"], "a") as log:
    log.write("imported\\n")
raise ImportError("libascendcl.so: cannot open shared object file: No such file or directory")
"""


def test_a_torch_npu_that_cannot_load_cann_is_imported_only_when_probed(tmp_path):
    (tmp_path / "torch_npu").mkdir()
    (tmp_path / "torch_npu" / "__init__.py").write_text(BROKEN_TORCH_NPU)
    log = tmp_path / "imports.log"
    out = run_python(
        """
        import json, os, sys
        import verl.platforms.npu
        from verl.core.platform import PlatformNotAvailableError
        from verl.platforms.npu import NPUPlatform
        after_import = open(os.environ["TORCH_NPU_IMPORT_LOG"]).read() if os.path.exists(os.environ["TORCH_NPU_IMPORT_LOG"]) else ""
        first, second = NPUPlatform.availability(), NPUPlatform.availability()
        try:
            NPUPlatform().device_count()
            method_error = None
        except PlatformNotAvailableError as exc:
            method_error = str(exc)
        print(json.dumps({"after_import": after_import, "first": first, "second": second,
                          "method_error": method_error, "attempts": open(os.environ["TORCH_NPU_IMPORT_LOG"]).read()}))
        """,
        env={
            "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
            "TORCH_NPU_IMPORT_LOG": str(log),
        },
    )
    info = json.loads(out.strip().splitlines()[-1])
    assert info["after_import"] == ""  # importing the plugin did not touch torch_npu
    ok, reason = info["first"]
    assert not ok
    assert "torch_npu is installed but failed to import" in reason
    assert "libascendcl.so" in reason and "CANN" in reason
    assert info["second"] == info["first"]
    assert info["method_error"] == f"the npu platform cannot be used here: {reason}"
    assert info["attempts"] == "imported\n"  # probed once; a failed C-extension import is not retried


@pytest.mark.skipif(TORCH_NPU_INSTALLED, reason="torch_npu is installed here")
def test_missing_torch_npu_is_reported_with_the_install_command():
    ok, reason = NPUPlatform.availability()
    assert not ok
    assert reason.startswith("torch_npu is not installed: pip install 'verl-platform-npu[npu]'")
    with pytest.raises(PlatformNotAvailableError, match="torch_npu is not installed"):
        NPUPlatform().device()
    with pytest.raises(PlatformNotAvailableError, match="torch_npu is not installed"):  # a weight channel's group
        NPUPlatform().standalone_group(None, 0, 2, 60.0)


def test_describes_ascend_npus():
    assert NPUPlatform.name == "npu"
    assert NPUPlatform.device_name == "npu"
    assert NPUPlatform.vendor_name == "huawei"
    assert NPUPlatform.dist_backend == "hccl"
    assert NPUPlatform.visible_devices_env == "ASCEND_RT_VISIBLE_DEVICES"
    assert NPUPlatform.ray_resource_name == "NPU"
    assert NPUPlatform.priority > 0


def test_visible_devices_for_restricts_to_the_given_npus():
    assert NPUPlatform().visible_devices_for([0, 5]) == {"ASCEND_RT_VISIBLE_DEVICES": "0,5"}


@pytest.mark.skipif(NPU_OK, reason="an Ascend NPU is available here")
def test_forcing_npu_where_it_is_absent_fails_naming_it_and_why(monkeypatch):
    monkeypatch.setenv("VERL_PLATFORM", "npu")
    for select in (select_platform_class, get_platform):
        with pytest.raises(PlatformNotAvailableError) as info:
            select()
        message = str(info.value)
        assert "VERL_PLATFORM='npu'" in message and "not available" in message
        assert NPU_REASON in message


# -- on Ascend hardware ---------------------------------------------------------------------------------


@pytest.fixture
def npu():
    platform = NPUPlatform()
    platform.set_device(0)
    return platform


@pytest.mark.npu
@needs_npu
def test_npu_wins_auto_detection_and_can_be_forced(monkeypatch):
    assert select_platform_class() is NPUPlatform
    monkeypatch.setenv("VERL_PLATFORM", "npu")
    assert isinstance(get_platform(), NPUPlatform)


@pytest.mark.npu
@needs_npu
def test_device_and_memory_statistics_follow_an_allocation(npu):
    assert npu.device_count() >= 1
    assert npu.current_device() == 0
    assert npu.device() == torch.device("npu", 0)
    npu.empty_cache()
    before = npu.memory_allocated()
    block = torch.empty(64 * 1024 * 1024, dtype=torch.uint8, device=npu.device())  # 64 MiB
    npu.synchronize()
    assert npu.memory_allocated() - before >= block.numel()
    assert npu.max_memory_allocated() >= npu.memory_allocated()
    free, total = npu.mem_get_info()
    assert 0 < free <= total
    del block
    npu.empty_cache()
    npu.reset_peak_memory_stats()
    assert npu.max_memory_allocated() == npu.memory_allocated() == before


@pytest.mark.npu
@needs_npu
def test_seeding_and_rng_state_make_device_sampling_repeatable(npu):
    npu.manual_seed(99)
    first = torch.randn(16, device=npu.device())
    npu.manual_seed(99)
    assert torch.equal(torch.randn(16, device=npu.device()), first)
    state = npu.get_rng_state()
    assert set(state) == {"cpu", "npu"}
    expected = torch.randn(16, device=npu.device())
    npu.set_rng_state(state)
    assert torch.equal(torch.randn(16, device=npu.device()), expected)
    assert isinstance(npu.is_bf16_supported(), bool)


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


@pytest.mark.npu
@needs_npu
@pytest.mark.skipif(not NPU_OK or NPUPlatform().device_count() < 2, reason="needs two Ascend NPUs")
def test_two_processes_all_reduce_over_hccl_on_their_own_npus():
    platform = NPUPlatform()
    inherited = [d for d in os.environ.get("ASCEND_RT_VISIBLE_DEVICES", "").split(",") if d.strip()]
    devices = [int(d) for d in inherited[:2]] if inherited else [0, 1]
    init_method = f"tcp://127.0.0.1:{free_port()}"
    procs = []
    for rank in range(2):
        env = {**os.environ, "VERL_PLATFORM": "npu", "RANK": str(rank), "INIT_METHOD": init_method}
        env.update(platform.visible_devices_for([devices[rank]]))
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", ALL_REDUCE], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out
        assert "all_reduce ok npu 1" in out, out


# -- training backends --------------------------------------------------------------------------------


def test_megatron_environment_imports_the_mindspeed_adaptor_lazily(monkeypatch):
    import contextlib
    import importlib
    import sys
    import types

    from verl.platforms.npu import platform as npu_platform

    assert "mindspeed.megatron_adaptor" not in sys.modules  # importing the plugin did not import it
    platform = NPUPlatform()
    assert isinstance(platform.backend_environment("fsdp"), contextlib.nullcontext)
    # Without MindSpeed: an error that says what to install.
    real_import = importlib.import_module
    monkeypatch.setattr(
        npu_platform.importlib,
        "import_module",
        lambda name: (
            (_ for _ in ()).throw(ImportError("No module named 'mindspeed'"))
            if name.startswith("mindspeed")
            else real_import(name)
        ),
    )
    with pytest.raises(ImportError, match="MindSpeed"):
        platform.backend_environment("megatron")
    # With it: imported when the megatron environment is asked for.
    imported = []
    monkeypatch.setattr(
        npu_platform.importlib, "import_module", lambda name: imported.append(name) or types.ModuleType(name)
    )
    with platform.backend_environment("megatron"):
        pass
    assert imported == ["mindspeed.megatron_adaptor"]
