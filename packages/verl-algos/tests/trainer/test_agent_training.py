"""Agent loops from ``verl train`` with verl's keys (``actor_rollout_ref.rollout.multi_turn.*``, the data rows'
``agent_name``, ``extra_info.tools_kwargs`` and ``extra_info.interaction_kwargs``): GRPO on a tiny model that has
learnt to call a calculator tool and to answer the gsm8k interaction (the agent-loop tests' scripted model). The
rollouts call the tool, the tool's output is in the response the reward function reads and out of the loss
(``response_mask``); the interaction replies between turns and its scores reach the reward function; the run
trains and reports the agent metrics; on the hf rollout and (in the tests-vllm session) on vLLM."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from agent_scripts import CALC, INTERACTION, SCRIPTS, scripted_model  # noqa: F401  (a fixture)

from verl.algos.config import load_config
from verl.algos.tracking import read_metrics
from verl.algos.trainer.main import evaluate, run

pytestmark = pytest.mark.usefixtures("ray_session")

#: The reward reads the whole response: 1 when the tool's answer (inserted between the model's turns) is in it;
#: an interaction row's reward is the interaction's last score.
REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if extra_info["turn_scores"]:
        return extra_info["turn_scores"][-1]
    return float(ground_truth in solution_str)
"""

#: verl's gsm8k interaction config.
INTERACTIONS = {
    "interaction": [
        {"name": "gsm8k", "class_name": "verl.interactions.gsm8k_interaction.Gsm8kInteraction", "config": {}}
    ]
}


def agent_rows() -> list[dict]:
    rows = []
    for index, (question, _, tool_text, _) in enumerate(SCRIPTS[:2]):
        rows.append(
            {
                "data_source": "scripted_calc",
                "prompt": [{"role": "user", "content": question}],
                "reward_model": {"style": "rule", "ground_truth": tool_text},
                "agent_name": "tool_agent",
                "extra_info": {"index": index},
            }
        )
    question = INTERACTION[0]
    rows.append(
        {
            "data_source": "scripted_gsm8k",
            "prompt": [{"role": "user", "content": question}],
            "reward_model": {"style": "rule", "ground_truth": "7"},
            "agent_name": "tool_agent",
            "extra_info": {"index": 2, "interaction_kwargs": {"name": "gsm8k", "ground_truth": "7"}},
        }
    )
    return rows


@pytest.mark.parametrize(
    "rollout",
    [
        pytest.param(["actor_rollout_ref.rollout.name=hf"], id="hf"),
        pytest.param(  # the agent loops on a rollout pool of their own, fully async: a push after each step
            [
                "actor_rollout_ref.rollout.name=hf",
                "async_training.mode=fully_async",
                "async_training.trigger_parameter_sync_step=1",
                "async_training.staleness_threshold=1",
                "async_training.partial_rollout=false",
                "actor_rollout_ref.actor.ppo_mini_batch_size=3",
                "actor_rollout_ref.hybrid_engine=false",
                "trainer.n_gpus_per_node=1",
                "rollout.n_gpus_per_node=1",
                "algorithm.rollout_correction.bypass_mode=true",
                "actor_rollout_ref.rollout.calculate_log_probs=true",
            ],
            id="hf-fully_async",
        ),
        pytest.param(  # in the tests-vllm session
            [
                "actor_rollout_ref.rollout.name=vllm",
                "+actor_rollout_ref.rollout.engine_kwargs.kv_cache_memory_bytes=33554432",
            ],
            id="vllm",
            marks=pytest.mark.vllm,
        ),
    ],
)
def test_grpo_with_the_tool_agent(scripted_model, tmp_path, rollout, capsys):
    model_path = scripted_model[0]
    data = tmp_path / "calc.parquet"
    pq.write_table(pa.Table.from_pylist(agent_rows()), data)
    tools = tmp_path / "tools.yaml"
    tools.write_text(yaml.safe_dump({"tools": [CALC]}))
    interactions = tmp_path / "interactions.yaml"
    interactions.write_text(yaml.safe_dump(INTERACTIONS))
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD)
    out = tmp_path / "run"
    rows_and_loops = [
        f"data.train_files={data}",
        f"data.val_files={data}",
        "data.train_batch_size=3",
        "data.max_prompt_length=32",
        "data.max_response_length=96",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.temperature=0.3",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
        f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={interactions}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        f"custom_reward_function.path={reward}",
        "trainer.n_gpus_per_node=2",
        *rollout,
    ]
    run(
        load_config(
            "grpo",
            [
                f"actor_rollout_ref.model.path={model_path}",
                *rows_and_loops,
                "actor_rollout_ref.actor.optim.lr=1e-4",
                # the scripted answers are all right (equal rewards, zero advantages): entropy moves the weights
                "actor_rollout_ref.actor.entropy_coeff=0.01",
                f"trainer.default_local_dir={out}",
                "trainer.total_training_steps=2",
                "trainer.total_epochs=2",
                "trainer.val_before_train=true",
                "trainer.test_freq=2",
                "trainer.save_freq=-1",
                "trainer.logger=[file]",
                "trainer.plot_curves=false",
            ],
        )
    )
    records = read_metrics(str(out))
    # validation runs the same agent loops: the tool's answer reaches the reward before any training
    assert records[0]["step"] == 0 and records[0]["val/acc"] > 0
    # ... and reports the agent metrics over the validation trajectories: 6*7's call is the one that runs
    assert records[0]["val/agent/good_call_rate"] == pytest.approx(1 / 3)
    assert records[0]["val/agent/interaction_turns/mean"] == pytest.approx(2 / 3)
    metrics = [m for m in records if "actor/grad_norm" in m]
    assert [m["step"] for m in metrics] == [1, 2]
    if "async_training.mode=fully_async" in rollout:  # step 1's trajectories came from the initial weights
        assert metrics[0]["async/staleness_max"] == 0.0 and metrics[1]["async/staleness_max"] in (0.0, 1.0)
    for m in metrics:
        # every rank's rows: one calculator call on each tool row, the 1/0 prompt's an error (half of the calls)
        assert m["agent/tool_calls/mean"] == pytest.approx(2 / 3) and m["agent/tool_error_rate"] == 0.5
        assert m["agent/assistant_turns/mean"] == 2.0
        # the interaction row: "try again" after the wrong answer (score 0), "correct" after the right one (1)
        assert m["agent/interaction_turns/mean"] == pytest.approx(2 / 3) and m["agent/turn_score/mean"] == 0.5
        assert 0 < m["agent/masked_token_share"] < 1  # the tool's tokens are out of the loss
        assert m["critic/score/mean"] > 0  # the reward saw the tool's answer in the response
        assert m["actor/grad_norm"] > 0

    # `verl eval` runs the same loops on the same rows and shows the good-call rate beside the accuracy
    capsys.readouterr()
    assert evaluate(model_path, "grpo", [*rows_and_loops, f"trainer.default_local_dir={tmp_path / 'eval'}"]) == 0
    printed = capsys.readouterr()
    assert "val/agent/good_call_rate=0.3333" in printed.out + printed.err, printed
