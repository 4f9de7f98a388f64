"""Policy losses against references written from their papers' formulas (loops over tokens), values
and gradients, with masks that include an empty response."""

from __future__ import annotations

import math

import pytest
import torch
from algos_test_helpers import agg_reference, random_mask

from verl.algos.loss_agg import LOSS_AGG_MODES, LossNormalizer
from verl.algos.policy_losses import POLICY_LOSSES, get_policy_loss
from verl.core.registry import RegistryError


def inputs(seed: int, batch: int = 6, length: int = 9, spread: float = 1.5):
    g = torch.Generator().manual_seed(seed)
    mask = random_mask(batch, length, g, empty_rows=(2,))
    old = -torch.rand(batch, length, generator=g) * 3
    log_prob = (old + torch.randn(batch, length, generator=g) * spread).requires_grad_(True)
    advantages = torch.randn(batch, length, generator=g)
    return old, log_prob, advantages, mask


def token_mean(values, mask) -> float:
    num = sum(float(values[i][t]) for i in range(len(mask)) for t in range(len(mask[i])) if mask[i][t])
    den = sum(1 for i in range(len(mask)) for t in range(len(mask[i])) if mask[i][t])
    return num / max(den, 1)


def ppo_reference(old, log_prob, adv, mask, low, high, clip_c, mode):
    """PPO-clip + dual-clip per token with explicit loops; returns (loss, clipfrac, clipfrac_lower, ppo_kl)."""
    losses, clipped_flags, lower_flags = [], [], []
    for i in range(mask.shape[0]):
        loss_row, clipped_row, lower_row = [], [], []
        for t in range(mask.shape[1]):
            ratio = torch.exp(torch.clamp(log_prob[i, t] - old[i, t], -20, 20))
            a = float(adv[i, t])
            plain = -a * ratio
            clipped = -a * torch.clamp(ratio, 1 - low, 1 + high)
            loss = torch.maximum(plain, clipped)
            lower = False
            if a < 0:
                lower = loss.item() > -a * clip_c
                loss = torch.minimum(loss, torch.tensor(-a * clip_c))
            loss_row.append(loss)
            clipped_row.append(clipped.item() > plain.item())
            lower_row.append(lower)
        losses.append(torch.stack(loss_row))
        clipped_flags.append(clipped_row)
        lower_flags.append(lower_row)
    return (
        agg_reference(torch.stack(losses), mask, mode, scale=mask.shape[-1]),
        token_mean(clipped_flags, mask),
        token_mean(lower_flags, mask),
        token_mean((old - log_prob).detach(), mask),
    )


def grads_of(loss, tensor):
    (g,) = torch.autograd.grad(loss, tensor)
    return g


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("low,high,clip_c", [(0.2, 0.2, 3.0), (0.2, 0.28, 3.0), (0.1, 0.3, 1.5)])
def test_vanilla_ppo_with_clip_higher_and_dual_clip(mode, low, high, clip_c):
    old, log_prob, adv, mask = inputs(0)
    config = {"clip_ratio": 0.2, "clip_ratio_low": low, "clip_ratio_high": high, "clip_ratio_c": clip_c}
    loss, metrics = get_policy_loss("vanilla")(old, log_prob, adv, mask, loss_agg_mode=mode, config=config)
    ref_loss, clipfrac, clipfrac_lower, ppo_kl = ppo_reference(old, log_prob, adv, mask, low, high, clip_c, mode)
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grads_of(loss, log_prob), grads_of(ref_loss, log_prob))
    assert metrics["actor/pg_clipfrac"] == pytest.approx(clipfrac)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(clipfrac_lower)
    assert metrics["actor/ppo_kl"] == pytest.approx(ppo_kl, rel=1e-5)
    assert metrics["actor/pg_loss"] == pytest.approx(ref_loss.item(), rel=1e-5)
    assert 0 < clipfrac < 1 and clipfrac_lower > 0, "the inputs must exercise both clips"


