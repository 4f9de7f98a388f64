"""Rollout correction (verl's algorithm.rollout_correction): importance weights, rejection masks,
off-policy diagnostics and the bypass-mode loss, each against a reference written with loops."""

from __future__ import annotations

import math

import pytest
import torch
from algos_test_helpers import agg_reference, random_mask

from verl.algos.config.schema import PPOConfig
from verl.algos.losses.actor import compute_actor_loss
from verl.algos.losses.aggregation import LossNormalizer
from verl.algos.policy_losses import get_policy_loss
from verl.algos.rollout_correction import (
    RolloutCorrectionConfig,
    apply_bypass_mode,
    apply_decoupled_correction,
    check_rollout_correction,
    offpolicy_metrics,
    parse_rs_options,
    rollout_is_weights,
    rollout_rejection_mask,
)
from verl.core.protocol import DataProto


def logprobs(seed: int, batch: int = 7, length: int = 8, spread: float = 0.3):
    g = torch.Generator().manual_seed(seed)
    mask = random_mask(batch, length, g, empty_rows=(3,))
    rollout = -torch.rand(batch, length, generator=g) * 2
    train = rollout + torch.randn(batch, length, generator=g) * spread
    return train, rollout, mask


def valid(mask, i):
    return [t for t in range(mask.shape[1]) if mask[i, t]]


# ------------------------------------------------------------------ importance weights


def ref_is_weights(train, rollout, mask, level, threshold):
    out = torch.zeros_like(train)
    for i in range(mask.shape[0]):
        ts = valid(mask, i)
        if level == "sequence":
            s = sum(float(train[i, t] - rollout[i, t]) for t in ts)
            w = math.exp(min(max(s, -20), 20))
        for t in ts:
            if level == "token":
                w = math.exp(min(max(float(train[i, t] - rollout[i, t]), -20), 20))
            out[i, t] = min(w, threshold)
    return out


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("threshold", [1.1, 1.3])
def test_truncated_is_weights(level, threshold):
    train, rollout, mask = logprobs(0)
    weights, metrics = rollout_is_weights(train - rollout, mask, level, threshold)
    ref = ref_is_weights(train, rollout, mask, level, threshold)
    torch.testing.assert_close(weights, ref)
    assert not weights.requires_grad and torch.all(weights[3] == 0)
    raw = ref_is_weights(train, rollout, mask, level, float("inf"))
    flat = [float(raw[i, t]) for i in range(mask.shape[0]) for t in valid(mask, i)]
    assert metrics["rollout_is_max"] == pytest.approx(max(flat), rel=1e-5)
    assert metrics["rollout_is_mean"] == pytest.approx(sum(flat) / len(flat), rel=1e-5)
    assert metrics["rollout_is_ratio_fraction_high"] == pytest.approx(sum(w > threshold for w in flat) / len(flat))
    assert 0 < metrics["rollout_is_ratio_fraction_high"] < 1, "the inputs must truncate some weights"


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_batch_normalized_weights_average_one(level):
    train, rollout, mask = logprobs(1)
    weights, metrics = rollout_is_weights(train - rollout, mask, level, 2.0, batch_normalize=True)
    ref = ref_is_weights(train, rollout, mask, level, 2.0)
    if level == "token":
        values = [float(ref[i, t]) for i in range(mask.shape[0]) for t in valid(mask, i)]
    else:
        values = [float(ref[i, valid(mask, i)[0]]) for i in range(mask.shape[0]) if valid(mask, i)]
    norm = sum(values) / len(values)
    torch.testing.assert_close(weights, ref / norm)
    assert metrics["rollout_is_batch_norm_factor"] == pytest.approx(norm, rel=1e-5)


def test_is_weights_refuse_bad_settings():
    train, rollout, mask = logprobs(0)
    with pytest.raises(ValueError, match="rollout_is='tokens'"):
        rollout_is_weights(train - rollout, mask, "tokens", 2.0)
    with pytest.raises(ValueError, match="rollout_is_threshold"):
        rollout_is_weights(train - rollout, mask, "token", 0.0)


# ------------------------------------------------------------------ rejection


