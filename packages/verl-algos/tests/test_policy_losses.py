"""Policy losses against references written from their papers' formulas (loops over tokens), values
and gradients, with masks that include an empty response."""

from __future__ import annotations

import math

import pytest
import torch
from algos_test_helpers import agg_reference, random_mask

from verl.algos.losses.aggregation import LOSS_AGG_MODES, LossNormalizer
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


# ------------------------------------------------------------------ cispo, sapo, geo_mean (GMPO)


def per_token(fn, *tensors):
    """A [batch, length] loss matrix built token by token from fn(i, t) (autograd flows through it)."""
    b, n = tensors[0].shape
    return torch.stack([torch.stack([fn(i, t) for t in range(n)]) for i in range(b)])


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_cispo_weights_the_log_prob_by_the_clipped_stopped_ratio(mode):
    old, log_prob, adv, mask = inputs(6, spread=0.4)
    low, high = 0.2, 0.28

    def token(i, t):
        rho = math.exp(min(max(float(log_prob[i, t].detach() - old[i, t]), -20), 20))
        return -min(max(rho, 1 - low), 1 + high) * float(adv[i, t]) * log_prob[i, t]

    ref = agg_reference(per_token(token, mask), mask, mode, scale=mask.shape[-1])
    config = {"clip_ratio_low": low, "clip_ratio_high": high}
    loss, metrics = get_policy_loss("cispo")(old, log_prob, adv, mask, loss_agg_mode=mode, config=config)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(grads_of(loss, log_prob), grads_of(ref, log_prob))
    ratios = torch.exp(log_prob - old).detach()
    clipped = [[bool(r < 1 - low or r > 1 + high) for r in row] for row in ratios]
    assert metrics["actor/pg_clipfrac"] == pytest.approx(token_mean(clipped, mask))
    assert 0 < metrics["actor/pg_clipfrac"] < 1, "the inputs must clip some tokens and not others"


def test_cispo_keeps_the_gradient_of_clipped_tokens_where_ppo_drops_it():
    log_prob = torch.full((1, 1), math.log(2.0), requires_grad=True)  # ratio 2: outside 1 +- 0.2
    one = torch.ones(1, 1)
    ppo, _ = get_policy_loss("vanilla")(torch.zeros(1, 1), log_prob, one, one)
    cispo, _ = get_policy_loss("cispo")(torch.zeros(1, 1), log_prob, one, one)
    assert grads_of(ppo, log_prob).item() == 0.0
    assert grads_of(cispo, log_prob).item() == pytest.approx(-1.2)  # -clip(2) * A


def sapo_reference(old, log_prob, adv, mask, tau_pos, tau_neg):
    def token(i, t):
        rho = torch.exp(torch.clamp(log_prob[i, t] - old[i, t], -20, 20))
        tau = tau_pos if adv[i, t] > 0 else tau_neg
        return -float(adv[i, t]) * torch.sigmoid(tau * (rho - 1)) * 4 / tau

    return agg_reference(per_token(token, mask), mask, "seq-mean-token-mean", scale=1)


@pytest.mark.parametrize("tau_pos,tau_neg", [(1.0, 1.05), (2.0, 8.0)])
def test_sapo_gates_the_ratio_smoothly_per_sign(tau_pos, tau_neg):
    old, log_prob, adv, mask = inputs(7, spread=0.5)
    config = {"tau_pos": tau_pos, "tau_neg": tau_neg}
    # sapo always averages per sequence (verl), whatever loss_agg_mode says
    loss, metrics = get_policy_loss("sapo")(old, log_prob, adv, mask, loss_agg_mode="token-mean", config=config)
    ref = sapo_reference(old, log_prob, adv, mask, tau_pos, tau_neg)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(grads_of(loss, log_prob), grads_of(ref, log_prob))
    assert metrics["actor/pg_clipfrac"] == 0.0


def test_sapo_on_policy_gradient_is_the_policy_gradient():
    """At ratio 1 the gate has slope 1, so the gradient is -A grad(log_prob), as for PPO."""
    old, log_prob, adv, mask = inputs(8)
    on_policy = log_prob.detach().clone().requires_grad_(True)
    sapo, _ = get_policy_loss("sapo")(on_policy.detach(), on_policy, adv, mask, config={"tau_pos": 3.0})
    ppo, _ = get_policy_loss("vanilla")(on_policy.detach(), on_policy, adv, mask, loss_agg_mode="seq-mean-token-mean")
    torch.testing.assert_close(grads_of(sapo, on_policy), grads_of(ppo, on_policy))


def geo_mean_reference(old, log_prob, adv, mask, low, high, weights=None):
    """GMPO per sequence with loops: l_i = -mean_t(A) * exp(mean_t d'_t), mean over non-empty sequences."""
    total, count = log_prob.new_zeros(()), 0
    for i in range(mask.shape[0]):
        valid = [t for t in range(mask.shape[1]) if mask[i, t]]
        if not valid:
            continue
        clipped_sum = log_prob.new_zeros(())
        for t in valid:
            d = log_prob[i, t] - old[i, t]
            sign = float(torch.sign(adv[i, t]))
            clamped = torch.clamp(d, -low, high)
            clipped_sum = clipped_sum + sign * torch.minimum(sign * d, sign * clamped)
        a = sum(float(adv[i, t]) for t in valid) / len(valid)
        seq_loss = -a * torch.exp(clipped_sum / len(valid))
        if weights is not None:
            seq_loss = seq_loss * math.exp(sum(math.log(float(weights[i, t]) + 1e-10) for t in valid) / len(valid))
        total = total + seq_loss
        count += 1
    return total / count


