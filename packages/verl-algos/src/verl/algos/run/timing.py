"""Wall-clock timing of a run's phases, reported as ``timing_s/<phase>`` metrics (verl's names)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


@contextlib.contextmanager
def timer(name: str, metrics: dict[str, float]) -> Iterator[None]:
    """Add the block's wall time to ``metrics["timing_s/<name>"]``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        key = f"timing_s/{name}"
        metrics[key] = metrics.get(key, 0.0) + time.perf_counter() - start
