"""Fixtures of the verl-algos tests; the helpers themselves live in algos_test_helpers.py."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from algos_test_helpers import build_tiny_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def tokenizer_without_template():
    return build_tiny_tokenizer(with_chat_template=False)
