"""Interactions (verl's ``multi_turn.interaction_config_path``): a user simulator replies between turns.

Against the real hf engine on the scripted tiny model (``agent_scripts``), which has learnt to answer
"What is 3+4?" wrongly first and rightly after the gsm8k interaction's "try again": the response is the
model's two turns with the interaction's replies inserted (masked) between and after them, built by hand
as the reference; each reply's score is kept; a failing interaction ends only its own trajectory.
"""

from __future__ import annotations

import time

import pytest
import yaml
from agent_scripts import (  # noqa: F401  (scripted_model and engine are fixtures)
    CALC,
    GREEDY,
    INTERACTION,
    RESPONSE_LENGTH,
    SCRIPTS,
    conversation,
    engine,
    greedy_turn,
    scripted_model,
)

from verl.algos.agent.config import MultiTurnConfig
from verl.algos.agent.driver import agent_metrics, assemble, run_agent_loops
from verl.algos.agent.interactions import (
    BaseInteraction,
    InteractionRunner,
    build_interactions,
    load_interactions,
)
from verl.algos.agent.interactions.gsm8k import CORRECT, INCORRECT, Gsm8kInteraction
from verl.algos.agent.loops import AgentContext, build_agent_loops
from verl.algos.agent.tools import ToolExecutor, build_tools
from verl.algos.agent.trajectory import AgentSample

#: verl's own example config (examples/sglang_multiturn/config/interaction_config/gsm8k_interaction_config.yaml).
VERL_GSM8K_CONFIG = {
    "interaction": [
        {"name": "gsm8k", "class_name": "verl.interactions.gsm8k_interaction.Gsm8kInteraction", "config": {}}
    ]
}


def context(engine, interactions: dict[str, BaseInteraction], with_tools: bool = False, **multi_turn) -> AgentContext:
    tools = ToolExecutor(build_tools({"tools": [CALC]})) if with_tools else None
    return AgentContext(
        engine.tokenizer,
        engine.eos_token_ids,
        RESPONSE_LENGTH,
        MultiTurnConfig(**multi_turn),
        tools,
        InteractionRunner(interactions),
    )


def gsm8k_sample(ground_truth: str = "7") -> AgentSample:
    return AgentSample(
        conversation(INTERACTION[0]), "tool_agent", interaction_kwargs={"name": "gsm8k", "ground_truth": ground_truth}
    )


def test_interaction_replies_are_inserted_user_turns_and_a_right_answer_ends_the_episode(scripted_model, engine):
    tokenizer = scripted_model[1]
    loops = build_agent_loops(context(engine, build_interactions(VERL_GSM8K_CONFIG)), {"tool_agent"})
    [t] = run_agent_loops(engine, loops, [gsm8k_sample()], GREEDY, engine.pad_token_id)

    # The reference, by hand: the engine's greedy turns with the template's user-message deltas.
    chat = loops["tool_agent"].chat
    prompt = chat.prompt(conversation(INTERACTION[0]))
    turn1, _ = greedy_turn(engine, prompt)
    again = chat.inserted([{"role": "user", "content": INCORRECT}])
    turn2, _ = greedy_turn(engine, prompt + turn1 + again)
    done = chat.inserted([{"role": "user", "content": CORRECT}])
    assert [tokenizer.decode(x, skip_special_tokens=True) for x in (turn1, turn2)] == list(INTERACTION[1:])
    assert t.prompt_ids == prompt
    assert t.response_ids == turn1 + again + turn2 + done
    assert t.response_mask == [1] * len(turn1) + [0] * len(again) + [1] * len(turn2) + [0] * len(done)
    assert t.turn_scores == [0.0, 1.0] and t.stop_reason == "interaction_done"
    assert (t.assistant_turns, t.user_turns, t.interaction_turns, t.tool_calls) == (2, 2, 2, 0)
    assert t.messages == [
        *conversation(INTERACTION[0]),
        {"role": "assistant", "content": INTERACTION[1]},
        {"role": "user", "content": INCORRECT},
        {"role": "assistant", "content": INTERACTION[2]},
        {"role": "user", "content": CORRECT},
    ]
    batch = assemble([t], RESPONSE_LENGTH, engine.pad_token_id, with_logprobs=True)
    assert list(batch.non_tensor_batch["turn_scores"]) == [[0.0, 1.0]]
    assert list(batch.non_tensor_batch["__num_turns__"]) == [5]
    metrics = agent_metrics([t])
    assert metrics["agent/interaction_turns/mean"] == 2.0 and metrics["agent/turn_score/mean"] == 0.5


def test_tool_calls_and_interactions_share_one_loop(engine):
    """A tool row without interaction_kwargs runs as before; the interaction row next to it is answered."""
    loops = build_agent_loops(context(engine, build_interactions(VERL_GSM8K_CONFIG), with_tools=True), {"tool_agent"})
    samples = [AgentSample(conversation(SCRIPTS[0][0]), "tool_agent"), gsm8k_sample()]
    tool_row, interaction_row = run_agent_loops(engine, loops, samples, GREEDY, engine.pad_token_id)
    assert (tool_row.tool_calls, tool_row.interaction_turns, tool_row.stop_reason) == (1, 0, "eos")
    assert (interaction_row.tool_calls, interaction_row.turn_scores) == (0, [0.0, 1.0])


