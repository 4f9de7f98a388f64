"""Every advantage estimator against a slow reference written from its paper's formula (explicit
Python loops over samples and tokens), on random inputs with masks and the edge cases: an empty
response, a single sample, a group of one, a group whose rewards are all equal."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from algos_test_helpers import outcome_rewards, random_mask, uids

from verl.algos.advantages import ADV_ESTIMATORS, compute_advantage, get_adv_estimator, greedy_reward_baselines
from verl.core.protocol import DataProto
from verl.core.registry import RegistryError

EPS = 1e-6

# ------------------------------------------------------------------ references (plain Python floats)


def rows(t: torch.Tensor) -> list[list[float]]:
    return [[float(x) for x in row] for row in t]


def seq_scores(rewards, mask) -> list[float]:
    return [sum(r) for r in rows(rewards)]


def groups_of(index) -> dict:
    out: dict = {}
    for i, uid in enumerate(index):
        out.setdefault(uid, []).append(i)
    return out


def broadcast(per_sample: list[float], mask) -> list[list[float]]:
    m = rows(mask)
    return [[per_sample[i] if m[i][t] else 0.0 for t in range(len(m[i]))] for i in range(len(m))]


def whiten(values: list[list[float]], mask) -> list[list[float]]:
    m = rows(mask)
    valid = [values[i][t] for i in range(len(m)) for t in range(len(m[i])) if m[i][t]]
    if len(valid) < 2:
        return [[0.0] * len(r) for r in m]
    mean = sum(valid) / len(valid)
    var = sum((v - mean) ** 2 for v in valid) / (len(valid) - 1)
    scale = 1 / math.sqrt(var + 1e-8)
    return [[(values[i][t] - mean) * scale if m[i][t] else 0.0 for t in range(len(m[i]))] for i in range(len(m))]


def ref_grpo(rewards, mask, index, by_std=True):
    s = seq_scores(rewards, mask)
    adv = [0.0] * len(s)
    for members in groups_of(index).values():
        vals = [s[i] for i in members]
        n = len(vals)
        mean, std = (
            (0.0, 1.0) if n == 1 else (sum(vals) / n, math.sqrt(sum((v - sum(vals) / n) ** 2 for v in vals) / (n - 1)))
        )
        for i in members:
            adv[i] = (s[i] - mean) / (std + EPS) if by_std else s[i] - mean
    return broadcast(adv, mask)


def ref_passk(rewards, mask, index, by_std=True):
    s = seq_scores(rewards, mask)
    adv = [0.0] * len(s)
    for members in groups_of(index).values():
        if len(members) < 2:
            continue
        best = members[0]
        for i in members:
            if s[i] > s[best]:
                best = i
        second = max(s[i] for i in members if i != best)
        margin = s[best] - second
        if by_std:
            vals = [s[i] for i in members]
            mean = sum(vals) / len(vals)
            margin /= math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) + EPS
        adv[best] = margin
    return broadcast(adv, mask)


def ref_rloo(rewards, mask, index):
    s = seq_scores(rewards, mask)
    adv = list(s)
    for members in groups_of(index).values():
        if len(members) > 1:
            for i in members:
                others = [s[j] for j in members if j != i]
                adv[i] = s[i] - sum(others) / len(others)
    return broadcast(adv, mask)


def ref_opo(rewards, mask, index):
    s = seq_scores(rewards, mask)
    lengths = [sum(r) for r in rows(mask)]
    adv = list(s)
    for members in groups_of(index).values():
        if len(members) > 1:
            total = sum(lengths[j] for j in members)
            baseline = sum(lengths[j] * s[j] for j in members) / total if total else 0.0
            for i in members:
                adv[i] = s[i] - baseline
    return broadcast(adv, mask)


def ref_gpg(rewards, mask, index):
    s = seq_scores(rewards, mask)
    invalid = 0
    centered = [0.0] * len(s)
    for members in groups_of(index).values():
        vals = [s[i] for i in members]
        if max(vals) == min(vals):
            invalid += len(members)
            continue
        for i in members:
            centered[i] = s[i] - sum(vals) / len(vals)
    alpha = len(s) / (len(s) - invalid) if len(s) > invalid else 1.0
    return broadcast([alpha * c for c in centered], mask)


def ref_rpp_baseline(rewards, mask, index):
    s = seq_scores(rewards, mask)
    centered = list(s)
    for members in groups_of(index).values():
        if len(members) > 1:
            mean = sum(s[i] for i in members) / len(members)
            for i in members:
                centered[i] = s[i] - mean
    return whiten(broadcast(centered, mask), mask)


def ref_reinforce_pp(rewards, mask, gamma):
    r, m = rows(rewards), rows(mask)
    returns = []
    for i in range(len(r)):
        row, running = [0.0] * len(r[i]), 0.0
        for t in reversed(range(len(r[i]))):
            running = r[i][t] + gamma * running if m[i][t] else 0.0
            row[t] = running
        returns.append(row)
    return whiten(returns, mask), returns


def ref_gae(rewards, values, mask, gamma, lam):
    r, v, m = rows(rewards), rows(values), rows(mask)
    adv = []
    for i in range(len(r)):
        row = [0.0] * len(r[i])
        next_value, next_adv = 0.0, 0.0
        for t in reversed([t for t in range(len(r[i])) if m[i][t]]):
            delta = r[i][t] + gamma * next_value - v[i][t]
            row[t] = delta + gamma * lam * next_adv
            next_value, next_adv = v[i][t], row[t]
        adv.append(row)
    returns = [[(adv[i][t] + v[i][t]) if m[i][t] else 0.0 for t in range(len(m[i]))] for i in range(len(m))]
    return whiten(adv, mask), returns


def ref_remax(rewards, mask, baselines):
    r, m = rows(rewards), rows(mask)
    adv, ret = [], []
    for i in range(len(r)):
        g = [sum(r[i][k] for k in range(t, len(r[i])) if m[i][k]) if m[i][t] else 0.0 for t in range(len(r[i]))]
        ret.append(g)
        adv.append([g[t] - float(baselines[i]) if m[i][t] else 0.0 for t in range(len(g))])
    return adv, ret


# ------------------------------------------------------------------ inputs


def case(seed: int, holes: bool = False):
    """Groups of 4, 1 (a group of one), 3 with all-equal rewards, 2, 4; row 1 is an empty response."""
    g = torch.Generator().manual_seed(seed)
    index = uids(4, 1, 3, 2, 4)
    n, length = len(index), 7
    mask = random_mask(n, length, g, empty_rows=(1,), holes=holes)
    scores = torch.randint(0, 2, (n,), generator=g).float() + 0.5 * torch.rand(n, generator=g)
    scores[5:8] = 1.0  # the all-equal group
    return outcome_rewards(scores, mask), mask, index


def assert_close(actual: torch.Tensor, expected, atol=1e-5):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("by_std", [True, False])
def test_grpo_and_dr_grpo(seed, by_std):
    rewards, mask, index = case(seed)
    adv, ret = get_adv_estimator("grpo")(rewards, mask, index=index, config={"norm_adv_by_std_in_grpo": by_std})
    assert_close(adv, ref_grpo(rewards, mask, index, by_std))
    assert torch.equal(adv, ret)
    assert torch.all(adv[5:8] == 0), "a group whose rewards are all equal has zero advantage"
    assert torch.all(adv[1] == 0), "an empty response has no tokens to credit"


def test_grpo_group_of_one_keeps_its_score_like_verl():
    mask = torch.ones(1, 3)
    rewards = outcome_rewards([0.7], mask)
    adv, _ = get_adv_estimator("grpo")(rewards, mask, index=uids(1))
    assert_close(adv, [[0.7 / (1 + EPS)] * 3])


@pytest.mark.parametrize("seed", [0, 1])
def test_grpo_passk(seed):
    rewards, mask, index = case(seed)
    for by_std in (True, False):
        adv, _ = get_adv_estimator("grpo_passk")(rewards, mask, index=index, config={"norm_adv_by_std_in_grpo": by_std})
        assert_close(adv, ref_passk(rewards, mask, index, by_std))


@pytest.mark.parametrize("name,ref", [("rloo", ref_rloo), ("opo", ref_opo), ("gpg", ref_gpg)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_group_baselines(name, ref, seed):
    rewards, mask, index = case(seed)
    adv, ret = get_adv_estimator(name)(rewards, mask, index=index)
    assert_close(adv, ref(rewards, mask, index))
    assert torch.all(adv[5:8] == 0)


@pytest.mark.parametrize("seed", [0, 1])
def test_reinforce_plus_plus_baseline(seed):
    rewards, mask, index = case(seed)
    adv, _ = get_adv_estimator("reinforce_plus_plus_baseline")(rewards, mask, index=index)
    assert_close(adv, ref_rpp_baseline(rewards, mask, index))


@pytest.mark.parametrize("holes", [False, True])
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_plus_plus(holes, gamma):
    g = torch.Generator().manual_seed(3)
    mask = random_mask(6, 8, g, empty_rows=(2,), holes=holes)
    rewards = torch.randn(6, 8, generator=g) * mask  # dense token rewards (e.g. per-token KL)
    adv, ret = get_adv_estimator("reinforce_plus_plus")(rewards, mask, config={"gamma": gamma})
    ref_adv, ref_ret = ref_reinforce_pp(rewards, mask, gamma)
    assert_close(adv, ref_adv)
    assert_close(ret, ref_ret)


@pytest.mark.parametrize("holes", [False, True])
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae(holes, gamma, lam):
    g = torch.Generator().manual_seed(4)
    mask = random_mask(5, 9, g, empty_rows=(0,), holes=holes)
    rewards = torch.randn(5, 9, generator=g) * mask
    values = torch.randn(5, 9, generator=g)
    adv, ret = get_adv_estimator("gae")(rewards, mask, values=values, config={"gamma": gamma, "lam": lam})
    ref_adv, ref_ret = ref_gae(rewards, values, mask, gamma, lam)
    assert_close(adv, ref_adv)
    assert_close(ret, ref_ret)


def test_remax_against_greedy_baseline():
    g = torch.Generator().manual_seed(5)
    mask = random_mask(4, 6, g, empty_rows=(3,))
    rewards = outcome_rewards([1.0, 0.0, 1.0, 1.0], mask)
    greedy_scores = outcome_rewards([1.0, 1.0, 0.0, 0.0], torch.ones(4, 6))
    baselines = greedy_reward_baselines(greedy_scores)
    adv, ret = get_adv_estimator("remax")(rewards, mask, reward_baselines=baselines)
    ref_adv, ref_ret = ref_remax(rewards, mask, baselines)
    assert_close(adv, ref_adv)
    assert_close(ret, ref_ret)


@pytest.mark.parametrize("name", ["grpo", "rloo", "opo", "gpg", "grpo_passk", "reinforce_plus_plus_baseline"])
def test_single_sample_batch(name):
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    rewards = outcome_rewards([1.0], mask)
    adv, _ = get_adv_estimator(name)(rewards, mask, index=uids(1))
    assert adv.shape == (1, 3) and torch.isfinite(adv).all()
    assert adv[0, 2] == 0


def test_registry_lists_verl_names_and_rejects_typos():
    expected = {
        "gae",
        "grpo",
        "grpo_passk",
        "rloo",
        "opo",
        "gpg",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
        "remax",
    }
    assert expected <= set(ADV_ESTIMATORS.names())
    with pytest.raises(RegistryError, match="Nearest: 'grpo'"):
        get_adv_estimator("grp")


def test_compute_advantage_on_a_dataproto():
    rewards, mask, index = case(0)
    data = DataProto.from_dict({"token_level_rewards": rewards, "response_mask": mask}, {"uid": index})
    compute_advantage(data, "grpo", {"norm_adv_by_std_in_grpo": True})
    assert_close(data.batch["advantages"], ref_grpo(rewards, mask, index))
    assert torch.equal(data.batch["returns"], data.batch["advantages"])


def test_compute_advantage_derives_the_response_mask_from_attention_mask():
    rewards, mask, index = case(1)
    attention = torch.cat([torch.ones(len(index), 3), mask], dim=1)
    responses = torch.zeros_like(mask, dtype=torch.long)
    data = DataProto.from_dict(
        {"token_level_rewards": rewards, "attention_mask": attention, "responses": responses}, {"uid": index}
    )
    compute_advantage(data, "rloo")
    assert_close(data.batch["advantages"], ref_rloo(rewards, mask, index))


def test_compute_advantage_names_missing_fields():
    rewards, mask, index = case(0)
    data = DataProto.from_dict({"token_level_rewards": rewards, "response_mask": mask})
    with pytest.raises(ValueError, match="'uid'"):
        compute_advantage(data, "grpo")
    with pytest.raises(ValueError, match="'values'"):
        compute_advantage(data, "gae")
    with pytest.raises(ValueError, match="'reward_baselines'"):
        compute_advantage(data, "remax")
    data = DataProto.from_dict({"response_mask": mask}, {"uid": np.asarray(index)})
    with pytest.raises(ValueError, match="token_level_rewards"):
        compute_advantage(data, "grpo")


# ------------------------------------------------------------------ verl's newer estimators and names


@pytest.mark.parametrize("alias,ours", [("grpo_vectorized", "grpo"), ("rloo_vectorized", "rloo")])
def test_vectorized_names_are_aliases(alias, ours):
    assert get_adv_estimator(alias) is get_adv_estimator(ours)
    rewards, mask, index = case(0)
    adv, _ = get_adv_estimator(alias)(rewards, mask, index=index)
    assert_close(adv, {"grpo": ref_grpo, "rloo": ref_rloo}[ours](rewards, mask, index))


def ref_otb(rewards, mask, index, old_log_probs, sum_pi_squared, is_weights=None):
    """The optimal token baseline with loops: returns-to-go G, path energy W (cumulative
    1 - 2 pi + sum pi^2, times w^2 with IS), per-position baseline over the group's valid rows."""
    r, m, lp, sq = rows(rewards), rows(mask), rows(old_log_probs), rows(sum_pi_squared)
    n, length = len(r), len(r[0])
    G = [[0.0] * length for _ in range(n)]
    W = [[0.0] * length for _ in range(n)]
    for i in range(n):
        running = 0.0
        for t in reversed(range(length)):
            running += r[i][t] * m[i][t]
            G[i][t] = running * m[i][t]
        energy = 0.0
        for t in range(length):
            w = 1 - 2 * math.exp(lp[i][t]) + sq[i][t]
            if is_weights is not None:
                w *= float(is_weights[i, t]) ** 2
            energy += w * m[i][t]
            W[i][t] = energy
    adv = [[0.0] * length for _ in range(n)]
    for members in groups_of(index).values():
        for t in range(length):
            if len(members) > 1:
                num = sum(G[j][t] * W[j][t] * m[j][t] for j in members)
                den = sum(W[j][t] * m[j][t] for j in members) + 1e-8
                b = num / den
            else:
                b = 0.0
            for i in members:
                adv[i][t] = (G[i][t] - b) * m[i][t]
    return adv, G