def ref_keep(train, rollout, mask, option, lower, upper):
    """1/0 per token: keep under option's rule, by loops."""
    level, kind = option.rsplit("_", 1)
    keep = torch.ones_like(train)
    for i in range(mask.shape[0]):
        ts = valid(mask, i)

        def div(t, i=i):
            d = min(max(float(train[i, t] - rollout[i, t]), -20), 20)
            return {"k1": -d, "k2": 0.5 * d * d, "k3": math.exp(d) - 1 - d}[kind]

        def ok(x):
            if kind == "k1":
                return math.log(lower) <= x <= math.log(upper)
            return x <= upper

        if level == "token":
            for t in range(mask.shape[1]):
                keep[i, t] = float(ok(div(t)))
            continue
        values = [div(t) for t in ts]
        if level == "seq_sum":
            stat = sum(values)
        elif level == "seq_mean":
            stat = sum(values) / len(values) if values else 0.0
        else:
            stat = max(values) if values else 0.0
        keep[i, :] = float(ok(stat))
    return keep


CASES = [
    ("token_k1", "0.8_1.25", 0.8, 1.25),
    ("token_k2", "0.02", None, 0.02),
    ("token_k3", 0.02, None, 0.02),
    ("seq_sum_k1", "0.5_2.0", 0.5, 2.0),
    ("seq_sum_k2", "0.1", None, 0.1),
    ("seq_sum_k3", "0.1", None, 0.1),
    ("seq_mean_k1", 1.1, 1 / 1.1, 1.1),
    ("seq_mean_k2", "0.03", None, 0.03),
    ("seq_mean_k3", "0.03", None, 0.03),
    ("seq_max_k2", "0.1", None, 0.1),
    ("seq_max_k3", "0.1", None, 0.1),
]


@pytest.mark.parametrize("option,spec,lower,upper", CASES)
def test_rejection_options(option, spec, lower, upper):
    train, rollout, mask = logprobs(2)
    kept, metrics = rollout_rejection_mask(train - rollout, mask, option, spec)
    ref = ref_keep(train, rollout, mask, option, lower, upper) * mask
    torch.testing.assert_close(kept, ref)
    assert kept.dtype == mask.dtype
    rejected = [1 - float(ref[i, t]) for i in range(mask.shape[0]) for t in valid(mask, i)]
    assert metrics["rollout_rs_masked_fraction"] == pytest.approx(sum(rejected) / len(rejected))
    assert 0 < metrics["rollout_rs_masked_fraction"] < 1, f"{option}: the inputs must reject some, not all"


def test_rejection_criteria_combine_with_and():
    train, rollout, mask = logprobs(3)
    both, _ = rollout_rejection_mask(train - rollout, mask, "token_k1,seq_mean_k3", "0.8_1.25,0.03")
    first, _ = rollout_rejection_mask(train - rollout, mask, "token_k1", "0.8_1.25")
    second, _ = rollout_rejection_mask(train - rollout, mask, "seq_mean_k3", "0.03")
    torch.testing.assert_close(both, first * second)


@pytest.mark.parametrize(
    "rs,threshold,match",
    [
        ("token_k4", "1.0", "unknown option"),
        ("token_k1", None, "needs rollout_rs_threshold"),
        ("token_k2", "0.1_0.2", "one upper bound"),
        ("token_k1", "2.0_0.5", "lower <= upper"),
        ("token_k1,token_k2", "1.5,0.1,0.2", "one per option"),
        ("seq_mean_k3", "-1", "must be > 0"),
    ],
)
def test_rejection_settings_are_checked(rs, threshold, match):
    with pytest.raises(ValueError, match=match):
        parse_rs_options(rs, threshold)


# ------------------------------------------------------------------ diagnostics


