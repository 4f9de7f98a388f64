"""Calling a reward function on many samples at once, each call bounded by a timeout.

Python cannot stop a running function, so a call past its time is abandoned (its daemon thread may
finish later; its result is ignored) and counts as a :class:`RewardTimeout`. Calls run ``concurrency``
at a time, each timed from its own start, so a batch of slow samples costs about one timeout per
``concurrency`` of them, not one per sample. And when the first ``concurrency`` calls to end all ran
out of time, and none returned, the function is taken as hung for this batch (a dead verifier, a
deadlock): the calls not yet started are not made and count as timeouts too. A batch whose every
call hangs therefore ends in about one timeout.

Calls run in threads: a reward function used with a timeout must be thread-safe.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from verl.algos.rewards.failures import RewardTimeout

#: How many calls of a reward function run at once when it has a timeout.
DEFAULT_CONCURRENCY = 8


def call_all(calls: list[Callable[[], Any]], timeout_s: float, concurrency: int, name: str) -> list[tuple[bool, Any]]:
    """``(True, value)`` or ``(False, exception)`` per call, in order. ``name``: the function, for
    the timeout messages."""
    if concurrency < 1:
        raise ValueError(f"concurrency={concurrency} must be at least 1")
    results: list[tuple[bool, Any] | None] = [None] * len(calls)
    finished: queue.Queue = queue.Queue()
    running: dict[int, float] = {}  # call index -> deadline
    started = timed_out = returned = 0
    width = min(concurrency, len(calls))
    hung = False

    def start(index: int) -> None:
        def target() -> None:
            try:
                finished.put((index, True, calls[index]()))
            except BaseException as e:  # handed to the caller, which decides what it means
                finished.put((index, False, e))

        running[index] = time.monotonic() + timeout_s
        threading.Thread(target=target, name="verl-reward-call", daemon=True).start()

    while started < len(calls) or running:
        # While calls have timed out and none has returned, wait for the rest of the first round
        # before starting more: if it all times out, the function is hung.
        waiting_for_round = returned == 0 and timed_out > 0
        while not hung and not waiting_for_round and started < len(calls) and len(running) < width:
            start(started)
            started += 1
        if not running:
            break
        try:
            index, ok, value = finished.get(timeout=max(0.0, min(running.values()) - time.monotonic()))
        except queue.Empty:
            now = time.monotonic()
            for index, deadline in list(running.items()):
                if deadline <= now:
                    del running[index]
                    timed_out += 1
                    results[index] = (False, RewardTimeout(f"reward function {name} took longer than {timeout_s}s"))
            hung = hung or (returned == 0 and timed_out >= width)
            continue
        if index in running:  # else it was already counted as a timeout
            del running[index]
            returned += 1
            results[index] = (ok, value)
    for index in range(started, len(calls)):
        results[index] = (
            False,
            RewardTimeout(
                f"reward function {name} was not called: the first {width} calls of this batch all took longer than "
                f"{timeout_s}s and none returned, so it is taken as hung"
            ),
        )
    return results  # type: ignore[return-value]
