"""Seeding the host's random number generators (Python's ``random`` and numpy's global one).

torch's generators are the platform's business (``get_platform().manual_seed``); these two are not tied
to a device, and user code run by the workers or the driver (reward functions, data transforms) draws
from them, so a run is reproducible only if they are seeded too.
"""

from __future__ import annotations

import random

import numpy as np


def seed_host_rngs(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)  # numpy takes a 32-bit seed
