"""Agent loops against the real hf rollout engine on the scripted tiny model (``agent_scripts``): greedy
decoding replays its tool conversations, which forces real tool calls through the loop. The reference is
built by hand: the engine's own greedy turns, with the tool response's template delta between them.
"""

from __future__ import annotations

import pytest
import torch
from agent_scripts import (  # noqa: F401  (scripted_model and engine are fixtures)
    CALC,
    GREEDY,
    RESPONSE_LENGTH,
    SCRIPTS,
    conversation,
    engine,
    greedy_turn,
    scripted_model,
)

from verl.algos.agent.chat_tokens import ChatTokens
from verl.algos.agent.config import MultiTurnConfig, truncate_tool_response
from verl.algos.agent.driver import agent_metrics, assemble, run_agent_loops
from verl.algos.agent.loops import AGENT_LOOPS, AgentContext, build_agent_loops
from verl.algos.agent.tools import ToolExecutor, build_tools
from verl.algos.agent.trajectory import AgentSample
from verl.core.engine import SamplingParams
from verl.core.protocol import DataProto


def context(engine, **multi_turn) -> AgentContext:
    tools = ToolExecutor(build_tools({"tools": [CALC]}))
    return AgentContext(engine.tokenizer, engine.eos_token_ids, RESPONSE_LENGTH, MultiTurnConfig(**multi_turn), tools)


def test_the_model_replays_its_scripts(scripted_model, engine):
    _, tokenizer, sequences = scripted_model
    chat = ChatTokens(tokenizer, engine.eos_token_ids)
    for question, first, *_ in SCRIPTS:
        prompt = chat.prompt(conversation(question))
        turn, _ = greedy_turn(engine, prompt)
        assert tokenizer.decode(turn, skip_special_tokens=True) == first  # the test's precondition


def test_tool_agent_response_is_the_model_tokens_plus_the_inserted_tool_turns(scripted_model, engine):
    _, tokenizer, _ = scripted_model
    ctx = context(engine)
    loops = build_agent_loops(ctx, {"tool_agent"})
    samples = [AgentSample(conversation(question), "tool_agent") for question, *_ in SCRIPTS]
    trajectories = run_agent_loops(engine, loops, samples, GREEDY, engine.pad_token_id)
    chat = loops["tool_agent"].chat
    expected_tool_texts = [
        "42",
        "Error: division by zero.",
        'Error: the "arguments" of calc must be a JSON object, got list.',
    ]
    for (question, _, _, final), tool_text, trajectory in zip(SCRIPTS, expected_tool_texts, trajectories):
        # The reference, by hand: the engine's greedy turns with the template's tool-response delta between.
        prompt = chat.prompt(conversation(question))
        turn1, logprobs1 = greedy_turn(engine, prompt)
        inserted = chat.inserted([{"role": "tool", "content": tool_text}])
        turn2, logprobs2 = greedy_turn(engine, prompt + turn1 + inserted)
        assert tokenizer.decode(turn2, skip_special_tokens=True) == final
        assert trajectory.prompt_ids == prompt
        assert trajectory.response_ids == turn1 + inserted + turn2
        assert trajectory.response_mask == [1] * len(turn1) + [0] * len(inserted) + [1] * len(turn2)
        expected_logprobs = torch.tensor(logprobs1 + [0.0] * len(inserted) + logprobs2)
        torch.testing.assert_close(torch.tensor(trajectory.response_logprobs), expected_logprobs, rtol=0, atol=1e-5)
        assert (trajectory.assistant_turns, trajectory.user_turns, trajectory.tool_calls) == (2, 1, 1)
        assert trajectory.stop_reason == "eos"
    assert [t.tool_errors for t in trajectories] == [0, 1, 1]
    metrics = agent_metrics(trajectories)
    assert metrics["agent/tool_calls/mean"] == 1.0 and metrics["agent/tool_error_rate"] == pytest.approx(2 / 3)
    assert metrics["agent/good_call_rate"] == pytest.approx(1 / 3)  # only 6*7's call ran without an error
    inserted_tokens = sum(len(t.response_mask) - sum(t.response_mask) for t in trajectories)
    assert metrics["agent/masked_token_share"] == pytest.approx(
        inserted_tokens / sum(len(t.response_ids) for t in trajectories)
    )


