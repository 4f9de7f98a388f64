"""Fixtures of the verl-algos tests; the helpers themselves live in algos_test_helpers.py."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from algos_test_helpers import build_tiny_tokenizer, write_tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def tokenizer_without_template():
    return build_tiny_tokenizer(with_chat_template=False)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> str:
    """A tiny real model folder (config, weights, tokenizer) for the trainer-level tests of every session."""
    return write_tiny_model(str(tmp_path_factory.mktemp("tiny-model")))


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray for the module (4 logical CPUs: two worker groups of two fit)."""
    import ray

    from verl.core.controller import init_ray

    init_ray(num_cpus=4)
    yield
    ray.shutdown()
