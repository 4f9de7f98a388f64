"""KL estimators against their formulas, the straight-through "+" variants' gradients, the KL loss,
the fixed and adaptive controllers, and the in-reward KL penalty on a DataProto."""

from __future__ import annotations

import math

import pytest
import torch
from algos_test_helpers import random_mask

from verl.algos.losses.kl import KL_ESTIMATORS, compute_kl_loss, kl_penalty
from verl.algos.losses.kl_control import AdaptiveKLController, FixedKLController, apply_kl_penalty, build_kl_controller
from verl.core.protocol import DataProto
from verl.core.registry import RegistryError


def formula(name: str, lp: float, ref: float) -> float:
    """Schulman's estimators with d = log p - log p_ref (samples from p)."""
    d = lp - ref
    if name in ("k1", "kl"):
        return d
    if name == "abs":
        return abs(d)
    if name in ("k2", "mse"):
        return 0.5 * d * d
    if name in ("k3", "low_var_kl"):
        return min(max(math.exp(-d) - 1 + d, -10.0), 10.0)
    raise AssertionError(name)


def pairs(seed=0, n=4, length=6):
    g = torch.Generator().manual_seed(seed)
    lp = (-torch.rand(n, length, generator=g) * 4).requires_grad_(True)
    ref = -torch.rand(n, length, generator=g) * 4
    return lp, ref


@pytest.mark.parametrize("name", ["k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl"])
def test_estimator_values(name):
    lp, ref = pairs()
    out = kl_penalty(lp, ref, name)
    expected = [[formula(name, float(a), float(b)) for a, b in zip(ra, rb)] for ra, rb in zip(lp.detach(), ref)]
    torch.testing.assert_close(out.detach(), torch.tensor(expected))


def test_k3_is_clamped_for_far_apart_policies():
    out = kl_penalty(torch.tensor([0.0]), torch.tensor([30.0]), "k3")
    assert float(out) == 10.0


@pytest.mark.parametrize("name", ["k1+", "kl+", "abs+", "k3+", "low_var_kl+", "k2+", "mse+"])
def test_straight_through_variants_have_the_value_of_the_estimator_and_the_gradient_of_k2(name):
    lp, ref = pairs(1)
    out = kl_penalty(lp, ref, name)
    base = name[:-1]
    torch.testing.assert_close(out.detach(), kl_penalty(lp, ref, base).detach())
    (grad,) = torch.autograd.grad(out.sum(), lp)
    torch.testing.assert_close(grad, (lp - ref).detach())  # d/dlp of (lp - ref)^2 / 2


def test_k1_gradient_is_one_without_the_plus():
    lp, ref = pairs(2)
    (grad,) = torch.autograd.grad(kl_penalty(lp, ref, "k1").sum(), lp)
    assert torch.all(grad == 1)


def test_unknown_and_full_estimators_are_errors():
    lp, ref = pairs()
    with pytest.raises(RegistryError, match="low_var_kl"):
        kl_penalty(lp, ref, "low_var")
    with pytest.raises(ValueError, match="full"):
        kl_penalty(lp, ref, "full")
    assert {"k1", "k2", "k3", "abs", "mse", "kl", "low_var_kl"} <= set(KL_ESTIMATORS.names())


def test_kl_loss_is_the_masked_mean_of_the_estimator():
    lp, ref = pairs(3)
    mask = random_mask(4, 6, torch.Generator().manual_seed(3), empty_rows=(1,))
    loss, metrics = compute_kl_loss(lp, ref, mask, "low_var_kl", "token-mean")
    lp = lp.detach()
    values = [formula("k3", float(lp[i, t]), float(ref[i, t])) for i in range(4) for t in range(6) if mask[i, t]]
    assert loss.item() == pytest.approx(sum(values) / len(values), rel=1e-5)
    assert metrics["actor/kl_loss"] == pytest.approx(loss.item(), rel=1e-6)


def test_fixed_controller_never_moves():
    ctrl = build_kl_controller({"type": "fixed", "kl_coef": 0.05})
    assert isinstance(ctrl, FixedKLController)
    ctrl.update(current_kl=10.0, n_steps=100)
    assert ctrl.value == 0.05


@pytest.mark.parametrize("current_kl,expected_error", [(0.15, 0.2), (0.11, 0.1), (0.05, -0.2)])
def test_adaptive_controller_follows_ziegler_et_al(current_kl, expected_error):
    ctrl = build_kl_controller({"type": "adaptive", "kl_coef": 0.1, "target_kl": 0.1, "horizon": 1000})
    assert isinstance(ctrl, AdaptiveKLController)
    ctrl.update(current_kl=current_kl, n_steps=50)
    assert ctrl.value == pytest.approx(0.1 * (1 + expected_error * 50 / 1000))


def test_controller_config_errors():
    with pytest.raises(ValueError, match="horizon"):
        build_kl_controller({"type": "adaptive", "horizon": 0})
    with pytest.raises(ValueError, match="type='adaptve' is not valid; choose one of: fixed, adaptive"):
        build_kl_controller({"type": "adaptve"})


def test_apply_kl_penalty_turns_scores_into_rewards_and_updates_the_controller():
    g = torch.Generator().manual_seed(4)
    mask = random_mask(3, 5, g, empty_rows=(2,))
    old = -torch.rand(3, 5, generator=g)
    ref = -torch.rand(3, 5, generator=g)
    scores = torch.zeros(3, 5)
    scores[0, 2] = 1.0
    data = DataProto.from_dict(
        {"token_level_scores": scores, "old_log_probs": old, "ref_log_prob": ref, "response_mask": mask}
    )
    ctrl = AdaptiveKLController(kl_coef=0.2, target_kl=0.01, horizon=100)
    _, metrics = apply_kl_penalty(data, ctrl, "kl")
    rewards = data.batch["token_level_rewards"]
    seq_kls = []
    for i in range(3):
        valid = [t for t in range(5) if mask[i, t]]
        for t in range(5):
            kl = float(old[i, t] - ref[i, t]) if mask[i, t] else 0.0
            assert float(rewards[i, t]) == pytest.approx(float(scores[i, t]) - 0.2 * kl, abs=1e-6)
        seq_kls.append(sum(float(old[i, t] - ref[i, t]) for t in valid) / len(valid) if valid else 0.0)
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(sum(seq_kls) / 3, rel=1e-5)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.2
    error = max(min(metrics["actor/reward_kl_penalty"] / 0.01 - 1, 0.2), -0.2)
    assert ctrl.value == pytest.approx(0.2 * (1 + error * 3 / 100))


def test_apply_kl_penalty_names_a_missing_field():
    data = DataProto.from_dict({"token_level_scores": torch.zeros(2, 3), "response_mask": torch.ones(2, 3)})
    with pytest.raises(ValueError, match="old_log_probs"):
        apply_kl_penalty(data, FixedKLController(0.1))
