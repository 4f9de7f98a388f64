"""Fixtures of the trainer tests: a tiny real model folder and one Ray session for the module."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from algos_test_helpers import build_tiny_tokenizer  # noqa: E402


def write_tiny_model(path: str, tie_word_embeddings: bool = True, seed: int = 0) -> str:
    """A 2-layer Qwen2 (hidden 64) with a 400-token byte-level BPE tokenizer and a ChatML template."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tiny_tokenizer()
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=tie_word_embeddings,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    Qwen2ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> str:
    return write_tiny_model(str(tmp_path_factory.mktemp("tiny-model")))


@pytest.fixture(scope="module")
def untied_model_dir(tmp_path_factory) -> str:
    return write_tiny_model(str(tmp_path_factory.mktemp("tiny-untied")), tie_word_embeddings=False)


@pytest.fixture(scope="module")
def ray_session():
    import ray

    from verl.core.controller import init_ray

    init_ray(num_cpus=4)
    yield
    ray.shutdown()