@pytest.mark.parametrize("low,high", [(0.4, 0.4), (0.1, 0.3)])
def test_geo_mean_is_gmpo_on_the_geometric_mean_ratio(low, high):
    old, log_prob, _, mask = inputs(9, spread=0.4)
    seq_adv = torch.randn(mask.shape[0], 1, generator=torch.Generator().manual_seed(10))
    adv = seq_adv.expand_as(mask).contiguous()
    config = {"clip_ratio_low": low, "clip_ratio_high": high}
    loss, metrics = get_policy_loss("geo_mean")(old, log_prob, adv, mask, config=config)
    ref = geo_mean_reference(old, log_prob, adv, mask, low, high)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(grads_of(loss, log_prob), grads_of(ref, log_prob))
    d = (log_prob - old).detach()
    clipped = (d < -low) | (d > high)
    pos = [[bool(c and a > 0) for c, a in zip(cr, ar)] for cr, ar in zip(clipped, adv)]
    neg = [[bool(c and a < 0) for c, a in zip(cr, ar)] for cr, ar in zip(clipped, adv)]
    assert metrics["actor/pg_clipfrac"] == pytest.approx(token_mean(pos, mask))
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(token_mean(neg, mask))
    assert metrics["actor/pg_clipfrac"] + metrics["actor/pg_clipfrac_lower"] > 0


@pytest.mark.parametrize("name", ["vanilla", "gpg", "cispo", "clip_cov", "kl_cov"])
def test_token_losses_multiply_by_the_rollout_is_weights(name):
    """Decoupled rollout correction: l_t -> w_t l_t before aggregation, no gradient through w."""
    old, log_prob, adv, mask = inputs(11, spread=0.3)
    weights = torch.rand(mask.shape, generator=torch.Generator().manual_seed(12)) * 2 * mask
    config = {"policy_loss": {"clip_cov_lb": 100.0, "kl_cov_ratio": 1e-9}}  # no cov token picked / one token
    fn = get_policy_loss(name)
    plain = torch.ones_like(weights)
    loss_w, _ = fn(old, log_prob, adv, mask, config=config, rollout_is_weights=weights)
    loss_1, _ = fn(old, log_prob, adv, mask, config=config, rollout_is_weights=plain)
    loss_none, _ = fn(old, log_prob, adv, mask, config=config)
    torch.testing.assert_close(loss_1, loss_none)
    # the weighted loss is the reference per-token loss times w: compare through the gradient, which for a
    # token-wise loss l_t(log_prob_t) is w_t times the unweighted one
    torch.testing.assert_close(grads_of(loss_w, log_prob), grads_of(loss_none, log_prob) * weights)


def test_sequence_losses_weight_by_the_rollout_is_weights():
    old, log_prob, adv, mask = inputs(13, spread=0.3)
    weights = (0.5 + torch.rand(mask.shape, generator=torch.Generator().manual_seed(14))) * mask
    loss, _ = get_policy_loss("geo_mean")(old, log_prob, adv, mask, rollout_is_weights=weights)
    torch.testing.assert_close(loss, geo_mean_reference(old, log_prob, adv, mask, 0.2, 0.2, weights))
    ref = sapo_reference(old, log_prob, adv, mask, 1.0, 1.05)
    loss_sapo, _ = get_policy_loss("sapo")(old, log_prob, adv, mask, rollout_is_weights=weights)

    def token(i, t):
        rho = torch.exp(log_prob[i, t] - old[i, t])
        tau = 1.0 if adv[i, t] > 0 else 1.05
        return -float(adv[i, t]) * torch.sigmoid(tau * (rho - 1)) * 4 / tau * float(weights[i, t])

    torch.testing.assert_close(loss_sapo, agg_reference(per_token(token, mask), mask, "seq-mean-token-mean", 1))
    assert not torch.allclose(loss_sapo, ref)


@pytest.mark.parametrize("name", ["cispo", "sapo", "geo_mean"])
def test_new_losses_honour_the_global_normalizer_and_edge_cases(name):
    old, log_prob, adv, mask = inputs(15, spread=0.2)
    mode = {"cispo": "token-mean", "sapo": "seq-mean-token-mean", "geo_mean": "token-mean"}[name]
    fn = get_policy_loss(name)
    whole, _ = fn(old, log_prob, adv, mask, loss_agg_mode=mode)
    normalizer = LossNormalizer.from_mask(mask)
    halves = [
        fn(old[s], log_prob[s], adv[s], mask[s], loss_agg_mode=mode, normalizer=normalizer)[0]
        for s in (slice(0, 3), slice(3, None))
    ]
    torch.testing.assert_close(halves[0] + halves[1], whole)
    # a single sample, and a micro-batch of empty responses: finite, and nothing to learn from the latter
    single, _ = fn(old[:1], log_prob[:1], adv[:1], mask[:1], loss_agg_mode=mode)
    assert torch.isfinite(single)
    empty, metrics = fn(old, log_prob, adv, torch.zeros_like(mask), loss_agg_mode=mode)
    assert empty.item() == 0.0 and all(math.isfinite(v) for v in metrics.values())
    assert grads_of(empty, log_prob).abs().sum() == 0


def test_sapo_refuses_a_non_positive_temperature():
    old, log_prob, adv, mask = inputs(0)
    with pytest.raises(ValueError, match="tau_neg"):
        get_policy_loss("sapo")(old, log_prob, adv, mask, config={"tau_neg": 0.0})


def test_registry_has_verls_newer_losses():
    assert {"cispo", "sapo", "geo_mean", "bypass_mode"} <= set(POLICY_LOSSES.names())
