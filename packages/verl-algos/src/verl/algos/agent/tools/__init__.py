"""Tools an agent loop can call: the contract (:mod:`.base`), verl's YAML tool config (:mod:`.config`),
running calls safely (:mod:`.execution`) and the built-ins (calculator, code interpreter, gsm8k)."""

from verl.algos.agent.tools.base import TOOL_CLASSES, BaseTool, ToolResult
from verl.algos.agent.tools.config import build_tools, load_tools
from verl.algos.agent.tools.execution import ToolExecutor

__all__ = ["TOOL_CLASSES", "BaseTool", "ToolExecutor", "ToolResult", "build_tools", "load_tools"]
