"""verl's gsm8k answer-checking tool (``verl.tools.gsm8k_tool.Gsm8kTool``), with its semantics: the model
submits an answer; the tool scores it against the trajectory's ground truth (flexible extraction, 1.0
or 0.0) and answers ``Current parsed answer='...' reward=...``. A submission that does not improve on
the best so far earns a step reward of -0.05 (0.0 otherwise); ``calc_reward`` is the latest score.

``create_kwargs``: ``{"ground_truth": "72"}`` (from ``extra_info.tools_kwargs.calc_gsm8k_reward``).
"""

from __future__ import annotations

from typing import Any

from verl.algos.agent.tools.base import TOOL_CLASSES, BaseTool, ToolResult
from verl.algos.rewards import gsm8k

_NO_IMPROVEMENT_PENALTY = -0.05


@TOOL_CLASSES.register(class_name=["gsm8k", "verl.tools.gsm8k_tool.Gsm8kTool"])
class Gsm8kTool(BaseTool):
    def __init__(self, config: dict[str, Any], tool_schema: dict[str, Any]):
        super().__init__(config, tool_schema)
        self.reject_unknown_config(set())
        self._instances: dict[str, dict[str, Any]] = {}

    def create(self, instance_id: str, ground_truth: Any = None, **create_kwargs: Any) -> None:
        if ground_truth is None:
            raise ValueError(
                f"tool {self.name!r} needs a ground_truth: give it in the data row's "
                f"extra_info.tools_kwargs.{self.name}.create_kwargs.ground_truth"
            )
        self._instances[instance_id] = {"response": "", "ground_truth": str(ground_truth), "reward": 0.0}

    def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        state = self._instances[instance_id]
        answer = str(arguments.get("answer", ""))
        state["response"] = answer if answer.startswith("#### ") else "#### " + answer
        reward = self.calc_reward(instance_id)
        step_reward = 0.0 if reward > state["reward"] else _NO_IMPROVEMENT_PENALTY
        state["reward"] = reward
        return ToolResult(f"Current parsed {answer=} {reward=}", reward=step_reward)

    def calc_reward(self, instance_id: str) -> float:
        state = self._instances[instance_id]
        return gsm8k.compute_score(state["response"], state["ground_truth"], method="flexible")

    def release(self, instance_id: str) -> None:
        self._instances.pop(instance_id, None)
