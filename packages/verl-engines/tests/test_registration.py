"""The engines are found through the core's registries after plugin loading, never by import path."""

import subprocess
import sys

from verl.core.engine import EngineRegistry, RolloutRegistry
from verl.core.plugins import failed_plugins, load_plugins


def test_plugin_registers_fsdp_and_hf_for_every_device():
    records = load_plugins()
    assert "engines" in records and not records["engines"].error, failed_plugins()
    from verl.engines.fsdp import FSDPEngine, FSDPValueEngine
    from verl.engines.rollout.hf import HFRolloutEngine

    for device in ("cpu", "cuda", "npu"):
        for backend in ("fsdp", "fsdp2"):
            assert EngineRegistry.get("language_model", backend, device=device) is FSDPEngine
            assert EngineRegistry.get("value_model", backend, device=device) is FSDPValueEngine
        assert RolloutRegistry.get("hf", device=device) is HFRolloutEngine
    # a vendor without its own engine falls back to the device's generic entry
    assert EngineRegistry.get("language_model", "fsdp2", device="cuda", vendor="amd") is FSDPEngine
    assert FSDPEngine.config_class.__name__ == "FSDPEngineConfig"


def test_plugin_registers_megatron_without_importing_megatron_core():
    records = load_plugins()
    assert "engines" in records and not records["engines"].error, failed_plugins()
    from verl.engines.megatron import MegatronEngine, MegatronEngineConfig, MegatronValueEngine

    for device in ("cpu", "cuda", "npu"):
        assert EngineRegistry.get("language_model", "megatron", device=device) is MegatronEngine
        assert EngineRegistry.get("value_model", "megatron", device=device) is MegatronValueEngine
    assert MegatronEngine.config_class is MegatronEngineConfig


def test_importing_the_plugin_pulls_in_no_optional_backend():
    code = (
        "import sys, verl.engines; "
        "bad = [m for m in ('vllm', 'sglang', 'megatron', 'torch_npu') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
