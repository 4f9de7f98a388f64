"""Running vLLM inside the training worker's process (the hybrid engine's colocation).

vLLM normally starts its engine core in a child process. Here it must not: the weights stream from the
training engine's per-tensor iterator straight into vLLM's model, and on CPU that works only through
``collective_rpc("reload_weights", kwargs={"weights_iterator": ...})`` when both live in one process
(in multi-process mode tensors in RPC arguments arrive as lists). ``VLLM_ENABLE_V1_MULTIPROCESSING=0``
selects vLLM's in-process engine; it is set before vLLM is imported.

Building an engine in-process has side effects on the process that vLLM, as a server, does not care
about but a trainer does; :func:`preserved_process_state` undoes them:

- it seeds Python's, NumPy's and torch's global random generators with the engine seed;
- on CPU it replaces ``torch.set_num_threads`` by a function that only warns (vLLM pins its OpenMP
  threads), and on GPUs lowers torch's intra-op thread count to 1;
- on CPU it sets ``LOCAL_WORLD_SIZE`` to its tensor-parallel size, which is the controller's count of
  this node's worker processes here (``Worker.local_world_size`` reads it).

Left as vLLM makes it (documented, not undone): on CPU, vLLM binds the process's memory allocations
to the NUMA node of its first allowed core. On a single-socket machine this changes nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
from collections.abc import Iterator

import numpy as np
import torch

logger = logging.getLogger(__name__)

IN_PROCESS_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
#: Environment variables of the controller's that vLLM rewrites while it builds an engine.
RESTORED_ENV = ("LOCAL_WORLD_SIZE",)


def set_in_process_environment() -> None:
    """Environment vLLM must see before it is imported (and again before an engine is built)."""
    for key, value in IN_PROCESS_ENV.items():
        previous = os.environ.get(key)
        if previous not in (None, value):
            logger.warning(
                "%s=%s is overridden with %s: the vllm rollout runs vLLM inside the training process",
                key,
                previous,
                value,
            )
        os.environ[key] = value


@contextlib.contextmanager
def preserved_process_state(device_type: str, device_count: int) -> Iterator[None]:
    """Restore the random generators, torch's thread count, ``torch.set_num_threads`` and
    :data:`RESTORED_ENV` after vLLM builds its engine in this process."""
    set_num_threads = torch.set_num_threads
    threads = torch.get_num_threads()
    py_state, np_state = random.getstate(), np.random.get_state()
    env = {key: os.environ.get(key) for key in RESTORED_ENV}
    devices = list(range(device_count)) if device_type != "cpu" else []
    with torch.random.fork_rng(devices=devices, device_type=device_type):
        try:
            yield
        finally:
            torch.set_num_threads = set_num_threads
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            random.setstate(py_state)
            np.random.set_state(np_state)
            for key, value in env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
