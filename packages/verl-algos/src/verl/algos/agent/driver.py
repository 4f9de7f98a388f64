"""Stepping many trajectories against a rollout engine, turn by turn.

On an engine with a request stream (vLLM) every turn is a request of its own (:mod:`.streaming`). On
the others (hf) turns go in rounds: each round generates one turn for every trajectory still going
(token in: its prompt and response so far, left-padded; token out: the new ids and their log-probs) in
one batch and hands each turn to its agent loop. Tool calls run on the executor's threads, in parallel;
the next round starts when every call of this one has returned. Its rows, and so every sampled token,
are then the same whatever the calls' timing, and a run is reproducible from its seed: resuming
whichever calls had finished first made a run's batches depend on the machine's load (the tool-learning
test once collapsed on one such draw). The price is that a slow call delays the next round; on vLLM
every turn is its own request and a slow call holds back its own trajectory only. The result has the
rollout engine's output layout (``verl.core.engine.rollout``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses

import numpy as np
import torch

from verl.algos.agent.loops import AgentLoop
from verl.algos.agent.streaming import stream_agent_loops
from verl.algos.agent.trajectory import AgentSample, Trajectory
from verl.core.engine import RolloutEngine, SamplingParams
from verl.core.protocol import DataProto


def run_agent_loops(
    engine: RolloutEngine,
    loops: dict[str, AgentLoop],
    samples: list[AgentSample],
    sampling: SamplingParams,
    pad_token_id: int,
    stream: bool | None = None,
) -> list[Trajectory]:
    """Run ``sampling.n`` trajectories per sample (a sample's consecutive, as the engines order them)
    to their end: turn by turn on the engine's request stream where it has one (``stream`` None or True;
    see :mod:`.streaming`), else in rounds of batches."""
    trajectories = [
        loops[sample.agent_name].start(f"{index}-{k}", sample)
        for index, sample in enumerate(samples)
        for k in range(sampling.n)
    ]
    if stream is None:
        stream = engine.supports_request_stream
    try:
        if stream:
            stream_agent_loops(engine, loops, trajectories, sampling)
        else:
            step_in_rounds(engine, loops, trajectories, sampling, pad_token_id)
    finally:
        for trajectory in trajectories:
            loops[trajectory.sample.agent_name].close(trajectory)
    return trajectories


def step_in_rounds(
    engine: RolloutEngine,
    loops: dict[str, AgentLoop],
    trajectories: list[Trajectory],
    sampling: SamplingParams,
    pad_token_id: int,
) -> None:
    """Each round generates one turn of every trajectory still going in one batch, then waits for every
    call the round made (see the module docstring)."""
    round_index = 0
    while ready := [t for t in trajectories if not t.done]:
        turns = generate_turn(engine, ready, sampling, pad_token_id, round_index)
        round_index += 1
        pending: dict[concurrent.futures.Future, Trajectory] = {}
        for trajectory, (ids, logprobs) in zip(ready, turns):
            follow_up = loops[trajectory.sample.agent_name].after_generation(trajectory, ids, logprobs)
            if follow_up is not None:
                pending[follow_up] = trajectory
        # All of them, resumed in the order they were made: the next round's rows must not depend on timing.
        concurrent.futures.wait(pending)
        for future, trajectory in pending.items():
            loops[trajectory.sample.agent_name].resume(trajectory, future.result())


def generate_turn(
    engine: RolloutEngine, ready: list[Trajectory], sampling: SamplingParams, pad_token_id: int, round_index: int
) -> list[tuple[list[int], list[float]]]:
    """One turn of each trajectory in ``ready``: its new ids (cut to its remaining response budget)
    and their log-probs. The response length bounds a whole trajectory, so ``sampling.max_new_tokens``
    is replaced by the largest remaining budget (each row is then cut to its own); per-round seeds are
    ``sampling.seed + round`` so that turns do not repeat one random stream."""
    contexts = [t.context_ids() for t in ready]
    width = max(len(c) for c in contexts)
    input_ids = torch.full((len(ready), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(ready), width), dtype=torch.long)
    for row, context in enumerate(contexts):
        input_ids[row, width - len(context) :] = torch.tensor(context)
        attention_mask[row, width - len(context) :] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    turn_sampling = dataclasses.replace(
        sampling,
        n=1,
        max_new_tokens=max(t.remaining for t in ready),
        logprobs=True,
        seed=None if sampling.seed is None else sampling.seed + round_index,
    )
    batch = DataProto.from_dict(
        {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
    )
    out = engine.generate(batch, turn_sampling).tensors
    lengths = out["response_mask"].sum(-1).tolist()
    turns = []
    for row, trajectory in enumerate(ready):
        keep = min(int(lengths[row]), trajectory.remaining)
        turns.append((out["responses"][row, :keep].tolist(), out["rollout_log_probs"][row, :keep].tolist()))
    return turns


def assemble(
    trajectories: list[Trajectory],
    response_length: int,
    pad_token_id: int,
    with_logprobs: bool,
    prompt_length: int | None = None,
) -> DataProto:
    """The trainer's batch: prompts left-padded (to ``prompt_length`` when given, so that every rank's
    batch has one width), responses right-padded to ``response_length``; ``attention_mask`` covers
    every response token, ``response_mask`` the model's only."""
    rows = len(trajectories)
    prompt_width = max([len(t.prompt_ids) for t in trajectories] + [prompt_length or 0])
    prompts = torch.full((rows, prompt_width), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((rows, prompt_width), dtype=torch.long)
    responses = torch.full((rows, response_length), pad_token_id, dtype=torch.long)
    response_attention = torch.zeros((rows, response_length), dtype=torch.long)
    response_mask = torch.zeros((rows, response_length), dtype=torch.long)
    logprobs = torch.zeros((rows, response_length), dtype=torch.float32)
    for row, t in enumerate(trajectories):
        prompts[row, prompt_width - len(t.prompt_ids) :] = torch.tensor(t.prompt_ids)
        prompt_mask[row, prompt_width - len(t.prompt_ids) :] = 1
        n = len(t.response_ids)
        if n:
            responses[row, :n] = torch.tensor(t.response_ids)
            response_attention[row, :n] = 1
            response_mask[row, :n] = torch.tensor(t.response_mask)
            logprobs[row, :n] = torch.tensor(t.response_logprobs)
    prompt_pos = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    response_pos = prompt_pos[:, -1:] + torch.arange(1, response_length + 1)[None, :]
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": torch.cat([prompt_mask, response_attention], dim=1),
        "position_ids": torch.cat([prompt_pos, response_pos], dim=1),
        "response_mask": response_mask,
    }
    if with_logprobs:
        tensors["rollout_log_probs"] = logprobs
    non_tensors = {
        "agent_name": _column([t.sample.agent_name for t in trajectories]),
        "__num_turns__": _column([t.assistant_turns + t.user_turns + 1 for t in trajectories]),
        "tool_reward": _column([t.tool_reward for t in trajectories]),
        "turn_scores": _column([list(t.turn_scores) for t in trajectories]),
        # what agent_metrics reads, per row: the driver recomputes the metrics over every rank's rows
        AGENT_STATS: _column([trajectory_stats(t) for t in trajectories]),
    }
    return DataProto.from_dict(tensors, non_tensors=non_tensors)


