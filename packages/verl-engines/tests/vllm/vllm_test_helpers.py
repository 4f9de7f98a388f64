"""Tiny model folders vLLM can load (a real tokenizer, config, generation config and safetensors),
built at test time with nothing downloaded, and prompt batches in the rollout input layout.

Importable from the test files as ``vllm_test_helpers`` (conftest.py puts this folder on sys.path).
"""

from __future__ import annotations

from verl_test_models import bpe_tokenizer, write_causal_lm

from verl.core.engine import SamplingParams

KV_CACHE_BYTES = 32 << 20  # ample for the tiny models' few short sequences
CORPUS = [
    "What is 12+7? Answer with a number.",
    "12 + 7 = 19. The answer is 19.",
    "Tom has 5 apples. He buys 3 bags with 4 apples each. How many apples does Tom have now?",
    "The cat sat on the mat and the dog ran to the park.",
]
TEXTS = ["What is 12+7?", "Tom has 5 apples.", "The answer is", "the cat"]


def build_tokenizer():
    """Byte-level BPE (any text round-trips) with ChatML special tokens; eos <|im_end|>, pad <|endoftext|>."""
    return bpe_tokenizer(CORPUS, vocab_size=384, padding_side="left")


def build_model(path: str, arch: str = "qwen2", tie: bool = False, seed: int = 0) -> str:
    """A random 2-layer causal LM (hidden 64, head_dim 32, GQA) whose weights are large enough that
    every one of them changes the outputs; saved with its tokenizer to ``path``."""
    return write_causal_lm(
        path,
        build_tokenizer(),
        arch=arch,
        hidden_size=64,
        intermediate_size=128,
        num_heads=2,
        num_kv_heads=1,
        tie=tie,
        seed=seed,
        init_std=0.2,
    )


def prompts_batch(model_path: str, texts=TEXTS):
    """Left-padded prompts with a non-tensor field and meta info, as the trainer sends them."""
    from transformers import AutoTokenizer

    from verl.core.protocol import DataProto

    tok = AutoTokenizer.from_pretrained(model_path)
    tok.padding_side = "left"
    enc = tok(list(texts), return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    return DataProto.from_dict(
        {"input_ids": enc["input_ids"], "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)},
        non_tensors={"text": list(texts)},
        meta_info={"step": 3},
    )


def vllm_config(model_path: str, kv_cache_bytes: int | None = KV_CACHE_BYTES, **overrides):
    """The engine's config for the tests, with an explicit KV cache size unless ``kv_cache_bytes=None``
    (then the engine sizes it from ``prompts_per_generation`` and ``n``)."""
    from verl.engines.rollout.vllm import VLLMRolloutConfig

    values = dict(model_path=model_path, prompt_length=32, response_length=32)
    explicit = {"kv_cache_memory_bytes": kv_cache_bytes} if kv_cache_bytes is not None else {}
    values["engine_kwargs"] = {**explicit, **overrides.pop("engine_kwargs", {})}
    values.update(overrides)
    return VLLMRolloutConfig(**values)


#: Greedy decoding of 10 tokens: what the weight-sync tests compare between engines.
GREEDY = SamplingParams(do_sample=False, max_new_tokens=10)


def token_mean_loss(outputs, micro):
    """A policy-gradient loss over the response tokens, scaled for the global batch: one training step that
    moves the weights enough to change greedy output."""
    mask = micro.batch["response_mask"].float()
    loss = -(outputs["log_probs"] * micro.batch["advantages"] * mask).sum() / micro.meta_info["global_response_tokens"]
    return loss, {}