def test_clip_higher_lets_a_ratio_of_1_25_through_only_with_high_0_28():
    one = torch.ones(1, 1)
    log_prob = torch.full((1, 1), math.log(1.25), requires_grad=True)
    old = torch.zeros(1, 1)
    for high, clipped in ((0.2, 1.0), (0.28, 0.0)):
        loss, metrics = get_policy_loss("vanilla")(old, log_prob, one, one, config={"clip_ratio_high": high})
        assert metrics["actor/pg_clipfrac"] == clipped
        assert grads_of(loss, log_prob).item() == pytest.approx(0.0 if clipped else -1.25)


def test_dual_clip_bounds_the_loss_of_negative_advantages():
    log_prob = torch.full((1, 1), math.log(10.0), requires_grad=True)
    loss, metrics = get_policy_loss("vanilla")(torch.zeros(1, 1), log_prob, -torch.ones(1, 1), torch.ones(1, 1))
    assert loss.item() == pytest.approx(3.0) and metrics["actor/pg_clipfrac_lower"] == 1.0
    assert grads_of(loss, log_prob).item() == 0.0


def test_dual_clip_bound_must_exceed_one():
    old, log_prob, adv, mask = inputs(0)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        get_policy_loss("vanilla")(old, log_prob, adv, mask, config={"clip_ratio_c": 1.0})


def gspo_reference(old, log_prob, adv, mask, low, high):
    """Sequence-level objective of GSPO: l_i = max(-A_i s_i, -A_i clip(s_i)), mean over non-empty sequences."""
    total, count = log_prob.new_zeros(()), 0
    for i in range(mask.shape[0]):
        valid = [t for t in range(mask.shape[1]) if mask[i, t]]
        if not valid:
            continue
        s = torch.exp(sum(log_prob[i, t] - old[i, t] for t in valid) / len(valid))
        a = float(adv[i, valid[0]])
        total = total + torch.maximum(-a * s, -a * torch.clamp(s, 1 - low, 1 + high))
        count += 1
    return total / count


def test_gspo_matches_the_sequence_level_objective():
    old, log_prob, _, mask = inputs(1, spread=0.3)
    seq_adv = torch.randn(mask.shape[0], 1, generator=torch.Generator().manual_seed(9))
    adv = seq_adv.expand_as(mask).contiguous()  # GSPO's advantages are per sequence
    config = {"clip_ratio_low": 0.05, "clip_ratio_high": 0.08}
    loss, metrics = get_policy_loss("gspo")(
        old, log_prob, adv, mask, loss_agg_mode="seq-mean-token-mean", config=config
    )
    ref = gspo_reference(old, log_prob, adv, mask, 0.05, 0.08)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(grads_of(loss, log_prob), grads_of(ref, log_prob))
    assert metrics["actor/pg_clipfrac_lower"] == 0.0


def test_gpg_is_the_plain_policy_gradient():
    old, log_prob, adv, mask = inputs(2)
    for mode in LOSS_AGG_MODES:
        loss, metrics = get_policy_loss("gpg")(old, log_prob, adv, mask, loss_agg_mode=mode)
        ref = agg_reference(-adv * log_prob, mask, mode, scale=mask.shape[-1])
        torch.testing.assert_close(loss, ref)
        torch.testing.assert_close(grads_of(loss, log_prob), grads_of(ref, log_prob))
        assert metrics["actor/pg_clipfrac"] == 0.0


def covariance_grid(adv, log_prob, mask):
    log_prob = log_prob.detach()
    valid = [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t]]
    mean_a = sum(float(adv[i, t]) for i, t in valid) / len(valid)
    mean_lp = sum(float(log_prob[i, t]) for i, t in valid) / len(valid)
    return {(i, t): (float(adv[i, t]) - mean_a) * (float(log_prob[i, t]) - mean_lp) for i, t in valid}