def test_the_user_turn_limit_stops_the_interaction(engine):
    loops = build_agent_loops(context(engine, build_interactions(VERL_GSM8K_CONFIG), max_user_turns=1), {"tool_agent"})
    [t] = run_agent_loops(engine, loops, [gsm8k_sample()], GREEDY, engine.pad_token_id)
    assert (t.stop_reason, t.assistant_turns, t.user_turns, t.turn_scores) == ("max_user_turns", 2, 1, [0.0])


class Raising(BaseInteraction):
    def generate_response(self, instance_id, messages, **kwargs):
        raise RuntimeError("simulator crashed")


class Hanging(BaseInteraction):
    def generate_response(self, instance_id, messages, **kwargs):
        time.sleep(5)
        return True, "late", 1.0, {}


class Malformed(BaseInteraction):
    def generate_response(self, instance_id, messages, **kwargs):
        return "not four values"


@pytest.mark.parametrize(
    "interaction, error",
    [
        (Raising({"name": "user"}), "failed: RuntimeError: simulator crashed"),
        (Hanging({"name": "user", "timeout_s": 0.2}), "did not reply within 0.2 s"),
        (Malformed({"name": "user"}), "failed: ValueError"),
    ],
    ids=["raises", "hangs", "malformed"],
)
def test_a_failing_interaction_ends_its_own_trajectory_only(engine, interaction, error, caplog):
    interactions = {"user": interaction, **build_interactions(VERL_GSM8K_CONFIG)}
    loops = build_agent_loops(context(engine, interactions), {"tool_agent"})
    failing = AgentSample(conversation(INTERACTION[0]), "tool_agent", interaction_kwargs={"name": "user"})
    bad, good = run_agent_loops(engine, loops, [failing, gsm8k_sample()], GREEDY, engine.pad_token_id)
    assert (bad.stop_reason, bad.interaction_errors, bad.assistant_turns, bad.user_turns) == (
        "interaction_error",
        1,
        1,
        0,
    )
    assert sum(bad.response_mask) == len(bad.response_mask), "nothing was inserted after the failure"
    assert good.stop_reason == "interaction_done" and good.turn_scores == [0.0, 1.0]
    assert agent_metrics([bad, good])["agent/interaction_errors/mean"] == 0.5
    assert error in caplog.text


def test_rows_that_name_no_or_an_unknown_interaction_are_refused(engine):
    loops = build_agent_loops(context(engine, build_interactions(VERL_GSM8K_CONFIG)), {"tool_agent"})
    for kwargs, message in [
        ({"ground_truth": "7"}, "interaction_kwargs needs a 'name'"),
        ({"name": "weather"}, r"name='weather' is not in the interaction config \(it has: gsm8k\)"),
    ]:
        sample = AgentSample(conversation("hi"), "tool_agent", interaction_kwargs=kwargs)
        with pytest.raises(ValueError, match=message):
            run_agent_loops(engine, loops, [sample], GREEDY, engine.pad_token_id)
    with pytest.raises(ValueError, match="needs a ground_truth"):
        run_agent_loops(engine, loops, [gsm8k_sample(ground_truth=None)], GREEDY, engine.pad_token_id)


def test_the_interaction_config_as_verl_writes_it(tmp_path):
    path = tmp_path / "interaction.yaml"
    path.write_text(yaml.safe_dump(VERL_GSM8K_CONFIG))
    [(name, interaction)] = load_interactions(str(path)).items()
    assert name == "gsm8k" and isinstance(interaction, Gsm8kInteraction) and interaction.name == "gsm8k"
    # verl's default name: the class name without "Interaction", lower-cased
    unnamed = {"interaction": [{"class_name": "gsm8k"}, {"class_name": f"{__name__}.Raising", "config": {"x": 1}}]}
    built = build_interactions(unnamed)
    assert sorted(built) == ["gsm8k", "raising"] and built["raising"].config == {"x": 1, "name": "raising"}
    for document, message in [
        ({"interactions": []}, "expected a mapping with an 'interaction' list"),
        ({"interaction": [{"name": "a"}]}, r"interaction\[0\]: each interaction needs a class_name"),
        ({"interaction": [{"class_name": "gsm8k"}, {"class_name": "gsm8k"}]}, "a second interaction named 'gsm8k'"),
        ({"interaction": [{"class_name": "no_such"}]}, "no_such"),
        ({"interaction": [{"class_name": "no.such.Module"}]}, "neither registered nor importable"),
        ({"interaction": [{"class_name": "collections.OrderedDict"}]}, "is not a subclass of"),
        ({"interaction": [{"class_name": "gsm8k", "config": [1]}]}, "config must be a mapping"),
    ]:
        with pytest.raises(ValueError, match=message):
            build_interactions(document)


def test_gsm8k_interaction_as_verl():
    interaction = Gsm8kInteraction({"name": "gsm8k"})
    interaction.start_interaction("a", name="gsm8k", ground_truth="72")
    wrong = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "#### 71"}]
    assert interaction.generate_response("a", wrong, name="gsm8k") == (False, INCORRECT, 0.0, {})
    right = [*wrong, {"role": "user", "content": INCORRECT}, {"role": "assistant", "content": "so #### 72"}]
    assert interaction.generate_response("a", right) == (True, CORRECT, 1.0, {})
    # strict extraction, as verl's: an answer without "####" is wrong
    assert interaction.generate_response("a", [{"role": "assistant", "content": "72"}])[2] == 0.0
    interaction.finalize_interaction("a")
    with pytest.raises(KeyError):
        interaction.calculate_score("a")
