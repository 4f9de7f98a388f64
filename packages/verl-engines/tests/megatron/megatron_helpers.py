"""Tiny HF models for the megatron tests (every parameter random, norms and biases included, so a
mis-mapped weight changes the outputs), and the megatron setup each spawned rank runs."""

from __future__ import annotations

import contextlib
import os

import torch

VOCAB = 200  # not a multiple of 128: megatron pads it (to 256, or 256 per 2 TP ranks)
ARCHS = ("llama", "qwen2", "qwen3")
MOE_ARCHS = ("qwen2_moe", "qwen3_moe")
#: Experts of the tiny MoE models: 4, two per token, so EP=2 puts two on each rank.
EXPERTS = 4


def hf_config(arch: str, tie: bool | None = None, layers: int = 2):
    from transformers import LlamaConfig, Qwen2Config, Qwen2MoeConfig, Qwen3Config, Qwen3MoeConfig

    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    if arch == "llama":  # untied by default, non-default rope theta
        return LlamaConfig(
            **common, tie_word_embeddings=bool(tie), rope_parameters={"rope_type": "default", "rope_theta": 5e5}
        )
    if arch == "qwen2":  # tied, qkv bias
        return Qwen2Config(**common, tie_word_embeddings=True if tie is None else tie)
    if arch == "qwen3":  # q/k norm, explicit head_dim
        return Qwen3Config(**common, head_dim=16, tie_word_embeddings=bool(tie))
    moe = dict(num_experts=EXPERTS, num_experts_per_tok=2, moe_intermediate_size=32)
    if arch == "qwen2_moe":  # qkv bias, a gated shared expert, top-k weights not renormalised
        return Qwen2MoeConfig(
            **common, **moe, shared_expert_intermediate_size=48, norm_topk_prob=False, tie_word_embeddings=bool(tie)
        )
    if arch == "qwen3_moe":  # q/k norm, no shared expert, top-k weights renormalised
        return Qwen3MoeConfig(**common, **moe, head_dim=16, norm_topk_prob=True, tie_word_embeddings=bool(tie))
    raise ValueError(arch)


def random_hf_model(arch: str, seed: int = 0, tie: bool | None = None, layers: int = 2):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(arch, tie, layers), dtype=torch.float32)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:  # biases
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    return model.eval()


def write_model(path: str, arch: str, seed: int = 0, tie: bool | None = None, layers: int = 2) -> str:
    """A HF folder with the random model and a word-level tokenizer."""
    from verl_test_models import word_tokenizer

    os.makedirs(path, exist_ok=True)
    random_hf_model(arch, seed, tie, layers).save_pretrained(path)
    word_tokenizer(["hello", "world"], VOCAB).save_pretrained(path)
    return path


def write_value_model(path: str, arch: str, seed: int = 0) -> str:
    """A HF value-model folder (``*ForTokenClassification``, one label): the random backbone of
    :func:`random_hf_model` and a random ``score`` head with bias."""
    from transformers import AutoModelForTokenClassification
    from verl_test_models import word_tokenizer

    config = hf_config(arch, tie=False)
    config.num_labels = 1
    torch.manual_seed(seed)
    model = AutoModelForTokenClassification.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        model.model.load_state_dict(random_hf_model(arch, seed, tie=False).model.state_dict())
        g = torch.Generator().manual_seed(seed + 2)
        model.score.weight.copy_(0.3 * torch.randn(model.score.weight.shape, generator=g))
        model.score.bias.fill_(0.5)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    word_tokenizer(["hello", "world"], VOCAB).save_pretrained(path)
    return path


def checkpoint_state(model) -> dict[str, torch.Tensor]:
    """``model``'s weights as its checkpoint stores them (transformers >= 5 fuses MoE experts in memory
    and writes one tensor per expert)."""
    import tempfile

    with tempfile.TemporaryDirectory() as path:
        model.save_pretrained(path)
        return hf_state(path)


def hf_state(path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(os.path.join(path, "model.safetensors"))


@contextlib.contextmanager
def megatron_rank(tp: int = 1, pp: int = 1, seed: int = 7):
    """This rank inside the platform's megatron environment, with megatron's parallel state for the
    layout and its RNG seeded; torn down after."""
    import torch.distributed as dist

    from verl.core.platform import get_platform
    from verl.engines.megatron.parallel import (
        destroy_megatron_parallel,
        initialize_megatron_parallel,
        megatron_parallel_dims,
    )
    from verl.engines.megatron.rng import seed_model_parallel

    platform = get_platform()
    with platform.backend_environment("megatron"):
        dims = megatron_parallel_dims(dist.get_world_size(), tp=tp, pp=pp)
        initialize_megatron_parallel(dims)
        from megatron.core import parallel_state as mpu

        seed_model_parallel(seed, platform.device_name, mpu.get_tensor_model_parallel_rank())
        try:
            yield dims
        finally:
            destroy_megatron_parallel()
