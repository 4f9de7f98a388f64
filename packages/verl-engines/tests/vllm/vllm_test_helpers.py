"""Tiny model folders vLLM can load (a real tokenizer, config, generation config and safetensors),
built at test time with nothing downloaded, and prompt batches in the rollout input layout.

Importable from the test files as ``vllm_test_helpers`` (conftest.py puts this folder on sys.path).
"""

from __future__ import annotations

import os

import torch

KV_CACHE_BYTES = 32 << 20  # ample for the tiny models' few short sequences
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = [
    "What is 12+7? Answer with a number.",
    "12 + 7 = 19. The answer is 19.",
    "Tom has 5 apples. He buys 3 bags with 4 apples each. How many apples does Tom have now?",
    "The cat sat on the mat and the dog ran to the park.",
]
TEXTS = ["What is 12+7?", "Tom has 5 apples.", "The answer is", "the cat"]


def build_tokenizer():
    """Byte-level BPE (any text round-trips) with ChatML special tokens; eos <|im_end|>, pad <|endoftext|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
        chat_template=CHATML,
        padding_side="left",
    )


def build_model(path: str, arch: str = "qwen2", tie: bool = False, seed: int = 0) -> str:
    """A random 2-layer causal LM (hidden 64, head_dim 32, GQA) whose weights are large enough that
    every one of them changes the outputs; saved with its tokenizer to ``path``."""
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, Qwen2Config

    tokenizer = build_tokenizer()
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        tie_word_embeddings=tie,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    config = Qwen2Config(**common) if arch == "qwen2" else LlamaConfig(**common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


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
