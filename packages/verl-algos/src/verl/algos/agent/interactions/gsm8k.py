"""verl's gsm8k interaction (``verl.interactions.gsm8k_interaction.Gsm8kInteraction``), with its semantics:
after each answer it scores the model's last message against the ground truth (strict ``#### <answer>``
extraction, 1.0 or 0.0); a right answer ends the episode ("Your response is correct!"), a wrong one asks
the model to try again.

``interaction_kwargs``: ``{"name": "gsm8k", "ground_truth": "72"}`` (from the data row's ``extra_info``).
"""

from __future__ import annotations

from typing import Any

from verl.algos.agent.interactions.base import INTERACTION_CLASSES, BaseInteraction
from verl.algos.rewards import gsm8k

CORRECT = "Your response is correct!"
INCORRECT = "Your response is incorrect! You need to reflect on your answer and try again."


@INTERACTION_CLASSES.register(class_name=["gsm8k", "verl.interactions.gsm8k_interaction.Gsm8kInteraction"])
class Gsm8kInteraction(BaseInteraction):
    def __init__(self, config: dict[str, Any]):
        super().__init__(config)
        self._instances: dict[str, dict[str, Any]] = {}

    def start_interaction(self, instance_id: str, ground_truth: Any = None, **interaction_kwargs: Any) -> str:
        if ground_truth is None:
            raise ValueError(
                f"interaction {self.name!r} needs a ground_truth: give it in the data row's "
                "extra_info.interaction_kwargs.ground_truth"
            )
        self._instances[instance_id] = {"response": "", "ground_truth": str(ground_truth)}
        return instance_id

    def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **interaction_kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        last = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), "")
        self._instances[instance_id]["response"] = last
        reward = self.calculate_score(instance_id)
        if reward == 1.0:
            return True, CORRECT, reward, {}
        return False, INCORRECT, reward, {}

    def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        state = self._instances[instance_id]
        return gsm8k.compute_score(state["response"], state["ground_truth"], method="strict")

    def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        self._instances.pop(instance_id, None)
