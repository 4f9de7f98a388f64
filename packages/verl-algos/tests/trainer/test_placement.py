"""Placement: roles mapped to resource pools (``verl.algos.config.placement``), checked before Ray starts,
and a PPO run whose critic has a pool of its own that takes exactly the colocated run's steps."""

from __future__ import annotations

import json
import logging
import re

import pytest
from cli_runs import comparable, tiny_overrides, write_reward

from verl.algos.config import load_config
from verl.algos.config.consistency import check_consistency
from verl.algos.config.placement import GLOBAL_POOL, plan_placement
from verl.algos.tracking import read_metrics
from verl.algos.trainer.main import run
from verl.core.config import ConfigError

NO_VALIDATION = ("trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.val_before_train=false")
CRITIC_POOL = ["critic.enable_resource_pool=true", "critic.n_gpus_per_node=2", "critic.nnodes=1"]


def test_by_default_every_role_shares_the_global_pool():
    placement = plan_placement(load_config("ppo", ["trainer.n_gpus_per_node=2", "reward_model.enable=true"]))
    assert placement.pools == {GLOBAL_POOL: [2]}
    assert placement.roles == {"actor_rollout_ref": GLOBAL_POOL, "critic": GLOBAL_POOL, "rm": GLOBAL_POOL}
    assert placement.processes == 2 and placement.world("critic") == 2


def test_the_critic_and_the_reward_model_get_pools_of_their_own():
    cfg = load_config(
        "ppo",
        [
            "trainer.n_gpus_per_node=2",
            "critic.enable_resource_pool=true",
            "critic.n_gpus_per_node=1",
            "critic.nnodes=1",
            "reward_model.enable=true",
            "reward_model.enable_resource_pool=true",
            "reward_model.n_gpus_per_node=3",
            "reward_model.nnodes=1",
        ],
    )
    placement = plan_placement(cfg)
    assert placement.pools == {GLOBAL_POOL: [2], "critic_pool": [1], "reward_pool": [3]}
    assert placement.roles == {"actor_rollout_ref": GLOBAL_POOL, "critic": "critic_pool", "rm": "reward_pool"}
    assert placement.processes == 6 and placement.world("critic") == 1 and placement.world("rm") == 3


@pytest.mark.parametrize(
    ("recipe", "overrides", "message"),
    [
        (
            "ppo",
            ["critic.enable_resource_pool=true"],
            r"critic.enable_resource_pool=true needs critic.n_gpus_per_node > 0",
        ),
        (
            "ppo",
            ["critic.enable_resource_pool=true", "critic.n_gpus_per_node=2"],
            r"needs critic.nnodes > 0",
        ),
        ("grpo", CRITIC_POOL, r"this run has no critic \(algorithm.adv_estimator=grpo uses no critic\)"),
        (
            "grpo",
            ["reward_model.enable_resource_pool=true", "reward_model.nnodes=1"],
            r"this run has no reward model \(reward_model.enable=false\)",
        ),
        (
            "ppo",
            [
                "critic.enable_resource_pool=true",
                "critic.n_gpus_per_node=3",
                "critic.nnodes=1",
                "critic.fsdp_config.fsdp_size=2",
            ],
            r"critic.fsdp_config.fsdp_size=2 cannot shard critic.nnodes x critic.n_gpus_per_node = 3 ranks",
        ),
        (
            "ppo",
            [
                "critic.enable_resource_pool=true",
                "critic.n_gpus_per_node=1",
                "critic.nnodes=1",
                "critic.ulysses_sequence_parallel_size=2",
            ],
            r"critic.ulysses_sequence_parallel_size=2 must divide critic.nnodes x critic.n_gpus_per_node = 1 ranks",
        ),
    ],
)
def test_an_impossible_mapping_is_refused_before_ray_starts(recipe, overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_consistency(load_config(recipe, ["trainer.n_gpus_per_node=2", *overrides]))


@pytest.mark.slow
def test_ppo_with_the_critic_on_its_own_pool_takes_the_colocated_runs_steps(
    tiny_model_dir, tmp_path, ray_session, caplog
):
    """Two processes for actor, rollout and reference, two more for the critic: the same batches reach the
    same critic (same data-parallel size), so every metric but wall-clock timings is the colocated run's."""
    reward = write_reward(tmp_path)
    records, pools = {}, {}
    for name, extra in (("colocated", []), ("critic_pool", CRITIC_POOL)):
        out = tmp_path / name
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="verl.train"):
            run(load_config("ppo", tiny_overrides(tiny_model_dir, out, reward, 2, *NO_VALIDATION, *extra)))
        records[name] = read_metrics(str(out))
        pools[name] = placement_lines(caplog.text)
    colocated, apart = records["colocated"], records["critic_pool"]
    assert [r["step"] for r in apart] == [r["step"] for r in colocated] and len(apart) >= 2
    assert any("critic/vf_loss" in r for r in apart)
    for mine, theirs in zip(apart, colocated):
        assert comparable(mine) == comparable(theirs)
    # ... and the critic really ran in processes of its own
    assert pools["colocated"] == {GLOBAL_POOL: (pools["colocated"][GLOBAL_POOL][0], "actor_rollout_ref, critic")}
    (shared, shared_roles), (own, own_roles) = pools["critic_pool"][GLOBAL_POOL], pools["critic_pool"]["critic_pool"]
    assert (shared_roles, own_roles) == ("actor_rollout_ref", "critic")
    assert len(shared) == len(own) == 2 and not set(shared) & set(own)


def placement_lines(log: str) -> dict[str, tuple[list[int], str]]:
    """pool -> (worker pids, roles), from the run log's placement lines."""
    found = re.findall(r"placement: (\w+), pids (\[[\d, ]+\]): ([\w, ]+)", log)
    return {pool: (json.loads(pids), roles.strip()) for pool, pids, roles in found}