def otb_case(seed: int, holes: bool = False):
    rewards, mask, index = case(seed, holes)
    g = torch.Generator().manual_seed(seed + 50)
    logits = torch.randn(len(index), mask.shape[1], 11, generator=g) * 2
    probs = torch.softmax(logits, dim=-1)
    taken = torch.randint(0, 11, (len(index), mask.shape[1]), generator=g)
    old_log_probs = torch.log(probs.gather(-1, taken.unsqueeze(-1)).squeeze(-1))
    return rewards, mask, index, old_log_probs, probs.square().sum(-1)


@pytest.mark.parametrize("seed,holes", [(0, False), (1, False), (2, True)])
def test_optimal_token_baseline(seed, holes):
    rewards, mask, index, old_lp, sq = otb_case(seed, holes)
    fn = get_adv_estimator("optimal_token_baseline")
    adv, ret = fn(rewards, mask, index=index, old_log_probs=old_lp, sum_pi_squared=sq)
    ref_adv, ref_ret = ref_otb(rewards, mask, index, old_lp, sq)
    assert_close(adv, ref_adv)
    assert_close(ret, ref_ret)
    assert torch.all(adv[5:8] == 0), "equal outcome rewards: every return equals the weighted baseline"
    assert torch.all(adv[1] == 0) and torch.equal(adv[4], ret[4]), "an empty response; a group of one keeps G"
    weights = torch.rand(mask.shape, generator=torch.Generator().manual_seed(seed)) + 0.5
    adv_is, _ = fn(rewards, mask, index=index, old_log_probs=old_lp, sum_pi_squared=sq, rollout_is_weights=weights)
    assert_close(adv_is, ref_otb(rewards, mask, index, old_lp, sq, weights)[0])


