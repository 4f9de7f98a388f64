"""The megatron tests (marked ``megatron``; the ``tests-megatron`` nox session installs megatron-core).

Spawned ranks import ``megatron_programs`` from this folder (spawn copies ``sys.path``). Without
megatron-core these files are not collected at all.
"""

from __future__ import annotations

import importlib.util
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
    collect_ignore_glob = ["test_*.py"]
