"""Running interactions so that a failing user simulator ends its own trajectory, not the step: a reply
that raises, times out or is not verl's four values becomes an :class:`InteractionReply` with ``error``
set, which ends the trajectory and is counted. Replies run on a thread pool, as tool calls do."""

from __future__ import annotations

import concurrent.futures
import functools
import logging
from typing import Any

from verl.algos.agent.interactions.base import BaseInteraction, InteractionReply
from verl.algos.agent.own_thread import call_on_own_thread

logger = logging.getLogger(__name__)


class InteractionRunner:
    def __init__(self, interactions: dict[str, BaseInteraction], max_workers: int = 8):
        self.interactions = interactions
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="verl-user")

    def resolve(self, interaction_kwargs: dict[str, Any]) -> BaseInteraction:
        """The interaction a data row's ``extra_info.interaction_kwargs`` names."""
        name = interaction_kwargs.get("name")
        if name is None:
            raise ValueError("extra_info.interaction_kwargs needs a 'name' (which interaction of the config to run)")
        if name not in self.interactions:
            known = ", ".join(sorted(self.interactions)) or "none"
            raise ValueError(
                f"extra_info.interaction_kwargs.name={name!r} is not in the interaction config (it has: {known})"
            )
        return self.interactions[name]

    def submit(
        self, interaction: BaseInteraction, instance_id: str, messages: list[dict[str, Any]], kwargs: dict[str, Any]
    ) -> concurrent.futures.Future:
        """The future's ``result()`` is the :class:`InteractionReply` (never raises)."""
        return self._pool.submit(self._reply, interaction, instance_id, list(messages), kwargs)

    @staticmethod
    def _reply(
        interaction: BaseInteraction, instance_id: str, messages: list[dict[str, Any]], kwargs: dict[str, Any]
    ) -> InteractionReply:
        reply = functools.partial(interaction.generate_response, instance_id, messages, **kwargs)
        try:
            terminate, text, score, extra = call_on_own_thread(
                reply, interaction.timeout_s, f"verl-user-{interaction.name}"
            )
            return InteractionReply(
                bool(terminate), str(text), None if score is None else float(score), dict(extra or {})
            )
        except concurrent.futures.TimeoutError:
            error = f"interaction {interaction.name!r} did not reply within {interaction.timeout_s:g} s"
        except Exception as e:
            error = f"interaction {interaction.name!r} failed: {type(e).__name__}: {e}"
        logger.warning("%s; the trajectory ends here", error)
        return InteractionReply(True, "", None, {}, error=error)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