def test_optimal_token_baseline_through_compute_advantage():
    rewards, mask, index, old_lp, sq = otb_case(3)
    fields = {"token_level_rewards": rewards, "response_mask": mask, "old_log_probs": old_lp}
    with pytest.raises(ValueError, match="sum_pi_squared"):
        compute_advantage(DataProto.from_dict(fields, {"uid": index}), "optimal_token_baseline")
    data = DataProto.from_dict({**fields, "sum_pi_squared": sq}, {"uid": index})
    compute_advantage(data, "optimal_token_baseline")
    assert_close(data.batch["advantages"], ref_otb(rewards, mask, index, old_lp, sq)[0])


def test_single_sample_batch_optimal_token_baseline():
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    rewards = outcome_rewards([1.0], mask)
    adv, ret = get_adv_estimator("optimal_token_baseline")(
        rewards, mask, index=uids(1), old_log_probs=torch.full((1, 3), -1.0), sum_pi_squared=torch.full((1, 3), 0.3)
    )
    assert torch.equal(adv, ret) and adv[0, 2] == 0


def test_multi_turn_optimal_token_baseline_is_refused_before_ray():
    from verl.algos.config.names import check_registered_names
    from verl.algos.config.schema import PPOConfig
    from verl.core.config import ConfigError

    cfg = PPOConfig()
    cfg.algorithm.adv_estimator = "tir_optimal_token_baseline"
    with pytest.raises(ConfigError, match="multi-turn.*optimal_token_baseline"):
        check_registered_names(cfg)