def test_assembled_batch_has_the_rollout_layout_and_masks(engine):
    ctx = context(engine)
    loops = build_agent_loops(ctx, {"tool_agent", "single_turn_agent"})
    samples = [AgentSample(conversation(SCRIPTS[0][0]), "tool_agent"), AgentSample(conversation(SCRIPTS[1][0]))]
    trajectories = run_agent_loops(engine, loops, samples, GREEDY, engine.pad_token_id)
    batch = assemble(trajectories, RESPONSE_LENGTH, engine.pad_token_id, with_logprobs=True)
    b = batch.batch
    assert b["responses"].shape == (2, RESPONSE_LENGTH)
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], 1))
    for row, t in enumerate(trajectories):
        n = len(t.response_ids)
        assert b["responses"][row, :n].tolist() == t.response_ids
        assert b["response_mask"][row, :n].tolist() == t.response_mask and b["response_mask"][row, n:].sum() == 0
        assert b["attention_mask"][row, -RESPONSE_LENGTH:].sum() == n  # inserted tokens are attended to
        assert (b["rollout_log_probs"][row][b["response_mask"][row] == 0] == 0).all()
        assert (b["rollout_log_probs"][row][b["response_mask"][row] == 1] < 0).all()
    # Positions run on through the response, inserted tokens included.
    assert torch.equal(b["position_ids"][:, -RESPONSE_LENGTH], b["position_ids"][:, -RESPONSE_LENGTH - 1] + 1)
    # The single-turn sample stopped after its first turn, even though it wrote a tool call.
    assert (trajectories[1].assistant_turns, trajectories[1].tool_calls) == (1, 0)
    assert list(batch.non_tensor_batch["agent_name"]) == ["tool_agent", "single_turn_agent"]
    assert list(batch.non_tensor_batch["__num_turns__"]) == [4, 2]


def test_prompts_pad_to_the_prompt_length_and_a_longer_one_is_refused(engine):
    """Every rank pads its prompts to data.max_prompt_length (their batches concatenate on the driver)."""
    ctx = context(engine)
    ctx.prompt_length = 40
    loops = build_agent_loops(ctx, {"single_turn_agent"})
    trajectories = run_agent_loops(engine, loops, [AgentSample(conversation("hi"))], GREEDY, engine.pad_token_id)
    batch = assemble(trajectories, RESPONSE_LENGTH, engine.pad_token_id, with_logprobs=True, prompt_length=40)
    assert batch.batch["prompts"].shape == (1, 40)
    assert batch.batch["attention_mask"][0, :40].sum() == len(trajectories[0].prompt_ids)
    ctx.prompt_length = 3
    with pytest.raises(ValueError, match=r"has \d+ tokens, more than data.max_prompt_length=3: raise"):
        run_agent_loops(engine, loops, [AgentSample(conversation("hi"))], GREEDY, engine.pad_token_id)


def test_single_turn_agent_equals_a_plain_generate(engine):
    ctx = context(engine)
    loops = build_agent_loops(ctx, {"single_turn_agent"})
    samples = [AgentSample(conversation(q)) for q in ("hello there", "What is 6*7?")]
    trajectories = run_agent_loops(engine, loops, samples, GREEDY, engine.pad_token_id)
    for sample, t in zip(samples, trajectories):
        turn, logprobs = greedy_turn(engine, loops["single_turn_agent"].chat.prompt(sample.messages))
        assert t.response_ids == turn and t.response_mask == [1] * len(turn)
        torch.testing.assert_close(torch.tensor(t.response_logprobs), torch.tensor(logprobs), rtol=0, atol=1e-5)


def test_turn_limits_end_the_trajectory(engine):
    sample = AgentSample(conversation(SCRIPTS[0][0]), "tool_agent")
    for limits, reason, turns in [
        ({"max_assistant_turns": 1}, "max_assistant_turns", (1, 0)),
        ({"max_user_turns": 1}, "max_user_turns", (2, 1)),
    ]:
        loops = build_agent_loops(context(engine, **limits), {"tool_agent"})
        [t] = run_agent_loops(engine, loops, [sample], GREEDY, engine.pad_token_id)
        assert (t.stop_reason, (t.assistant_turns, t.user_turns)) == (reason, turns)


def test_the_response_length_bounds_a_trajectory(engine):
    ctx = context(engine)
    ctx.response_length = 30  # the first turn fits; its tool response does not
    loops = build_agent_loops(ctx, {"tool_agent"})
    [t] = run_agent_loops(
        engine, loops, [AgentSample(conversation(SCRIPTS[0][0]), "tool_agent")], GREEDY, engine.pad_token_id
    )
    assert len(t.response_ids) <= 30 and t.stop_reason == "length"
    ctx.response_length = 5  # cut inside the first turn
    [t] = run_agent_loops(
        engine, loops, [AgentSample(conversation(SCRIPTS[0][0]), "tool_agent")], GREEDY, engine.pad_token_id
    )
    assert len(t.response_ids) == 5 and t.response_mask == [1] * 5 and t.stop_reason == "length"


