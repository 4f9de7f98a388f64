"""Fixtures of the engine tests: tiny models built at test time, and a one-process gloo group."""

from __future__ import annotations

import os
import sys

import pytest

# Spawned ranks unpickle helpers by module name: make engine_helpers importable (spawn copies sys.path).
sys.path.insert(0, os.path.dirname(__file__))

from engine_helpers import build_tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """Qwen2 architecture, untied head, hidden 32, 2 layers, vocab 96, with a word-level tokenizer."""
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny_qwen2")), arch="qwen2", tie=False)


@pytest.fixture(scope="session")
def tiny_tied_model(tmp_path_factory) -> str:
    """Llama architecture with tied input/output embeddings."""
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny_llama_tied")), arch="llama", tie=True, seed=1)


@pytest.fixture(scope="module")
def one_process_group():
    """A world-size-1 gloo group in the test process (what engines start when used standalone),
    torn down after the module so other modules can start their own."""
    import torch
    import torch.distributed as dist

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
    torch.set_num_threads(threads)
