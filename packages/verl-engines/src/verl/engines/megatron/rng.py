"""megatron's RNG tracker for the platform in use.

megatron keeps named RNG states (data-parallel, tensor-parallel, expert-parallel) in a tracker whose
``fork()`` runs in every attention forward, even with dropout 0. Its tracker stores and swaps *CUDA*
generator states; on the CPU platform :class:`CPURNGStatesTracker` does the same with the CPU generator,
and :func:`seed_model_parallel` seeds it the way ``model_parallel_cuda_manual_seed`` does (per TP rank),
so dropout masks would be drawn from the same per-rank streams as on GPUs.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

#: megatron's offsets: the tensor-parallel stream is ``seed + 2718 + tp_rank``, the expert one
#: ``seed + 1024 + 100 * ep_rank + etp_rank`` (``tensor_parallel/random.py``).
TP_SEED_OFFSET = 2718
EXPERT_SEED_OFFSET = 1024


def _tracker_base():
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker

    return CudaRNGStatesTracker


def cpu_tracker_class():
    """The CPU tracker class (built on first use: megatron-core is an optional dependency)."""
    global _CPU_TRACKER
    if _CPU_TRACKER is None:
        base: Any = _tracker_base()  # megatron-core may be untyped here

        class CPURNGStatesTracker(base):
            """megatron's tracker over the CPU generator's states instead of CUDA's."""

            def add(self, name, seed):
                self._is_initialized = True
                if seed in self.seeds_:
                    raise ValueError(f"seed {seed} already exists")
                if name in self.states_:
                    raise ValueError(f"rng state {name} already exists")
                self.seeds_.add(seed)
                self.states_[name] = torch.Generator().manual_seed(seed).get_state()

            @contextlib.contextmanager
            def fork(self, name=None):
                from megatron.core.tensor_parallel.random import _MODEL_PARALLEL_RNG_TRACKER_NAME

                name = name or _MODEL_PARALLEL_RNG_TRACKER_NAME
                if name not in self.states_:
                    raise KeyError(f"rng state {name} is not added")
                outer = torch.get_rng_state()
                torch.set_rng_state(self.states_[name])
                try:
                    yield
                finally:
                    self.states_[name] = torch.get_rng_state()
                    torch.set_rng_state(outer)

        _CPU_TRACKER = CPURNGStatesTracker
    return _CPU_TRACKER


_CPU_TRACKER: type | None = None


def seed_model_parallel(seed: int, device_name: str, tp_rank: int, ep_rank: int = 0, etp_rank: int = 0) -> None:
    """Seed torch and megatron's tracker for this rank: ``model_parallel_cuda_manual_seed`` on
    accelerators; on the CPU the same streams in a :class:`CPURNGStatesTracker`."""
    from megatron.core.tensor_parallel import random as mpu_random

    if device_name != "cpu":
        torch.manual_seed(seed)
        mpu_random.model_parallel_cuda_manual_seed(
            seed, tp_rank=tp_rank, ep_rank=ep_rank, etp_rank=etp_rank, force_reset_rng=True
        )
        return
    tracker = cpu_tracker_class()()
    # Installed as megatron's tracker; get_cuda_rng_tracker() then returns it (already "initialized").
    mpu_random._CUDA_RNG_STATE_TRACKER = tracker
    mpu_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    torch.manual_seed(seed)  # the default stream, as torch.cuda.manual_seed(seed) is on GPUs
    tracker.add(mpu_random.get_data_parallel_rng_tracker_name(), seed)
    tracker.add(mpu_random._MODEL_PARALLEL_RNG_TRACKER_NAME, seed + TP_SEED_OFFSET + tp_rank)
    tracker.add(mpu_random.get_expert_parallel_rng_tracker_name(), seed + EXPERT_SEED_OFFSET + 100 * ep_rank + etp_rank)
