"""``verl train`` with ``actor_rollout_ref.actor.strategy=veomni``: two GRPO steps with the KL loss (the
actor and the reference on the VeOmni engine) over two CPU workers take the steps the FSDP2 engine takes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runs import tiny_overrides, write_reward

from verl.algos import cli

pytestmark = [pytest.mark.veomni, pytest.mark.usefixtures("ray_session")]

SETTINGS = ["trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1"]
KL = ["actor_rollout_ref.actor.use_kl_loss=true"]
#: Metrics that must agree between the engines (wall-clock ones excluded), and how closely.
EXACT = ("response_length/mean", "rollout/prefill_tokens")
CLOSE = {
    "actor/grad_norm": 1e-4,
    "actor/entropy": 1e-5,
    "actor/pg_loss": 1e-5,
    "actor/kl_loss": 1e-6,
    "critic/advantages/max": 1e-5,
    "critic/score/mean": 1e-5,
    "training/rollout_log_prob_diff_max": 1e-5,
}


def records(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in (json.loads(line) for line in lines if line.strip()) if r.get("step", 0) >= 1]


def test_grpo_on_veomni_takes_the_fsdp2_steps(tiny_model_dir, tmp_path):
    runs = {}
    for strategy in ("fsdp2", "veomni"):
        out, reward = tmp_path / strategy, write_reward(tmp_path)
        extra = [*SETTINGS, *KL, f"actor_rollout_ref.actor.strategy={strategy}"]
        assert cli.main(["train", *tiny_overrides(tiny_model_dir, out, reward, 2, *extra)]) == 0
        runs[strategy] = records(out)
    fsdp, veomni = runs["fsdp2"], runs["veomni"]
    assert [r["step"] for r in veomni] == [1, 2] and len(fsdp) == 2
    assert all(r["actor/grad_norm"] > 0 for r in veomni)
    assert veomni[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # the reference is the initial policy
    for x, y in zip(fsdp, veomni):
        for key in EXACT:
            assert y[key] == x[key], (x["step"], key)
        for key, tol in CLOSE.items():
            assert y[key] == pytest.approx(x[key], rel=tol, abs=tol), (x["step"], key, x[key], y[key])


def test_ppo_with_a_critic_on_veomni_trains_two_steps(tiny_model_dir, tmp_path):
    """The critic on the VeOmni value engine (its head initialised by VeOmni's loader from the causal LM)."""
    out = tmp_path / "run"
    extra = [*SETTINGS, "actor_rollout_ref.actor.strategy=veomni", "critic.strategy=veomni"]
    assert (
        cli.main(["train", "-r", "ppo", *tiny_overrides(tiny_model_dir, out, write_reward(tmp_path), 2, *extra)]) == 0
    )
    steps = records(out)
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        for key in ("actor/grad_norm", "critic/grad_norm", "critic/vf_loss", "actor/entropy"):
            assert key in r and r[key] == r[key], key  # present and not NaN
        assert r["actor/grad_norm"] > 0 and r["critic/grad_norm"] > 0
    assert steps[1]["critic/values/mean"] != steps[0]["critic/values/mean"]  # the critic's update moved it
