"""A Python code interpreter tool: runs the model's program in the code reward's sandbox (the same
isolation and limits, :mod:`verl.algos.rewards.sandbox`) and answers with what it printed.

Config: the :class:`SandboxLimits` fields (``cpu_time_s``, ``wall_time_s``, ``memory_mb``, ...). The
tool's own timeout defaults to the sandbox's wall time plus a margin: the sandbox enforces the limit
and returns only once every process of the run is gone.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from verl.algos.agent.tools.base import TOOL_CLASSES, BaseTool, ToolResult
from verl.algos.rewards.sandbox import RunStatus, Sandbox, SandboxLimits

_TIMEOUT_MARGIN_S = 10.0


@TOOL_CLASSES.register(class_name=["code_interpreter", "verl.algos.agent.tools.code_interpreter.CodeInterpreterTool"])
class CodeInterpreterTool(BaseTool):
    """Schema parameters: ``{"code": string}``; stdin is empty."""

    def __init__(self, config: dict[str, Any], tool_schema: dict[str, Any]):
        timeout_given = "timeout_s" in config
        super().__init__(config, tool_schema)
        self.reject_unknown_config({f.name for f in dataclasses.fields(SandboxLimits)})
        self.sandbox = Sandbox(SandboxLimits(**self.config))
        if not timeout_given:
            self.timeout_s = self.sandbox.limits.wall_time_s + _TIMEOUT_MARGIN_S

    def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        result = self.sandbox.run(str(arguments["code"]))
        if result.status is RunStatus.COMPLETED:
            return ToolResult(result.stdout if result.stdout else "(no output)")
        text = f"Error: the program ended with {result.status.value}"
        text += f" ({result.reason})." if result.reason else "."
        if result.stdout:
            text += f"\nstdout:\n{result.stdout}"
        if result.stderr:
            text += f"\nstderr:\n{result.stderr}"
        return ToolResult(text, error=True, metrics={"status": result.status.value})
