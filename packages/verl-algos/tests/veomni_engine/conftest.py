"""The PPO workers on the VeOmni engine (marked ``veomni``; the ``tests-veomni`` nox session installs VeOmni):
short ``verl train`` runs on a tiny model over two CPU workers (the ``tiny_model_dir`` and ``ray_session``
fixtures are ``tests/conftest.py``'s). Without VeOmni these files are not collected."""

from __future__ import annotations

import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # algos_test_helpers
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "trainer"))  # cli_runs

if importlib.util.find_spec("veomni") is None or importlib.util.find_spec("veomni.models") is None:
    collect_ignore_glob = ["test_*.py"]
