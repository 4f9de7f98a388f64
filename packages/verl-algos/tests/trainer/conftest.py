"""Fixtures of the trainer tests (the tiny model folder and the Ray session are ``tests/conftest.py``'s)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # algos_test_helpers
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # cli_runs

from algos_test_helpers import write_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def untied_model_dir(tmp_path_factory) -> str:
    return write_tiny_model(str(tmp_path_factory.mktemp("tiny-untied")), tie_word_embeddings=False)


@pytest.fixture(scope="session")
def learning_dir(tmp_path_factory):
    """Where the learning tests keep the SFT warm start they share (``test_learning.warm_start``)."""
    return tmp_path_factory.mktemp("learning")
