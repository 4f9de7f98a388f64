"""Request-level generation: token-in/token-out requests that join and leave a running engine one by one.

A batch call (:meth:`RolloutEngine.generate`) returns when its slowest row is done. An engine with
continuous batching (vLLM) can instead take a new request while others are mid-decode, and hand each
one back the step it finishes. Agent loops use that: a trajectory whose tool call has returned starts
its next turn at once, alongside the turns of the others, instead of waiting for a whole round.

An engine offers it with ``supports_request_stream`` and :meth:`RolloutEngine.request_stream`. A stream
is used by one thread, from ``with engine.request_stream() as stream:``; leaving the block aborts what is
still in flight, so a failing caller leaves no request behind in the engine.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass

from verl.core.engine.rollout import SamplingParams

#: Seeds stay well inside a signed 64-bit integer (engines pass them to ``torch.Generator.manual_seed``).
SEED_MODULUS = 2**62


def derive_seed(*parts: object) -> int:
    """A request's own seed from ``parts`` (a run's seed, a trajectory, a turn, a rank, ...): a hash, so that
    no two tuples of parts share a random stream."""
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % SEED_MODULUS


@dataclass(frozen=True)
class FinishedRequest:
    """One request's generated ``token_ids`` (eos included when it stopped there) and, when asked, the
    log-prob of each; ``finish_reason`` is "stop" (eos or a stop string) or "length"."""

    request_id: str
    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str


class RequestStream(ABC):
    """Requests in flight on one engine (see the module docstring)."""

    @abstractmethod
    def submit(self, request_id: str, prompt_ids: list[int], sampling: SamplingParams) -> None:
        """Start generating for ``prompt_ids`` (one completion: ``sampling.n`` must be 1). ``sampling.seed``
        is this request's own; ``request_id`` must not be in flight already."""

    @abstractmethod
    def step(self) -> list[FinishedRequest]:
        """Advance every request in flight by one engine step; the requests that finished in it."""

    @property
    @abstractmethod
    def in_flight(self) -> int:
        """Requests submitted and not yet returned by :meth:`step`."""

    @abstractmethod
    def abort(self) -> None:
        """Drop every request in flight."""

    def __enter__(self) -> RequestStream:
        return self

    def __exit__(self, *exc_info) -> None:
        if self.in_flight:
            self.abort()
