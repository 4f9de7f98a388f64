"""Agent-loop generation of a trainer batch: the rows' chat messages in, the rollout output layout out.

What a worker's generate calls when ``multi_turn.enable`` is on. Each row gives ``raw_prompt`` (its
messages: ``data.return_raw_chat=true``), optionally ``agent_name`` (else ``default_agent_loop``) and
``extra_info.tools_kwargs``, as in verl. The output has the engine's keys (``responses``,
``response_mask``, ``rollout_log_probs``, ...), the prompts' non-tensor fields repeated ``n`` times
(interleaved), ``__num_turns__``, ``tool_reward`` and ``turn_scores`` (the interaction's score of each of
its replies) per row, and the ``agent/*`` metrics under ``meta_info["metrics"]``.
"""

from __future__ import annotations

from typing import Any

from verl.algos.agent.config import MultiTurnConfig
from verl.algos.agent.driver import agent_metrics, assemble, run_agent_loops
from verl.algos.agent.interactions import InteractionRunner, load_interactions
from verl.algos.agent.loop_config import load_agent_loop_config
from verl.algos.agent.loops import AgentContext, build_agent_loops
from verl.algos.agent.tools import ToolExecutor, load_tools
from verl.algos.agent.trajectory import AgentSample
from verl.core.engine import RolloutEngine, SamplingParams
from verl.core.protocol import DataProto


def agent_context(
    tokenizer: Any,
    eos_token_ids: list[int],
    response_length: int,
    multi_turn: MultiTurnConfig,
    prompt_length: int | None = None,
    agent_loop_config_path: str | None = None,
) -> AgentContext:
    """The shared context, with the tools of ``multi_turn.tool_config_path``, the interactions of
    ``multi_turn.interaction_config_path`` and the loops of ``agent.agent_loop_config_path`` (if set)."""
    tools = ToolExecutor(load_tools(multi_turn.tool_config_path)) if multi_turn.tool_config_path else None
    interactions = (
        InteractionRunner(load_interactions(multi_turn.interaction_config_path))
        if multi_turn.interaction_config_path
        else None
    )
    loops = load_agent_loop_config(agent_loop_config_path) if agent_loop_config_path else {}
    return AgentContext(
        tokenizer, eos_token_ids, response_length, multi_turn, tools, interactions, loops, prompt_length
    )


def agent_samples(prompts: DataProto, default_agent_loop: str) -> list[AgentSample]:
    rows = prompts.non_tensor_batch
    if "raw_prompt" not in rows:
        raise ValueError(
            "agent loops start from each prompt's chat messages, and the batch has no raw_prompt: "
            "set data.return_raw_chat=true"
        )
    names = rows.get("agent_name", [None] * len(prompts))
    extra_infos = rows.get("extra_info", [None] * len(prompts))
    samples = []
    for messages, name, extra in zip(rows["raw_prompt"], names, extra_infos):
        tools_kwargs = (extra or {}).get("tools_kwargs") or {}
        interaction_kwargs = (extra or {}).get("interaction_kwargs") or {}
        samples.append(
            AgentSample(list(messages), name or default_agent_loop, dict(tools_kwargs), dict(interaction_kwargs))
        )
    return samples


def generate_with_agent_loops(
    engine: RolloutEngine,
    prompts: DataProto,
    sampling: SamplingParams,
    context: AgentContext,
    pad_token_id: int,
    default_agent_loop: str = "single_turn_agent",
) -> DataProto:
    samples = agent_samples(prompts, default_agent_loop)
    loops = build_agent_loops(context, {sample.agent_name for sample in samples})
    trajectories = run_agent_loops(engine, loops, samples, sampling, pad_token_id)
    output = assemble(
        trajectories, context.response_length, pad_token_id, sampling.logprobs, prompt_length=context.prompt_length
    )
    repeated = prompts.repeat(sampling.n, interleave=True) if sampling.n > 1 else prompts
    output.non_tensor_batch = {**repeated.non_tensor_batch, **output.non_tensor_batch}
    output.meta_info = dict(prompts.meta_info)
    output.meta_info["metrics"] = {**output.meta_info.get("metrics", {}), **agent_metrics(trajectories)}
    return output
