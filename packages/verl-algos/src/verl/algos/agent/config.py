"""verl's ``actor_rollout_ref.rollout.multi_turn`` settings, read by the agent loops."""

from __future__ import annotations

from dataclasses import dataclass

TRUNCATE_SIDES = ("left", "right", "middle")
SANITY_CHECK_MODES = ("strict", "ignore_strippable", "disable")


@dataclass
class MultiTurnConfig:
    """Keys and defaults as in verl. The turn limits count as verl counts them: an assistant turn is
    one generation, a user turn is one round of inserted tool (or user) messages; None: unlimited
    (the response length still bounds a trajectory).

    ``tokenization_sanity_check_mode`` is accepted for verl scripts and checked for a valid value; it
    guards verl's sglang path, which re-tokenises the conversation, and there is nothing to check here:
    the response is always built from the model's own tokens plus the template's token deltas.
    ``use_inference_chat_template`` and ``num_repeat_rollouts`` are not implemented yet and are refused
    when set, rather than ignored."""

    enable: bool = False
    max_assistant_turns: int | None = None
    tool_config_path: str | None = None
    max_user_turns: int | None = None
    max_parallel_calls: int = 1
    max_tool_response_length: int = 256
    tool_response_truncate_side: str = "middle"
    interaction_config_path: str | None = None
    use_inference_chat_template: bool = False
    tokenization_sanity_check_mode: str = "strict"
    format: str = "hermes"
    num_repeat_rollouts: int | None = None

    def __post_init__(self) -> None:
        prefix = "actor_rollout_ref.rollout.multi_turn"
        for name in ("max_assistant_turns", "max_user_turns"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{prefix}.{name}={value} must be >= 1 (or null: unlimited)")
        if self.max_parallel_calls < 1:
            raise ValueError(f"{prefix}.max_parallel_calls={self.max_parallel_calls} must be >= 1")
        if self.max_tool_response_length < 1:
            raise ValueError(f"{prefix}.max_tool_response_length={self.max_tool_response_length} must be >= 1")
        if self.tool_response_truncate_side not in TRUNCATE_SIDES:
            raise ValueError(
                f"{prefix}.tool_response_truncate_side={self.tool_response_truncate_side!r}: use one of {TRUNCATE_SIDES}"
            )
        if self.tokenization_sanity_check_mode not in SANITY_CHECK_MODES:
            raise ValueError(
                f"{prefix}.tokenization_sanity_check_mode={self.tokenization_sanity_check_mode!r}: "
                f"use one of {SANITY_CHECK_MODES}"
            )
        unsupported = {
            "use_inference_chat_template": self.use_inference_chat_template,
            "num_repeat_rollouts": self.num_repeat_rollouts is not None,
        }
        for name, is_set in unsupported.items():
            if is_set:
                raise ValueError(f"{prefix}.{name} is not supported yet; leave it at its default")


def truncate_tool_response(text: str, max_length: int, side: str) -> str:
    """verl's character-level cut of a long tool response: "left" keeps the head, "right" the tail,
    "middle" both halves, each with a marker saying text was cut."""
    if len(text) <= max_length:
        return text
    if side == "left":
        return text[:max_length] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-max_length:]
    half = max_length // 2
    return text[:half] + "...(truncated)..." + text[len(text) - half :]
