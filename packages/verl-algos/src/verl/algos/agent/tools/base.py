"""What a tool is: verl's tool contract (``create`` / ``execute`` / ``calc_reward`` / ``release`` per
trajectory instance), synchronous here because the agent loop runs tools on a thread pool.

A tool is built from one entry of the tool config (``config``: its settings; ``tool_schema``: the
OpenAI function schema the model sees). ``execute`` returns a :class:`ToolResult`; a tool reports a
problem with the call by returning ``ToolResult(text, error=True)`` or by raising, and
:mod:`.execution` turns a raise or a timeout into an error result, so nothing a tool does ends the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl.core.registry import Registry

#: Tool classes by the ``class_name`` a tool config names them with (short names and verl's paths).
TOOL_CLASSES: Registry[type] = Registry("tool class", keys=("class_name",))

#: Seconds a call may take unless the tool's ``config.timeout_s`` says otherwise.
DEFAULT_TOOL_TIMEOUT_S = 30.0


@dataclass
class ToolResult:
    #: What the model sees as the tool's response.
    text: str
    #: The step reward the call earns (verl's ``tool_reward``), summed into the trajectory's reward.
    reward: float = 0.0
    #: The call failed (bad arguments, an exception, a timeout, a failing program): counted as a tool error.
    error: bool = False
    metrics: dict[str, Any] = field(default_factory=dict)


class BaseTool:
    """Subclass and register with ``@TOOL_CLASSES.register(class_name=...)`` (or name the class's import
    path in the tool config). ``config`` keys a tool does not know must raise in ``__init__``."""

    def __init__(self, config: dict[str, Any], tool_schema: dict[str, Any]):
        self.config = dict(config)
        self.tool_schema = tool_schema
        self.name: str = tool_schema["function"]["name"]
        self.parameters: dict[str, Any] = tool_schema["function"].get("parameters") or {"type": "object"}
        self.timeout_s = float(self.config.pop("timeout_s", DEFAULT_TOOL_TIMEOUT_S))
        self.config.pop("type", None)  # verl's "native"/"mcp" marker: every tool here is native

    def create(self, instance_id: str, **create_kwargs: Any) -> None:
        """Start the tool's state for one trajectory (``extra_info.tools_kwargs[name].create_kwargs``)."""

    def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        raise NotImplementedError(f"{type(self).__name__} must implement execute")

    def calc_reward(self, instance_id: str) -> float:
        """The trajectory's reward from this tool's point of view (verl's ``calc_reward``)."""
        return 0.0

    def release(self, instance_id: str) -> None:
        """Drop the trajectory's state."""

    def reject_unknown_config(self, known: set[str]) -> None:
        unknown = sorted(set(self.config) - known)
        if unknown:
            raise ValueError(
                f"tool {self.name!r} ({type(self).__name__}): unknown config keys {unknown}; "
                f"it takes {sorted(known | {'timeout_s', 'type'})}"
            )
