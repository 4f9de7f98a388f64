"""Stepping many trajectories on an engine's request stream: every turn is a request of its own.

With an engine that takes requests one by one into running generation (vLLM; see
:mod:`verl.core.engine.requests`), a trajectory's next turn is submitted the moment it is ready: at the
start, after a turn that needs no follow-up, or as soon as its tool calls or interaction reply return,
while the other trajectories' turns are being decoded. Nothing waits for a round to end: a slow tool call
holds back its own trajectory only, and one long turn holds back nobody's next turn.

Each turn's seed comes from ``sampling.seed``, the trajectory and the turn's number, so what a trajectory
samples does not depend on the order in which other trajectories' tool calls happen to return.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses

from verl.algos.agent.loops import AgentLoop
from verl.algos.agent.trajectory import Trajectory
from verl.core.engine import RolloutEngine, SamplingParams
from verl.core.engine.requests import derive_seed


def turn_seed(seed: int | None, trajectory_id: str, turn: int) -> int | None:
    return None if seed is None else derive_seed(seed, trajectory_id, turn)


def stream_agent_loops(
    engine: RolloutEngine, loops: dict[str, AgentLoop], trajectories: list[Trajectory], sampling: SamplingParams
) -> None:
    """Run ``trajectories`` to their end on ``engine.request_stream()``."""
    requests: dict[str, Trajectory] = {}
    follow_ups: dict[concurrent.futures.Future, Trajectory] = {}
    turns: dict[str, int] = {}

    def loop_of(trajectory: Trajectory) -> AgentLoop:
        return loops[trajectory.sample.agent_name]

    with engine.request_stream() as stream:

        def submit(trajectory: Trajectory) -> None:
            if trajectory.remaining <= 0:
                trajectory.finish("length")
                return
            turn = turns.get(trajectory.trajectory_id, 0)
            turns[trajectory.trajectory_id] = turn + 1
            turn_sampling = dataclasses.replace(
                sampling,
                n=1,
                max_new_tokens=trajectory.remaining,
                logprobs=True,
                seed=turn_seed(sampling.seed, trajectory.trajectory_id, turn),
            )
            request_id = f"{trajectory.trajectory_id}/{turn}"
            stream.submit(request_id, trajectory.context_ids(), turn_sampling)
            requests[request_id] = trajectory

        for trajectory in trajectories:
            if not trajectory.done:
                submit(trajectory)
        while stream.in_flight or follow_ups:
            if stream.in_flight:
                for finished in stream.step():
                    trajectory = requests.pop(finished.request_id)
                    if finished.logprobs is None:  # every turn asks for them (the loss needs them)
                        raise RuntimeError(f"request {finished.request_id}: the engine returned no log-probs")
                    ids = finished.token_ids[: trajectory.remaining]
                    logprobs = finished.logprobs[: len(ids)]
                    follow_up = loop_of(trajectory).after_generation(trajectory, ids, logprobs)
                    if follow_up is not None:
                        follow_ups[follow_up] = trajectory
                    elif not trajectory.done:
                        submit(trajectory)
                returned = [future for future in follow_ups if future.done()]
            else:  # nothing to decode: wait for the first follow-up to return
                returned, _ = concurrent.futures.wait(follow_ups, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in returned:
                trajectory = follow_ups.pop(future)
                loop_of(trajectory).resume(trajectory, future.result())
                if not trajectory.done:
                    submit(trajectory)