def test_offpolicy_metrics_against_loops():
    train, rollout, mask = logprobs(4)
    m = offpolicy_metrics(train, rollout, mask)
    rows = [i for i in range(mask.shape[0]) if valid(mask, i)]
    tokens = [(i, t) for i in rows for t in valid(mask, i)]
    d = {(i, t): float(train[i, t] - rollout[i, t]) for i, t in tokens}
    assert m["kl"] == pytest.approx(sum(-v for v in d.values()) / len(d), rel=1e-5)
    assert m["k3_kl"] == pytest.approx(sum(math.exp(v) - v - 1 for v in d.values()) / len(d), rel=1e-4)
    assert m["chi2_token"] == pytest.approx(sum(math.exp(v) ** 2 for v in d.values()) / len(d) - 1, rel=1e-4)
    seq = [sum(d[(i, t)] for t in valid(mask, i)) for i in rows]
    assert m["chi2_seq"] == pytest.approx(sum(math.exp(2 * s) for s in seq) / len(seq) - 1, rel=1e-4)
    train_ppl = [math.exp(-sum(float(train[i, t]) for t in valid(mask, i)) / len(valid(mask, i))) for i in rows]
    assert m["training_ppl"] == pytest.approx(sum(train_ppl) / len(train_ppl), rel=1e-5)
    assert offpolicy_metrics(train, rollout, torch.zeros_like(mask)) == {}


# ------------------------------------------------------------------ bypass mode


def loss_inputs(seed: int):
    train, rollout, mask = logprobs(seed, spread=0.2)
    log_prob = train.clone().requires_grad_(True)
    adv = torch.randn(mask.shape, generator=torch.Generator().manual_seed(seed + 100))
    return rollout, log_prob, adv, mask


def grads_of(loss, tensor):
    (g,) = torch.autograd.grad(loss, tensor)
    return g


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum"])
def test_bypass_reinforce_with_is_weights_and_rejection(level, mode):
    rollout, log_prob, adv, mask = loss_inputs(5)
    rc = {"bypass_mode": True, "loss_type": "reinforce", "rollout_is": level, "rollout_is_threshold": 1.5}
    rc |= {"rollout_rs": "token_k1", "rollout_rs_threshold": "0.8_1.25"}
    loss, metrics = get_policy_loss("bypass_mode")(
        rollout, log_prob, adv, mask, loss_agg_mode=mode, rollout_correction=rc
    )
    weights = ref_is_weights(log_prob.detach(), rollout, mask, level, 1.5)
    keep = ref_keep(log_prob.detach(), rollout, mask, "token_k1", 0.8, 1.25) * mask
    per_token = -adv * log_prob * weights * keep
    # rejected tokens stay in the denominator (the mini-batch's normalizer counts the original mask)
    n_tokens = float(mask.sum())
    n_seqs = float((mask.sum(-1) > 0).sum())
    ref = (per_token * mask).sum() / n_tokens if mode == "token-mean" else (per_token * mask).sum() / n_seqs
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(grads_of(loss, log_prob), grads_of(ref, log_prob))
    kl = float(((rollout - log_prob.detach()) * keep).sum() / keep.sum())  # over the kept tokens, as verl
    assert metrics["actor/ppo_kl"] == pytest.approx(kl, rel=1e-5)
    assert 0 < metrics["rollout_corr/rollout_rs_masked_fraction"] < 1
    assert "rollout_corr/rollout_is_mean" in metrics and "rollout_corr/kl" in metrics


