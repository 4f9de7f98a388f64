"""Agent loops, registered by name (``AGENT_LOOPS``; a data row's ``agent_name`` picks one).

A loop steps one trajectory: :meth:`AgentLoop.start` templates the prompt; after every generation the
driver hands the turn's tokens to :meth:`AgentLoop.after_generation`, which appends them and either
ends the trajectory or starts the follow-up (tool calls) and returns a future of its outcome; once
that is done the driver passes the outcome to :meth:`AgentLoop.resume`, which inserts what the model
sees next (tool responses, or an interaction's user reply). Generation itself belongs to the
driver (:mod:`.driver`), which steps many trajectories in one batch.

Register a loop of your own with ``@AGENT_LOOPS.register("my_agent")`` on an :class:`AgentLoop` subclass.
"""

from __future__ import annotations

import concurrent.futures
import threading
from dataclasses import dataclass, field
from typing import Any

from verl.algos.agent.chat_tokens import ChatTokens
from verl.algos.agent.config import MultiTurnConfig, truncate_tool_response
from verl.algos.agent.interactions import InteractionReply, InteractionRunner
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
    interactions: InteractionRunner | None = None
    #: Loops of the agent loop config file by name (``agent.agent_loop_config_path``): they take
    #: precedence over the registry's.
    loop_factories: dict[str, Any] = field(default_factory=dict)
    #: data.max_prompt_length: every rank's prompts are padded to it (so that their batches concatenate),
    #: and a templated prompt longer than it is refused. None: no bound (each batch pads to its longest).
    prompt_length: int | None = None


class AgentLoop:
    def __init__(self, context: AgentContext):
        self.context = context
        self.chat = ChatTokens(context.tokenizer, context.eos_token_ids, self.tool_schemas())

    def tool_schemas(self) -> list[dict] | None:
        return None

    def start(self, trajectory_id: str, sample: AgentSample) -> Trajectory:
        prompt = self.chat.prompt(sample.messages)
        limit = self.context.prompt_length
        if limit is not None and len(prompt) > limit:
            raise ValueError(
                f"an agent prompt templated with its tool schemas has {len(prompt)} tokens, more than "
                f"data.max_prompt_length={limit}: raise data.max_prompt_length (the tools' descriptions are "
                "part of the prompt) or shorten the prompt"
            )
        return Trajectory(trajectory_id, sample, prompt, self.context.response_length, messages=list(sample.messages))

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
    per turn), insert their responses as ``tool`` messages, generate again. A turn without calls goes to
    the row's interaction when it has one (``extra_info.interaction_kwargs``): its reply is inserted as a
    ``user`` message and the loop generates again, until the interaction ends the episode. Stop at a
    turn without calls (and no interaction), at a turn limit, or when the response length is used up.
    Malformed calls are answered with an error message, as a failing tool is."""

    def __init__(self, context: AgentContext):
        if context.tools is None and context.interactions is None:
            raise ValueError(
                "tool_agent needs tools or interactions: set actor_rollout_ref.rollout.multi_turn.tool_config_path "
                "(or interaction_config_path)"
            )
        self.parser: ToolParser = get_tool_parser(context.multi_turn.format)
        super().__init__(context)

    def tool_schemas(self) -> list[dict] | None:
        if self.context.tools is None:
            return None
        return [tool.tool_schema for tool in self.context.tools.tools.values()]

    def start(self, trajectory_id: str, sample: AgentSample) -> Trajectory:
        trajectory = super().start(trajectory_id, sample)
        if self.context.tools is not None:
            for name, tool in self.context.tools.tools.items():
                tool.create(trajectory_id, **sample.tools_kwargs.get(name, {}).get("create_kwargs", {}))
        if self.context.interactions is not None and sample.interaction_kwargs:
            trajectory.interaction = self.context.interactions.resolve(sample.interaction_kwargs)
            trajectory.interaction.start_interaction(trajectory_id, **sample.interaction_kwargs)
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
        text = self.context.tokenizer.decode(ids, skip_special_tokens=True)
        trajectory.messages.append({"role": "assistant", "content": text})
        if self.context.tools is not None:
            parsed = self.parser.parse(text)
            calls = parsed.calls[: config.max_parallel_calls]
            if calls or parsed.errors:
                trajectory.tool_calls += len(calls) + len(parsed.errors)
                errors = [ToolResult(str(error), error=True) for error in parsed.errors]
                futures = [self.context.tools.submit(trajectory.trajectory_id, call) for call in calls]
                return _gather(futures, errors)
        if trajectory.interaction is not None:
            assert self.context.interactions is not None
            return self.context.interactions.submit(
                trajectory.interaction,
                trajectory.trajectory_id,
                trajectory.messages,
                trajectory.sample.interaction_kwargs,
            )
        trajectory.finish("eos")
        return None

    def resume(self, trajectory: Trajectory, outcome: list[ToolResult] | InteractionReply) -> None:
        if isinstance(outcome, InteractionReply):
            self._resume_after_reply(trajectory, outcome)
            return
        messages = self.messages_for(trajectory, outcome)
        trajectory.messages += messages
        if self._insert(trajectory, messages):
            trajectory.user_turns += 1

    def _resume_after_reply(self, trajectory: Trajectory, reply: InteractionReply) -> None:
        trajectory.interaction_turns += 1
        if reply.error is not None:
            trajectory.interaction_errors += 1
            trajectory.finish("interaction_error")
            return
        if reply.score is not None:
            trajectory.turn_scores.append(reply.score)
        message = {"role": "user", "content": reply.text}
        trajectory.messages.append(message)
        # As verl: the reply is inserted even when it ends the episode (the reward function reads it).
        if self._insert(trajectory, [message]):
            trajectory.user_turns += 1
            if reply.terminate:
                trajectory.finish("interaction_done")

    def _insert(self, trajectory: Trajectory, messages: list[dict[str, Any]]) -> bool:
        ids = self.chat.inserted(messages)
        if len(ids) >= trajectory.remaining:
            trajectory.finish("length")  # as verl: a response that does not fit ends the trajectory
            return False
        trajectory.add_inserted_tokens(ids)
        return True

    def close(self, trajectory: Trajectory) -> None:
        if self.context.tools is not None:
            for tool in self.context.tools.tools.values():
                tool.release(trajectory.trajectory_id)
        if trajectory.interaction is not None:
            trajectory.interaction.finalize_interaction(trajectory.trajectory_id)

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
    """One loop object per agent name the batch uses (the config file's loops first, then the registry's)."""
    return {name: (context.loop_factories.get(name) or AGENT_LOOPS.get(name))(context) for name in sorted(names)}
