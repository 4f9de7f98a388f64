"""Running a user's code (a tool call, an interaction's reply) with a time limit."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def call_on_own_thread(call: Callable[[], T], timeout_s: float, thread_name: str) -> T:
    """``call()`` on a thread of its own, so that a call that hangs costs only that thread: its value, what
    it raised, or ``concurrent.futures.TimeoutError`` after ``timeout_s`` (the thread is left to finish)."""
    worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=thread_name)
    try:
        return worker.submit(call).result(timeout=timeout_s)
    finally:
        worker.shutdown(wait=False)