def test_bypass_ppo_clip_is_vanilla_against_the_rollout_on_the_kept_tokens():
    rollout, log_prob, adv, mask = loss_inputs(6)
    rc = {"bypass_mode": True, "loss_type": "ppo_clip", "rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.03}
    rc |= {"rollout_is": "sequence"}  # computed for the metrics only: the PPO ratio already is the IS weight
    normalizer = LossNormalizer.from_mask(mask)
    loss, metrics = get_policy_loss("bypass_mode")(
        rollout, log_prob, adv, mask, normalizer=normalizer, rollout_correction=rc
    )
    keep = ref_keep(log_prob.detach(), rollout, mask, "seq_mean_k3", None, 0.03) * mask
    ref, _ = get_policy_loss("vanilla")(rollout, log_prob, adv, keep, normalizer=normalizer)
    torch.testing.assert_close(loss, ref)
    assert 0 < metrics["rollout_corr/rollout_rs_seq_masked_fraction"] < 1


def test_actor_loss_switches_to_bypass_mode_and_passes_decoupled_weights():
    rollout, log_prob, adv, mask = loss_inputs(7)
    rc = {"bypass_mode": True, "loss_type": "reinforce"}
    loss, metrics = compute_actor_loss(log_prob, rollout, adv, mask, config={}, rollout_correction=rc)
    torch.testing.assert_close(loss, agg_reference(-adv * log_prob, mask, "token-mean", 1))
    assert "rollout_corr/kl" in metrics
    weights = torch.rand(mask.shape, generator=torch.Generator().manual_seed(0)) * mask
    decoupled, _ = compute_actor_loss(
        log_prob, rollout, adv, mask, config={}, rollout_is_weights=weights, rollout_correction={"rollout_is": "token"}
    )
    ref, _ = get_policy_loss("vanilla")(rollout, log_prob, adv, mask, rollout_is_weights=weights)
    torch.testing.assert_close(decoupled, ref)


# ------------------------------------------------------------------ on a batch, and the config checks


def batch_of(seed: int) -> DataProto:
    train, rollout, mask = logprobs(seed)
    return DataProto.from_dict({"old_log_probs": train, "rollout_log_probs": rollout, "response_mask": mask})


def test_decoupled_mode_adds_weights_and_rejects_on_the_batch():
    batch = batch_of(8)
    train, rollout, mask = (batch.batch[k].clone() for k in ("old_log_probs", "rollout_log_probs", "response_mask"))
    rc = {"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": "seq_sum_k1", "rollout_rs_threshold": 2.0}
    metrics = apply_decoupled_correction(batch, rc)
    torch.testing.assert_close(batch.batch["rollout_is_weights"], ref_is_weights(train, rollout, mask, "token", 2.0))
    torch.testing.assert_close(
        batch.batch["response_mask"], ref_keep(train, rollout, mask, "seq_sum_k1", 0.5, 2.0) * mask
    )
    assert all(key.startswith("rollout_corr/") for key in metrics)


def test_bypass_mode_takes_the_rollouts_log_probs_as_old():
    batch = batch_of(9)
    apply_bypass_mode(batch)
    assert torch.equal(batch.batch["old_log_probs"], batch.batch["rollout_log_probs"])
    no_rollout = DataProto.from_dict({"response_mask": torch.ones(2, 3)})
    with pytest.raises(ValueError, match="calculate_log_probs=true"):
        apply_bypass_mode(no_rollout)


def config_with(**rc) -> PPOConfig:
    """A run config with these rollout-correction values; the node checks its own values when built."""
    cfg = PPOConfig()
    cfg.algorithm.rollout_correction = RolloutCorrectionConfig(**rc)
    return cfg


@pytest.mark.parametrize(
    "settings,match",
    [
        ({"rollout_is": "seq"}, "rollout_is='seq'"),
        ({"rollout_rs": "token_k1"}, "needs rollout_rs_threshold"),
        ({"loss_type": "reinforce"}, "applies in bypass mode only"),
        ({"loss_type": "pg"}, "loss_type='pg'"),
    ],
)
def test_config_checks(settings, match):
    with pytest.raises(ValueError, match=match):
        check_rollout_correction(config_with(**settings))


def test_config_checks_across_sections():
    cfg = config_with(bypass_mode=True)
    cfg.actor_rollout_ref.actor.policy_loss.loss_mode = "gspo"
    with pytest.raises(ValueError, match="loss_mode='gspo' would be ignored"):
        check_rollout_correction(cfg)
    cfg = config_with(rollout_is="token")
    cfg.actor_rollout_ref.rollout.calculate_log_probs = False
    with pytest.raises(ValueError, match="calculate_log_probs=true"):
        check_rollout_correction(cfg)
    cfg = config_with()
    cfg.actor_rollout_ref.actor.policy_loss.loss_mode = "bypass_mode"
    with pytest.raises(ValueError, match="bypass_mode=true"):
        check_rollout_correction(cfg)
    cfg = config_with(bypass_mode=True)
    cfg.algorithm.adv_estimator = "optimal_token_baseline"
    with pytest.raises(ValueError, match="skips"):
        check_rollout_correction(cfg)
    check_rollout_correction(config_with(bypass_mode=True, loss_type="reinforce", rollout_is="sequence"))
