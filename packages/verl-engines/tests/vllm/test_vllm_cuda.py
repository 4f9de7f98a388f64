"""The GPU-only branches of the vllm rollout: vLLM sleep mode really releases device memory, and the
in-place ``load_weights`` path makes new weights live. Run on an NVIDIA machine with vLLM installed
(``pip install 'verl-engines[vllm]' ./packages/verl-platform-cuda``;
``pytest -m "vllm and cuda" packages/verl-engines/tests/vllm``)."""

import pytest
import torch
from safetensors.torch import load_file
from vllm_test_helpers import GREEDY, prompts_batch, vllm_config

from verl.core.platform import get_platform

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.cuda,
    pytest.mark.skipif(get_platform().device_name != "cuda", reason="needs an NVIDIA GPU (the CUDA platform)"),
]

KV_CACHE = 512 << 20  # large enough that releasing it shows in the device's free memory


def checkpoint(model_path: str) -> dict[str, torch.Tensor]:
    return load_file(f"{model_path}/model.safetensors")


@pytest.mark.parametrize("sleep_level", [1, 2])
def test_sleep_releases_device_memory_and_wake_up_retakes_it(qwen2_model, keep_alive, sleep_level):
    from verl.engines.rollout.vllm import VLLMRolloutEngine

    platform = get_platform()
    engine = VLLMRolloutEngine(
        vllm_config(
            qwen2_model, load_format="hf", sleep_level=sleep_level, engine_kwargs={"kv_cache_memory_bytes": KV_CACHE}
        )
    )
    keep_alive(engine)
    prompts = prompts_batch(qwen2_model)
    reference = engine.generate(prompts, GREEDY).batch["responses"]
    assert engine.supports_sleep

    free_awake = platform.mem_get_info()[0]
    assert engine.sleep() is True
    free_asleep = platform.mem_get_info()[0]
    assert free_asleep - free_awake >= KV_CACHE // 2, (free_awake, free_asleep)
    assert engine.wake_up() is True
    if sleep_level == 2:  # the weights were discarded: generating before a sync is refused
        with pytest.raises(RuntimeError, match="discarded"):
            engine.generate(prompts, GREEDY)
        engine.update_weights(checkpoint(qwen2_model).items())
    assert torch.equal(engine.generate(prompts, GREEDY).batch["responses"], reference)
    assert platform.mem_get_info()[0] < free_asleep - KV_CACHE // 2  # the KV cache is back


def test_in_place_load_weights_makes_new_weights_live(qwen2_model, keep_alive):
    from verl.engines.rollout.vllm import VLLMRolloutEngine

    engine = VLLMRolloutEngine(vllm_config(qwen2_model, load_format="dummy"))
    keep_alive(engine)
    assert engine.weight_sync == "load_weights"
    prompts = prompts_batch(qwen2_model)
    weights = checkpoint(qwen2_model)
    engine.update_weights(weights.items())
    original = engine.generate(prompts, GREEDY).batch["responses"]
    generator = torch.Generator().manual_seed(0)
    perturbed = {name: t + 0.3 * torch.randn(t.shape, generator=generator) for name, t in weights.items()}
    engine.update_weights(perturbed.items())
    assert not torch.equal(engine.generate(prompts, GREEDY).batch["responses"], original)
    engine.update_weights(weights.items())
    assert torch.equal(engine.generate(prompts, GREEDY).batch["responses"], original)
