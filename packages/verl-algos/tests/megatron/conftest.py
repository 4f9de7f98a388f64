"""The PPO workers on the Megatron engine (marked ``megatron``; the ``tests-megatron`` nox session installs
megatron-core): short ``verl train`` runs on a tiny model over two CPU workers (the ``tiny_model_dir`` and
``ray_session`` fixtures are ``tests/conftest.py``'s). Without megatron-core these files are not collected."""

from __future__ import annotations

import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # algos_test_helpers
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "trainer"))  # cli_runs

if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
    collect_ignore_glob = ["test_*.py"]
