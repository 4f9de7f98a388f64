"""The PPO workers on the VeOmni engine (marked ``veomni``; the ``tests-veomni`` nox session installs VeOmni):
short ``verl train`` runs on a tiny model over two CPU workers. Without VeOmni these files are not collected."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # algos_test_helpers
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "trainer"))  # cli_runs

if importlib.util.find_spec("veomni") is None or importlib.util.find_spec("veomni.models") is None:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> str:
    from algos_test_helpers import write_tiny_model

    return write_tiny_model(str(tmp_path_factory.mktemp("tiny-model")))


@pytest.fixture(scope="module")
def ray_session():
    import ray

    from verl.core.controller import init_ray

    init_ray(num_cpus=4)
    yield
    ray.shutdown()