def test_clip_cov_detaches_the_high_covariance_tokens():
    old, log_prob, adv, mask = inputs(3, spread=0.1)
    lb, ub, ratio = 0.3, 2.0, 0.5
    cov = covariance_grid(adv, log_prob, mask)
    candidates = []
    for (i, t), c in cov.items():
        rho = math.exp((log_prob[i, t] - old[i, t]).item())
        a = float(adv[i, t])
        ppo_clipped = -a * min(max(rho, 0.8), 1.2) > -a * rho
        if lb < c < ub and not ppo_clipped:
            candidates.append((i, t))
    budget = max(int(ratio * len(cov)), 1)
    assert 0 < len(candidates) <= budget, "the inputs must pick every candidate (no random choice)"
    config = {"policy_loss": {"clip_cov_ratio": ratio, "clip_cov_lb": lb, "clip_cov_ub": ub}}
    loss, metrics = get_policy_loss("clip_cov")(old, log_prob, adv, mask, config=config)
    keep = torch.ones_like(mask)
    for i, t in candidates:
        keep[i, t] = 0
    ratio_t = torch.exp(log_prob - old)
    per_token = torch.maximum(-adv * ratio_t, -adv * torch.clamp(ratio_t, 0.8, 1.2)) * keep
    ref = agg_reference(per_token, mask, "token-mean", scale=1)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(grads_of(loss, log_prob), grads_of(ref, log_prob))
    assert metrics["actor/pg_clipfrac"] == pytest.approx(len(candidates) / len(cov))


def test_clip_cov_respects_its_budget_when_candidates_exceed_it():
    old, log_prob, adv, mask = inputs(3, spread=0.1)
    n_valid = int(mask.sum())
    config = {"policy_loss": {"clip_cov_ratio": 0.05, "clip_cov_lb": -100.0, "clip_cov_ub": 100.0}}
    _, metrics = get_policy_loss("clip_cov")(
        old, log_prob, adv, mask, config=config, generator=torch.Generator().manual_seed(0)
    )
    assert metrics["actor/pg_clipfrac"] == pytest.approx(max(int(0.05 * n_valid), 1) / n_valid)


@pytest.mark.parametrize("ratio", [0.01, 0.2])
def test_kl_cov_penalizes_the_top_covariance_tokens(ratio):
    old, log_prob, adv, mask = inputs(4, spread=0.5)
    cov = covariance_grid(adv, log_prob, mask)
    k = max(1, int(len(cov) * ratio))
    top = set(sorted(cov, key=cov.get, reverse=True)[:k])
    coef = 0.7
    rows = []
    for i in range(mask.shape[0]):
        row = []
        for t in range(mask.shape[1]):
            d = log_prob[i, t] - old[i, t]
            value = -adv[i, t] * torch.exp(d)
            if (i, t) in top:
                value = value + coef * d.abs()
            row.append(value)
        rows.append(torch.stack(row))
    ref = agg_reference(torch.stack(rows), mask, "token-mean", scale=1)
    config = {"policy_loss": {"kl_cov_ratio": ratio, "ppo_kl_coef": coef}}
    loss, metrics = get_policy_loss("kl_cov")(old, log_prob, adv, mask, config=config)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(grads_of(loss, log_prob), grads_of(ref, log_prob))
    assert metrics["actor/ppo_kl"] == pytest.approx(token_mean((log_prob - old).abs().detach(), mask), rel=1e-5)


@pytest.mark.parametrize("name", ["vanilla", "gspo", "gpg", "clip_cov"])
def test_losses_honour_the_global_normalizer(name):
    """Two halves with the global normalizer (dp_size 1, summed) give the whole batch's loss.
    (kl_cov picks its top-k tokens per micro-batch by design, so it is not split-invariant.)"""
    old, log_prob, adv, mask = inputs(5, spread=0.2)
    config = {"policy_loss": {"clip_cov_lb": 100.0}}  # clip_cov: no token qualifies, as in a split
    mode = "seq-mean-token-mean" if name == "gspo" else "token-mean"
    fn = get_policy_loss(name)
    whole, _ = fn(old, log_prob, adv, mask, loss_agg_mode=mode, config=config)
    normalizer = LossNormalizer.from_mask(mask)
    halves = [
        fn(old[s], log_prob[s], adv[s], mask[s], loss_agg_mode=mode, normalizer=normalizer, config=config)[0]
        for s in (slice(0, 3), slice(3, None))
    ]
    torch.testing.assert_close(halves[0] + halves[1], whole)


def test_registry_names_and_typos():
    assert {"vanilla", "gspo", "gpg", "clip_cov", "kl_cov"} <= set(POLICY_LOSSES.names())
    with pytest.raises(RegistryError, match="vanilla"):
        get_policy_loss("vanila")