def _column(values: list) -> np.ndarray:
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column


#: The non-tensor column of per-row agent statistics (:func:`trajectory_stats`).
AGENT_STATS = "__agent_stats__"


def trajectory_stats(t: Trajectory) -> dict:
    return {
        "assistant_turns": t.assistant_turns,
        "tool_calls": t.tool_calls,
        "tool_errors": t.tool_errors,
        "tool_latency_s": list(t.tool_latency_s),
        "response_tokens": len(t.response_ids),
        "inserted_tokens": len(t.response_mask) - sum(t.response_mask),
        "tool_reward": t.tool_reward,
        "interaction_turns": t.interaction_turns,
        "interaction_errors": t.interaction_errors,
        "turn_scores": list(t.turn_scores),
    }


def agent_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """Per-step metrics of the agent loops."""
    return agent_metrics_of_stats([trajectory_stats(t) for t in trajectories])


def agent_metrics_of_stats(stats) -> dict[str, float]:
    """The agent metrics from rows' :func:`trajectory_stats` (a worker's rows, or a whole batch's)."""
    count = len(stats)
    calls = sum(s["tool_calls"] for s in stats)
    errors = sum(s["tool_errors"] for s in stats)
    latencies = [x for s in stats for x in s["tool_latency_s"]]
    response_tokens = sum(s["response_tokens"] for s in stats)
    inserted = sum(s["inserted_tokens"] for s in stats)
    scores = [x for s in stats for x in s["turn_scores"]]
    with_a_good_call = sum(s["tool_calls"] > s["tool_errors"] for s in stats)
    return {
        "agent/assistant_turns/mean": sum(s["assistant_turns"] for s in stats) / count,
        "agent/assistant_turns/max": float(max(s["assistant_turns"] for s in stats)),
        "agent/tool_calls/mean": calls / count,
        "agent/tool_errors/mean": errors / count,
        "agent/tool_error_rate": errors / calls if calls else 0.0,
        # trajectories with at least one call that was well-formed, valid and ran without error
        "agent/good_call_rate": with_a_good_call / count,
        "agent/tool_latency_s/mean": sum(latencies) / len(latencies) if latencies else 0.0,
        "agent/tool_latency_s/max": max(latencies, default=0.0),
        "agent/masked_token_share": inserted / response_tokens if response_tokens else 0.0,
        "agent/tool_reward/mean": sum(s["tool_reward"] for s in stats) / count,
        "agent/interaction_turns/mean": sum(s["interaction_turns"] for s in stats) / count,
        "agent/interaction_errors/mean": sum(s["interaction_errors"] for s in stats) / count,
        "agent/turn_score/mean": sum(scores) / len(scores) if scores else 0.0,
    }
