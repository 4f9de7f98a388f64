"""The VeOmni engine tests (marked ``veomni``; the ``tests-veomni`` nox session installs VeOmni and the
transformers release it wants). Spawned ranks import ``veomni_programs`` from this folder (spawn copies
``sys.path``). Without VeOmni these files are not collected at all."""

from __future__ import annotations

import importlib.util
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

# (this folder is not named "veomni": on sys.path it would pass for the package as a namespace package)
if importlib.util.find_spec("veomni") is None or importlib.util.find_spec("veomni.models") is None:
    collect_ignore_glob = ["test_*.py"]
