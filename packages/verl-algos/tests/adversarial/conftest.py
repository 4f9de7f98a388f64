"""Fixtures of the adversarial tests: the tiny real model (as in the trainer tests) and the helpers of
``tests/`` and ``tests/trainer/`` on the path."""

from __future__ import annotations

import os
import sys

import pytest

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _TESTS)
sys.path.insert(0, os.path.join(_TESTS, "trainer"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bad_inputs_table

from algos_test_helpers import write_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> str:
    return write_tiny_model(str(tmp_path_factory.mktemp("tiny model with spaces")))