def test_n_samples_per_prompt_are_separate_trajectories(engine):
    loops = build_agent_loops(context(engine), {"tool_agent"})
    sampling = SamplingParams(n=2, max_new_tokens=64, logprobs=True, seed=3)
    trajectories = run_agent_loops(
        engine, loops, [AgentSample(conversation("What is 6*7?"), "tool_agent")], sampling, engine.pad_token_id
    )
    assert [t.trajectory_id for t in trajectories] == ["0-0", "0-1"]
    for t in trajectories:
        assert len(t.response_ids) == len(t.response_mask) == len(t.response_logprobs) <= RESPONSE_LENGTH


def test_config_and_registry_errors():
    with pytest.raises(ValueError, match="tool_response_truncate_side='top'"):
        MultiTurnConfig(tool_response_truncate_side="top")
    with pytest.raises(ValueError, match="num_repeat_rollouts is not supported yet"):
        MultiTurnConfig(num_repeat_rollouts=2)
    with pytest.raises(ValueError, match="max_assistant_turns=0"):
        MultiTurnConfig(max_assistant_turns=0)
    assert {"single_turn_agent", "tool_agent"} <= set(AGENT_LOOPS.names())


@pytest.mark.parametrize(
    "side, expected",
    [("left", "abcd...(truncated)"), ("right", "(truncated)...ghij"), ("middle", "ab...(truncated)...ij")],
)
def test_tool_response_truncation_as_verl(side, expected):
    assert truncate_tool_response("abcdefghij", 4, side) == expected
    assert truncate_tool_response("abc", 4, side) == "abc"


def test_generate_with_agent_loops_from_dataset_rows(scripted_model, engine, tmp_path):
    import numpy as np
    import yaml

    from verl.algos.agent.rollout import agent_context, generate_with_agent_loops

    tool_config = tmp_path / "tools.yaml"
    tool_config.write_text(yaml.safe_dump({"tools": [CALC]}))
    multi_turn = MultiTurnConfig(enable=True, tool_config_path=str(tool_config))
    ctx = agent_context(engine.tokenizer, engine.eos_token_ids, RESPONSE_LENGTH, multi_turn)

    def column(values):
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out

    rows = DataProto.from_dict(
        {"input_ids": torch.zeros(2, 3, dtype=torch.long)},
        non_tensors={
            "raw_prompt": column([conversation(SCRIPTS[0][0]), conversation(SCRIPTS[1][0])]),
            "agent_name": column(["tool_agent", None]),
            "extra_info": column([{"tools_kwargs": {"calc": {"create_kwargs": {}}}}, {}]),
            "data_source": column(["a", "b"]),
        },
        meta_info={"step": 3},
    )
    sampling = SamplingParams(n=2, max_new_tokens=64, logprobs=True, do_sample=False)
    out = generate_with_agent_loops(engine, rows, sampling, ctx, engine.pad_token_id)
    out.check_consistency()
    assert len(out) == 4 and list(out.non_tensor_batch["data_source"]) == ["a", "a", "b", "b"]
    assert list(out.non_tensor_batch["agent_name"]) == ["tool_agent"] * 2 + ["single_turn_agent"] * 2
    assert list(out.non_tensor_batch["__num_turns__"]) == [4, 4, 2, 2]
    assert out.meta_info["step"] == 3 and out.meta_info["metrics"]["agent/tool_calls/mean"] == 0.5
    assert 0 < out.meta_info["metrics"]["agent/masked_token_share"] < 1
    with pytest.raises(ValueError, match="data.return_raw_chat=true"):
        generate_with_agent_loops(engine, DataProto.from_dict({"input_ids": torch.zeros(1, 3)}), sampling, ctx, 0)


def test_a_users_loop_from_verls_agent_loop_config_file(engine, tmp_path):
    """``agent.agent_loop_config_path``: verl's list of {name, _target_, kwargs}; a row's agent_name picks it."""
    import yaml

    from verl.algos.agent.loop_config import load_agent_loop_config

    path = tmp_path / "loops.yaml"
    path.write_text(
        yaml.safe_dump([{"name": "ask_again", "_target_": "agent_scripts.AskAgainLoop", "message": "Sure?"}])
    )
    ctx = context(engine)
    ctx.loop_factories = load_agent_loop_config(str(path))
    loops = build_agent_loops(ctx, {"ask_again"})
    assert loops["ask_again"].message == "Sure?"
    [t] = run_agent_loops(engine, loops, [AgentSample(conversation("hello there"), "ask_again")], GREEDY, 0)
    chat = loops["ask_again"].chat
    prompt = chat.prompt(conversation("hello there"))
    turn1, _ = greedy_turn(engine, prompt)
    asked = chat.inserted([{"role": "user", "content": "Sure?"}])
    turn2, _ = greedy_turn(engine, prompt + turn1 + asked)
    assert t.response_ids == turn1 + asked + turn2 and (t.assistant_turns, t.user_turns) == (2, 1)
    assert t.response_mask == [1] * len(turn1) + [0] * len(asked) + [1] * len(turn2)


