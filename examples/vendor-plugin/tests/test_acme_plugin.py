"""The Acme plugin's own tests: what every vendor should check about its plugin.

Run them where verl-core, verl-engines and this package are installed (``pip install -e .[test]``):
``pytest tests``. They need no Acme hardware: the example chip is "visible" when ACME_XPU_VISIBLE=1.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from verl.core.engine import EngineRegistry
from verl.core.platform import get_platform, reset_platform, select_platform_class
from verl.core.plugins import load_plugins, plugin_records
from verl.core.protocol import DataProto
from verl.engines.fsdp import FSDPEngine


@pytest.fixture(autouse=True)
def clean_selection(monkeypatch):
    for name in ("VERL_PLATFORM", "VERL_ENGINE_DEVICE", "VERL_ENGINE_VENDOR", "ACME_XPU_VISIBLE"):
        monkeypatch.delenv(name, raising=False)
    reset_platform()
    yield
    reset_platform()


@pytest.fixture
def acme_visible(monkeypatch):
    monkeypatch.setenv("ACME_XPU_VISIBLE", "1")
    reset_platform()


def test_the_plugin_loads_through_its_entry_point():
    record = load_plugins()["acme"]
    assert record.error is None, record.traceback
    assert (record.module, record.distribution) == ("verl_acme_xpu.plugin", "verl-acme-xpu")
    assert plugin_records()["acme"] == record


def test_the_platform_is_chosen_only_where_the_chip_is_visible(monkeypatch):
    from verl_acme_xpu import AcmeXPUPlatform

    ok, reason = AcmeXPUPlatform.availability()
    assert not ok and "ACME_XPU_VISIBLE=1" in reason
    assert select_platform_class().name != "acme"

    monkeypatch.setenv("ACME_XPU_VISIBLE", "1")
    assert select_platform_class() is AcmeXPUPlatform
    platform = get_platform()
    assert (platform.name, platform.vendor_name, platform.device_name) == ("acme", "acme", "cpu")


@pytest.mark.usefixtures("acme_visible")
def test_the_acme_engine_wins_on_acme_and_only_there(monkeypatch):
    from verl_acme_xpu import AcmeFSDPEngine

    assert EngineRegistry.get(model_type="language_model", backend="fsdp") is AcmeFSDPEngine
    # Another vendor on the same device type gets the generic engine.
    assert EngineRegistry.get(model_type="language_model", backend="fsdp", vendor="other") is FSDPEngine


def test_attention_the_chip_lacks_is_refused_up_front():
    from verl_acme_xpu import AcmeFSDPEngine

    with pytest.raises(ValueError, match="'flash_attention_2' is not available on the Acme XPU"):
        AcmeFSDPEngine({"model_path": "unused", "attn_implementation": "flash_attention_2"})


@pytest.fixture
def tiny_model(tmp_path):
    """A 2-layer Qwen2 with random weights, saved as a local Hugging Face folder (nothing downloaded)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    Qwen2ForCausalLM(config).save_pretrained(tmp_path / "tiny")
    return str(tmp_path / "tiny")


@pytest.fixture
def process_group():
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.usefixtures("acme_visible", "process_group")
def test_the_acme_engine_computes_what_the_generic_engine_does(tiny_model):
    from verl_acme_xpu import AcmeFSDPEngine

    prompts = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    responses = torch.tensor([[20, 21, 22], [30, 31, 32]])
    input_ids = torch.cat([prompts, responses], dim=1)
    batch = DataProto.from_dict(
        {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "position_ids": torch.arange(input_ids.shape[1]).expand_as(input_ids).clone(),
            "responses": responses,
        }
    )
    log_probs = {}
    for cls in (AcmeFSDPEngine, FSDPEngine):
        engine = cls({"model_path": tiny_model})
        engine.initialize()  # a one-process gloo group, FSDP2 over the platform's device
        assert engine.platform.name == "acme"
        with engine.eval_mode():
            log_probs[cls] = engine.forward_only(batch)["log_probs"]
    acme = log_probs[AcmeFSDPEngine]
    assert acme.shape == responses.shape
    assert torch.isfinite(acme).all() and (acme <= 0).all()
    torch.testing.assert_close(acme, log_probs[FSDPEngine], rtol=0, atol=0)
