"""Running tool calls so that nothing ends the step: an unknown tool, arguments that do not match the
tool's JSON schema, an exception and a timeout each become an error :class:`ToolResult` whose text the
model sees. Calls run on a thread pool (a trajectory's parallel calls, and many trajectories, at once).
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import time
from typing import Any

from jsonschema import Draft7Validator

from verl.algos.agent.own_thread import call_on_own_thread
from verl.algos.agent.tool_parsers import ToolCall
from verl.algos.agent.tools.base import BaseTool, ToolResult

logger = logging.getLogger(__name__)


class ToolExecutor:
    def __init__(self, tools: dict[str, BaseTool], max_workers: int = 8):
        self.tools = tools
        self._validators = {name: Draft7Validator(tool.parameters) for name, tool in tools.items()}
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="verl-tool")

    def submit(self, instance_id: str, call: ToolCall) -> concurrent.futures.Future:
        """Start ``call``; the future's ``result()`` is the :class:`ToolResult` (never raises)."""
        problem = self._check(call)
        if problem is not None:
            done: concurrent.futures.Future = concurrent.futures.Future()
            done.set_result(problem)
            return done
        return self._pool.submit(self._run_with_timeout, self.tools[call.name], instance_id, call.arguments)

    def run(self, instance_id: str, calls: list[ToolCall]) -> list[ToolResult]:
        """Run ``calls`` concurrently; results in call order."""
        return [future.result() for future in [self.submit(instance_id, call) for call in calls]]

    def _check(self, call: ToolCall) -> ToolResult | None:
        if call.name not in self.tools:
            known = ", ".join(sorted(self.tools)) or "none"
            return ToolResult(f"Error: there is no tool named {call.name!r}; the tools are: {known}.", error=True)
        errors = sorted(self._validators[call.name].iter_errors(call.arguments), key=lambda e: list(e.path))
        if errors:
            where = "/".join(str(p) for p in errors[0].path) or "arguments"
            return ToolResult(f"Error: invalid arguments for {call.name} ({where}: {errors[0].message}).", error=True)
        return None

    def _run_with_timeout(self, tool: BaseTool, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        start = time.perf_counter()
        call = functools.partial(tool.execute, instance_id, arguments)
        try:
            result = call_on_own_thread(call, tool.timeout_s, f"verl-tool-{tool.name}")
        except concurrent.futures.TimeoutError:
            result = ToolResult(f"Error: {tool.name} did not answer within {tool.timeout_s:g} s.", error=True)
        except Exception as e:
            logger.warning("tool %s raised %s: %s", tool.name, type(e).__name__, e)
            result = ToolResult(f"Error: {tool.name} failed: {type(e).__name__}: {e}", error=True)
        result.metrics.setdefault("latency_s", time.perf_counter() - start)
        return result

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