@pytest.mark.parametrize(
    "document, message",
    [
        ({"name": "x"}, "expected a list"),
        ([{"name": "x"}], r"\[0\]: each agent loop needs a name and a _target_"),
        ([{"name": "x", "_target_": "no.such.Loop"}], "is not importable"),
        (
            [{"name": "x", "_target_": "collections.OrderedDict"}],
            "is not a subclass of verl.algos.agent.loops.AgentLoop",
        ),
        ([{"name": "x", "_target_": "agent_scripts.AskAgainLoop"}] * 2, "a second agent loop named 'x'"),
    ],
)
def test_bad_agent_loop_configs_say_what_is_wrong(document, message):
    from verl.algos.agent.loop_config import build_agent_loop_config

    with pytest.raises(ValueError, match=message):
        build_agent_loop_config(document)


def test_the_agent_config_files_are_checked_before_ray_starts(tmp_path):
    from verl.algos.config import load_config
    from verl.algos.config.consistency import check_consistency
    from verl.core.config import ConfigError

    bad = tmp_path / "bad.yaml"
    bad.write_text("tools: [{class_name: abacus}]\n")
    for override, message in [
        (f"actor_rollout_ref.rollout.multi_turn.tool_config_path={bad}", "tool_config_path: .*tools\\[0\\]"),
        (f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={tmp_path}/none.yaml", "cannot read it"),
        (f"actor_rollout_ref.rollout.agent.agent_loop_config_path={bad}", "agent_loop_config_path: .*expected a list"),
    ]:
        with pytest.raises(ConfigError, match=message):
            check_consistency(load_config("tool_grpo", [override]))
    check_consistency(load_config("tool_grpo"))  # the recipe's own builtin:calculator


def test_a_turn_stopped_by_a_stop_string_ends_the_trajectory(engine):
    loops = build_agent_loops(context(engine), {"tool_agent"})
    sampling = SamplingParams(do_sample=False, max_new_tokens=64, logprobs=True, stop=["calc"])
    [t] = run_agent_loops(engine, loops, [AgentSample(conversation(SCRIPTS[0][0]), "tool_agent")], sampling, 0)
    assert engine.tokenizer.decode(t.response_ids).endswith("calc")
    assert (t.stop_reason, t.assistant_turns, t.tool_calls) == ("no_eos", 1, 0)


def test_the_rounds_do_not_depend_on_which_tool_call_finishes_first(engine, monkeypatch):
    """On the rounds path (hf) a round waits for every call of the round, so each batch the engine gets,
    and with it every sampled token, is the same whatever the calls' timing: a run is reproducible from its
    seed. (Resuming whichever calls had finished made a run's batches, and so its learning, vary.)"""
    import time

    from verl.algos.agent.tools.calculator import CalculatorTool

    execute, generate = CalculatorTool.execute, engine.generate
    slow: set[str] = set()
    batches: list[list[list[int]]] = []

    def timed_execute(self, instance_id, arguments):
        if instance_id.split("-")[0] in slow:
            time.sleep(0.3)
        return execute(self, instance_id, arguments)

    def recorded_generate(prompts, sampling):
        batches.append(prompts.batch["input_ids"].tolist())
        return generate(prompts, sampling)

    monkeypatch.setattr(CalculatorTool, "execute", timed_execute)
    monkeypatch.setattr(engine, "generate", recorded_generate)
    loops = build_agent_loops(context(engine, max_assistant_turns=3), {"tool_agent"})
    samples = [AgentSample(conversation(question), "tool_agent") for question, *_ in SCRIPTS]
    sampling = SamplingParams(n=2, temperature=1.0, max_new_tokens=64, logprobs=True, seed=11)
    runs, rounds = [], []
    for slow_prompts in ({"0", "2"}, {"1"}):  # the calls of two prompts slow, then of the third
        slow.clear()
        slow.update(slow_prompts)
        batches.clear()
        runs.append(run_agent_loops(engine, loops, samples, sampling, engine.pad_token_id))
        rounds.append(list(batches))
    first, second = runs
    assert sum(t.tool_calls for t in first) >= 3  # calls were made, slow and fast ones
    assert len(rounds[0]) >= 2 and rounds[0] == rounds[1]
    for a, b in zip(first, second, strict=True):
        assert a.response_ids == b.response_ids
        assert a.response_logprobs == b.response_logprobs
