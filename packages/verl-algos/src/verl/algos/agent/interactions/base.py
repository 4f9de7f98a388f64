"""What an interaction is: verl's user simulator (``verl.interactions.base.BaseInteraction``), with verl's
methods per trajectory instance, synchronous here because the agent loop runs them on a thread pool (as
it runs tools).

After a model turn that calls no tool, the agent loop hands the conversation so far to the trajectory's
interaction; :meth:`BaseInteraction.generate_response` answers with verl's four values: whether the
episode ends, the user's reply (inserted as a ``user`` message, out of the loss), the turn's score (the
reward function sees every turn's score as ``extra_info["turn_scores"]``), and extra data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl.core.registry import Registry

#: Interaction classes by the ``class_name`` an interaction config names them with (short names and verl's paths).
INTERACTION_CLASSES: Registry[type] = Registry("interaction class", keys=("class_name",))

#: Seconds a reply may take unless the interaction's ``config.timeout_s`` says otherwise.
DEFAULT_INTERACTION_TIMEOUT_S = 30.0


@dataclass
class InteractionReply:
    """One user turn: verl's ``(should_terminate_sequence, response_content, current_turn_score, additional_data)``."""

    terminate: bool
    text: str
    score: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: The interaction raised or timed out: the trajectory ends here and the failure is counted.
    error: str | None = None


class BaseInteraction:
    """Subclass and register with ``@INTERACTION_CLASSES.register(class_name=...)`` (or name the class's
    import path in the interaction config). ``config`` is the entry's ``config`` mapping plus its ``name``."""

    def __init__(self, config: dict[str, Any]):
        self.config = dict(config)
        self.name: str = self.config.get("name", "interaction_agent")
        self.timeout_s = float(self.config.pop("timeout_s", DEFAULT_INTERACTION_TIMEOUT_S))

    def start_interaction(self, instance_id: str, **interaction_kwargs: Any) -> str:
        """Start one trajectory's state (the data row's ``extra_info.interaction_kwargs``, ``name`` included)."""
        return instance_id

    def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **interaction_kwargs: Any
    ) -> tuple[bool, str, float | None, dict[str, Any]]:
        raise NotImplementedError(f"{type(self).__name__} must implement generate_response")

    def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        """Drop the trajectory's state."""
