"""The clipped value loss, the actor's combined loss with its entropy bonus, and the data metrics."""

from __future__ import annotations

import pytest
import torch
from algos_test_helpers import agg_reference, random_mask, uids

from verl.algos.data.metrics import compute_data_metrics
from verl.algos.losses.actor import compute_actor_loss, make_actor_loss_fn
from verl.algos.losses.aggregation import LossNormalizer
from verl.algos.losses.kl import kl_penalty
from verl.algos.losses.value import compute_value_loss, make_critic_loss_fn
from verl.algos.policy_losses import get_policy_loss
from verl.core.protocol import DataProto


@pytest.mark.parametrize("cliprange", [0.2, None])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_value_loss_matches_the_clipped_formula(cliprange, mode):
    g = torch.Generator().manual_seed(0)
    mask = random_mask(5, 7, g, empty_rows=(4,))
    vpreds = torch.randn(5, 7, generator=g).requires_grad_(True)
    values = vpreds.detach() + torch.randn(5, 7, generator=g) * 0.5
    returns = torch.randn(5, 7, generator=g)
    loss, metrics = compute_value_loss(vpreds, returns, values, mask, cliprange, mode)
    rows, clipped = [], []
    for i in range(5):
        row = []
        for t in range(7):
            v, old, r = vpreds[i, t], float(values[i, t]), float(returns[i, t])
            unclipped = (v - r) ** 2
            if cliprange is None:
                worse = unclipped
            else:
                v_clip = old + torch.clamp(v - old, -cliprange, cliprange)
                worse = torch.maximum(unclipped, (v_clip - r) ** 2)
                if mask[i, t]:
                    clipped.append(((v_clip - r) ** 2).item() > unclipped.item())
            row.append(0.5 * worse)
        rows.append(torch.stack(row))
    ref = agg_reference(torch.stack(rows), mask, mode, scale=7)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(torch.autograd.grad(loss, vpreds)[0], torch.autograd.grad(ref, vpreds)[0])
    assert metrics["critic/vf_clipfrac"] == pytest.approx(sum(clipped) / len(clipped) if clipped else 0.0)
    assert metrics["critic/vf_loss"] == pytest.approx(ref.item(), rel=1e-5)


def test_actor_loss_adds_entropy_bonus_and_kl_loss():
    g = torch.Generator().manual_seed(2)
    mask = random_mask(4, 6, g)
    old = -torch.rand(4, 6, generator=g)
    log_prob = (old + 0.1 * torch.randn(4, 6, generator=g)).requires_grad_(True)
    ref = -torch.rand(4, 6, generator=g)
    adv = torch.randn(4, 6, generator=g)
    entropy = torch.rand(4, 6, generator=g)
    config = {
        "policy_loss": {"loss_mode": "vanilla"},
        "loss_agg_mode": "token-mean",
        "entropy_coeff": 0.01,
        "use_kl_loss": True,
        "kl_loss_coef": 0.05,
        "kl_loss_type": "k3+",
    }
    normalizer = LossNormalizer.from_mask(mask)
    loss, metrics = compute_actor_loss(
        log_prob, old, adv, mask, entropy=entropy, ref_log_prob=ref, config=config, normalizer=normalizer
    )
    pg, _ = get_policy_loss("vanilla")(old, log_prob, adv, mask)
    expected = (
        pg
        - 0.01 * agg_reference(entropy, mask, "token-mean", 6)
        + 0.05 * agg_reference(kl_penalty(log_prob, ref, "k3+"), mask, "token-mean", 6)
    )
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(torch.autograd.grad(loss, log_prob)[0], torch.autograd.grad(expected, log_prob)[0])
    assert {"actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower", "actor/entropy"} <= set(
        metrics
    )
    assert metrics["actor/kl_coef"] == 0.05 and "actor/kl_loss" in metrics


def test_actor_loss_says_what_is_missing():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="ref_log_prob"):
        compute_actor_loss(x, x, x, torch.ones(1, 2), config={"use_kl_loss": True})
    with pytest.raises(ValueError, match="entropy"):
        compute_actor_loss(x, x, x, torch.ones(1, 2), config={"entropy_coeff": 0.1})


def test_data_metrics_and_reduction():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    scores = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    data = DataProto.from_dict(
        {
            "token_level_scores": scores,
            "token_level_rewards": scores,
            "advantages": torch.tensor([[0.5, 0.5, 9.0], [-0.5, -0.5, -0.5]]),
            "returns": torch.zeros(2, 3),
            "values": torch.zeros(2, 3),
            "response_mask": mask,
            "responses": torch.zeros(2, 3, dtype=torch.long),
            "attention_mask": torch.cat([torch.tensor([[0.0, 1.0], [1.0, 1.0]]), mask], dim=1),
        },
        {"uid": uids(2)},
    )
    metrics = compute_data_metrics(data, use_critic=True)
    assert metrics["critic/score/mean"] == 0.5 and metrics["critic/score/max"] == 1.0
    assert metrics["critic/advantages/max"] == 0.5, "padding (the 9.0) is not a valid token"
    assert metrics["response_length/mean"] == 2.5 and metrics["response_length/clip_ratio"] == 0.5
    assert metrics["prompt_length/max"] == 2.0
    assert "critic/vf_explained_var" in metrics


def test_engine_loss_fns_read_the_batch_fields():
    g = torch.Generator().manual_seed(6)
    mask = random_mask(3, 5, g)
    old = -torch.rand(3, 5, generator=g)
    log_prob = (old + 0.1 * torch.randn(3, 5, generator=g)).requires_grad_(True)
    adv, ref = torch.randn(3, 5, generator=g), -torch.rand(3, 5, generator=g)
    values, returns = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    batch = DataProto.from_dict(
        {
            "old_log_probs": old,
            "advantages": adv,
            "ref_log_prob": ref,
            "response_mask": mask,
            "values": values,
            "returns": returns,
        }
    )
    config = {"use_kl_loss": True, "kl_loss_coef": 0.1}
    normalizer = LossNormalizer.from_mask(mask)
    loss, metrics = make_actor_loss_fn(config, normalizer)({"log_probs": log_prob}, batch)
    direct, _ = compute_actor_loss(log_prob, old, adv, mask, ref_log_prob=ref, config=config, normalizer=normalizer)
    torch.testing.assert_close(loss, direct)
    assert "actor/kl_loss" in metrics
    vpreds = values + 0.3
    v_loss, v_metrics = make_critic_loss_fn(0.2, "token-mean", normalizer)({"values": vpreds}, batch)
    torch.testing.assert_close(v_loss, compute_value_loss(vpreds, returns, values, mask, 0.2)[0])
    with pytest.raises(ValueError, match="advantages"):
        make_actor_loss_fn(config, normalizer)(
            {"log_probs": log_prob}, batch.select(["old_log_probs", "response_mask"])
        )
