"""One trajectory's state while an agent loop steps it, and what it hands to the trainer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class AgentSample:
    """One prompt as the data rows give it: chat ``messages``, the row's ``agent_name``, the
    ``extra_info.tools_kwargs`` (per tool: ``create_kwargs``) and ``extra_info.interaction_kwargs``
    (``name``: which interaction replies between turns, and its arguments)."""

    messages: list[dict[str, Any]]
    agent_name: str = "single_turn_agent"
    tools_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    interaction_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Trajectory:
    """``response_ids`` = model tokens and inserted tokens in order; ``response_mask`` 1 on the model's,
    ``response_logprobs`` the rollout's log-prob of each model token (0 on inserted ones)."""

    trajectory_id: str
    sample: AgentSample
    prompt_ids: list[int]
    response_limit: int
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    assistant_turns: int = 0
    user_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_latency_s: list[float] = field(default_factory=list)
    #: Step rewards of the tool calls (verl's tool_reward), summed.
    tool_reward: float = 0.0
    #: The conversation as messages (the prompt's, then each turn decoded): what an interaction reads.
    messages: list[dict[str, Any]] = field(default_factory=list)
    #: The interaction replying to this trajectory (None: none), its replies, their scores and failures.
    interaction: Any = None
    interaction_turns: int = 0
    turn_scores: list[float] = field(default_factory=list)
    interaction_errors: int = 0
    done: bool = False
    #: Why the trajectory ended: "eos" (a turn without tool calls), "length" (the response length is
    #: used up), "no_eos" (a turn stopped without its end-of-turn token, e.g. at a stop string),
    #: "max_assistant_turns", "max_user_turns", "interaction_done" (the interaction ended the episode),
    #: "interaction_error" (the interaction raised or timed out).
    stop_reason: str = ""

    @property
    def remaining(self) -> int:
        return self.response_limit - len(self.response_ids)

    def context_ids(self) -> list[int]:
        """What the model is conditioned on for its next turn."""
        return self.prompt_ids + self.response_ids

    def add_model_tokens(self, ids: list[int], logprobs: list[float]) -> None:
        self.response_ids += ids
        self.response_mask += [1] * len(ids)
        self.response_logprobs += logprobs

    def add_inserted_tokens(self, ids: list[int]) -> None:
        self.response_ids += ids
        self.response_mask += [0] * len(ids)
        self.response_logprobs += [0.0] * len(ids)

    def finish(self, reason: str) -> None:
        self.done = True
        self.stop_reason = reason
