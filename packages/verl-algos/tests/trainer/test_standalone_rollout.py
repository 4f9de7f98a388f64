"""The rollout on a pool of its own (``actor_rollout_ref.hybrid_engine=false``): the placement it plans,
and a GRPO run on vLLM whose rollout workers receive the actor's weights over the weight channel after every
update and so take exactly the hybrid engine's steps (on hf: ``test_one_step_off``, whose run ends with the
weights of a reference on the hybrid engine)."""

from __future__ import annotations

import logging

import pytest
from algos_test_helpers import build_tiny_tokenizer
from cli_runs import comparable, tiny_overrides, write_reward
from test_one_step_off import assert_same_run
from test_placement import NO_VALIDATION, placement_lines
from verl_test_models import write_causal_lm

from verl.algos.config import load_config
from verl.algos.config.consistency import check_consistency
from verl.algos.config.placement import GLOBAL_POOL, ROLLOUT_POOL, plan_placement
from verl.algos.tracking import read_metrics
from verl.algos.trainer.main import run

STANDALONE = ["actor_rollout_ref.hybrid_engine=false", "rollout.nnodes=1", "rollout.n_gpus_per_node=2"]


def test_hybrid_engine_false_puts_the_rollout_on_the_rollout_sections_pool():
    cfg = load_config("grpo", ["trainer.n_gpus_per_node=3", *STANDALONE])
    placement = plan_placement(cfg)
    assert placement.pools == {GLOBAL_POOL: [3], ROLLOUT_POOL: [2]}
    assert placement.roles == {"actor_rollout_ref": GLOBAL_POOL, "rollout": ROLLOUT_POOL}
    assert placement.processes == 5 and placement.world("rollout") == 2


def test_the_rollout_pool_is_not_held_to_the_megatron_layout():
    """TP2 x PP2 needs a multiple of 4 training ranks; the rollout pool's 1 rank serves the rollout engine."""
    cfg = load_config(
        "grpo",
        [
            "trainer.n_gpus_per_node=4",
            "actor_rollout_ref.actor.strategy=megatron",
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
            "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
            "actor_rollout_ref.hybrid_engine=false",
            "rollout.n_gpus_per_node=1",
        ],
    )
    check_consistency(cfg)


@pytest.mark.parametrize("key", ["rollout.n_gpus_per_node", "rollout.nnodes"])
def test_an_empty_rollout_pool_is_refused(key):
    with pytest.raises(ValueError, match=f"{key.split('.')[1]}"):
        load_config("grpo", ["actor_rollout_ref.hybrid_engine=false", f"{key}=0"])


@pytest.fixture(scope="module")
def head_dim_32_model(tmp_path_factory) -> str:
    """The tiny model's tokenizer and size with head_dim 32, the smallest vLLM's CPU attention takes."""
    folder = str(tmp_path_factory.mktemp("head-dim-32"))
    return write_causal_lm(folder, build_tiny_tokenizer(), hidden_size=64, num_heads=2, num_kv_heads=1)


def without_sync_details(record: dict) -> dict:
    """What both placements log alike: not timings, nor how the weights travelled."""
    return {k: v for k, v in comparable(record).items() if not k.startswith("weight_sync/")}


VLLM = [
    "actor_rollout_ref.rollout.name=vllm",
    "+actor_rollout_ref.rollout.engine_kwargs.kv_cache_memory_bytes=33554432",
]


@pytest.mark.slow
@pytest.mark.vllm  # in the tests-vllm session; on hf, test_one_step_off runs the rollout on its own pool
def test_grpo_with_the_rollout_on_its_own_pool_takes_the_hybrid_engines_steps(
    head_dim_32_model, tmp_path, ray_session, caplog
):
    """vLLM: one process trains, one more generates, against the hybrid engine in one process. The same seeds
    reach one rollout replica in both runs, so the samples are the hybrid run's only if each push delivered
    exactly the actor's updated weights; the rollout's own log-probs equal the trainer's at every step."""
    reward = write_reward(tmp_path)
    records, pools = {}, {}
    common = ["actor_rollout_ref.rollout.calculate_log_probs=true", "trainer.n_gpus_per_node=1", *NO_VALIDATION, *VLLM]
    apart = ["actor_rollout_ref.hybrid_engine=false", "rollout.nnodes=1", "rollout.n_gpus_per_node=1"]
    for name, extra in (("hybrid", []), ("standalone", apart)):
        out = tmp_path / name
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="verl.train"):
            run(load_config("grpo", tiny_overrides(head_dim_32_model, out, reward, 3, *common, *extra)))
        records[name] = read_metrics(str(out))
        pools[name] = placement_lines(caplog.text)
    hybrid, standalone = records["hybrid"], records["standalone"]
    assert [r["step"] for r in standalone] == [r["step"] for r in hybrid] and len(standalone) == 3
    for mine, theirs in zip(standalone, hybrid):
        assert_same_run(without_sync_details(mine), without_sync_details(theirs))
        assert mine["training/rollout_log_prob_diff_max"] < 1e-4
        assert mine["timing_s/weight_sync"] > 0 and mine["weight_sync/mb"] > 0
    # ... and the rollout really ran in a process of its own
    (trainer_pids, trainer_roles), (rollout_pids, rollout_roles) = (
        pools["standalone"][GLOBAL_POOL],
        pools["standalone"][ROLLOUT_POOL],
    )
    assert (trainer_roles, rollout_roles) == ("actor_rollout_ref", "rollout")
    assert len(trainer_pids) == len(rollout_pids) == 1 and not set(trainer_pids) & set(rollout_pids)


@pytest.mark.slow
@pytest.mark.vllm  # in the tests-vllm session; on hf, test_fully_async
def test_fully_async_with_partial_rollouts_on_vllm(head_dim_32_model, tmp_path, ray_session):
    """The fully asynchronous schedule on vLLM: the rollout runs ahead of training, pushes land between
    generation calls of 4 tokens, and rows cut by a push continue on the new weights from their prefix; every
    step trains the next batch of the data order, on samples at most the bound old."""
    reward = write_reward(tmp_path)
    out = tmp_path / "run"
    overrides = tiny_overrides(
        head_dim_32_model,
        out,
        reward,
        4,
        "trainer.n_gpus_per_node=1",
        "rollout.n_gpus_per_node=1",
        "data.max_response_length=16",
        "async_training.trigger_parameter_sync_step=1",
        "async_training.staleness_threshold=1",
        "async_training.partial_rollout_tokens=4",
        *NO_VALIDATION,
        *VLLM,
    )
    run(load_config("grpo_async", overrides))
    records = read_metrics(str(out))
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert [r["async/data_batch"] for r in records] == [0, 1, 2, 3]
    for r in records:
        assert 0.0 <= r["async/staleness_max"] <= 1 + 2  # a push after every step, 2 steps' worth drawn at most
        assert r["timing_s/weight_sync"] >= 0 and r["response_length/max"] <= 16
    assert any(r["async/staleness_max"] > 0 for r in records), "the rollout never ran ahead of training"
    # step 1 trains the initial policy's samples: the PPO ratio (bypass mode: against vLLM's own log-probs of
    # the tokens it sampled) starts at 1
    assert abs(records[0]["actor/ppo_kl"]) < 1e-4
