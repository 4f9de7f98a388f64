"""Agent loops, registered by name (``AGENT_LOOPS``; a data row's ``agent_name`` picks one).

A loop steps one trajectory: :meth:`AgentLoop.start` templates the prompt; after every generation the
driver hands the turn's tokens to :meth:`AgentLoop.after_generation`, which appends them and either
ends the trajectory or starts the follow-up (tool calls) and returns a future of its outcome; once
that is done the driver passes the outcome to :meth:`AgentLoop.resume`, which inserts what the model
sees next. Generation itself belongs to the
driver (:mod:`.driver`), which steps many trajectories in one batch.

Register a loop of your own with ``@AGENT_LOOPS.register("my_agent")`` on an :class:`AgentLoop` subclass.
"""

from __future__ import annotations

import concurrent.futures
import threading
from dataclasses import dataclass
from typing import Any

from verl.algos.agent.chat_tokens import ChatTokens
from verl.algos.agent.config import MultiTurnConfig, truncate_tool_response
from verl.algos.agent.tool_parsers import ToolParser, get_tool_parser
from verl.algos.agent.tools import ToolExecutor, ToolResult
from verl.algos.agent.trajectory import AgentSample, Trajectory
from verl.core.registry import Registry

AGENT_LOOPS: Registry[type] = Registry("agent loop")


@dataclass
class AgentContext:
    """What every loop of a rollout shares."""

    tokenizer: Any
    eos_token_ids: list[int]
    response_length: int
    multi_turn: MultiTurnConfig
    tools: ToolExecutor | None = None


class AgentLoop:
    def __init__(self, context: AgentContext):
        self.context = context
        self.chat = ChatTokens(context.tokenizer, context.eos_token_ids, self.tool_schemas())

    def tool_schemas(self) -> list[dict] | None:
        return None

    def start(self, trajectory_id: str, sample: AgentSample) -> Trajectory:
        prompt = self.chat.prompt(sample.messages)
        return Trajectory(trajectory_id, sample, prompt, self.context.response_length)

    def after_generation(
        self, trajectory: Trajectory, ids: list[int], logprobs: list[float]
    ) -> concurrent.futures.Future | None:
        trajectory.add_model_tokens(ids, logprobs)
        trajectory.assistant_turns += 1
        ended = bool(ids) and ids[-1] in self.context.eos_token_ids
        trajectory.finish("eos" if ended else "length" if trajectory.remaining <= 0 else "no_eos")
        return None

    def resume(self, trajectory: Trajectory, outcome: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} starts no follow-up, so there is nothing to resume")

    def close(self, trajectory: Trajectory) -> None:
        """Called once the trajectory is done (release per-trajectory state)."""


@AGENT_LOOPS.register("single_turn_agent")
class SingleTurnAgentLoop(AgentLoop):
    """One generation: what a single-turn rollout does, through the agent-loop interface."""


@AGENT_LOOPS.register("tool_agent")
class ToolAgentLoop(AgentLoop):
    """verl's tool agent: generate; if the turn calls tools, run them (at most ``max_parallel_calls``
    per turn), insert their responses as ``tool`` messages, generate again; stop at a turn without
    calls, at a turn limit, or when the response length is used up. Malformed calls are answered with
    an error message, as a failing tool is."""

    def __init__(self, context: AgentContext):
        if context.tools is None:
            raise ValueError("tool_agent needs tools: set actor_rollout_ref.rollout.multi_turn.tool_config_path")
        self.parser: ToolParser = get_tool_parser(context.multi_turn.format)
        super().__init__(context)

    def tool_schemas(self) -> list[dict] | None:
        assert self.context.tools is not None
        return [tool.tool_schema for tool in self.context.tools.tools.values()]

    def start(self, trajectory_id: str, sample: AgentSample) -> Trajectory:
        assert self.context.tools is not None
        trajectory = super().start(trajectory_id, sample)
        for name, tool in self.context.tools.tools.items():
            tool.create(trajectory_id, **sample.tools_kwargs.get(name, {}).get("create_kwargs", {}))
        return trajectory

    def after_generation(
        self, trajectory: Trajectory, ids: list[int], logprobs: list[float]
    ) -> concurrent.futures.Future | None:
        trajectory.add_model_tokens(ids, logprobs)
        trajectory.assistant_turns += 1
        config = self.context.multi_turn
        if trajectory.remaining <= 0:
            trajectory.finish("length")
            return None
        if not ids or ids[-1] not in self.context.eos_token_ids:
            # Stopped without its end-of-turn token (a stop string): the template delta of the next
            # messages starts after that token, so the conversation cannot go on from here.
            trajectory.finish("no_eos")
            return None
        if config.max_assistant_turns is not None and trajectory.assistant_turns >= config.max_assistant_turns:
            trajectory.finish("max_assistant_turns")
            return None
        if config.max_user_turns is not None and trajectory.user_turns >= config.max_user_turns:
            trajectory.finish("max_user_turns")
            return None
        parsed = self.parser.parse(self.context.tokenizer.decode(ids, skip_special_tokens=True))
        calls = parsed.calls[: config.max_parallel_calls]
        if not calls and not parsed.errors:
            trajectory.finish("eos")
            return None
        trajectory.tool_calls += len(calls) + len(parsed.errors)
        errors = [ToolResult(str(error), error=True) for error in parsed.errors]
        assert self.context.tools is not None
        futures = [self.context.tools.submit(trajectory.trajectory_id, call) for call in calls]
        return _gather(futures, errors)

    def resume(self, trajectory: Trajectory, outcome: list[ToolResult]) -> None:
        ids = self.chat.inserted(self.messages_for(trajectory, outcome))
        if len(ids) >= trajectory.remaining:
            trajectory.finish("length")  # as verl: a response that does not fit ends the trajectory
            return
        trajectory.add_inserted_tokens(ids)
        trajectory.user_turns += 1

    def close(self, trajectory: Trajectory) -> None:
        assert self.context.tools is not None
        for tool in self.context.tools.tools.values():
            tool.release(trajectory.trajectory_id)

    def tool_message(self, result: ToolResult) -> dict[str, Any]:
        config = self.context.multi_turn
        text = truncate_tool_response(result.text, config.max_tool_response_length, config.tool_response_truncate_side)
        return {"role": "tool", "content": text}

    def messages_for(self, trajectory: Trajectory, results: list[ToolResult]) -> list[dict[str, Any]]:
        """Account for finished calls on the trajectory; the tool messages to insert."""
        for result in results:
            trajectory.tool_errors += int(result.error)
            trajectory.tool_reward += result.reward
            if "latency_s" in result.metrics:
                trajectory.tool_latency_s.append(result.metrics["latency_s"])
        return [self.tool_message(result) for result in results]


def _gather(futures: list[concurrent.futures.Future], errors: list[ToolResult]) -> concurrent.futures.Future:
    """One future of all the turn's results (calls in order, then parse errors), done when the last is."""
    combined: concurrent.futures.Future = concurrent.futures.Future()
    lock = threading.Lock()
    pending = [len(futures)]

    def collect(_: concurrent.futures.Future) -> None:
        with lock:
            pending[0] -= 1
            if pending[0] > 0:
                return
        combined.set_result([f.result() for f in futures] + errors)

    if not futures:
        combined.set_result(errors)
    for future in futures:
        future.add_done_callback(collect)
    return combined


def build_agent_loops(context: AgentContext, names: set[str]) -> dict[str, AgentLoop]:
    """One loop object per agent name the batch uses."""
    return {name: AGENT_LOOPS.get(name)(context) for name in sorted(names)}
