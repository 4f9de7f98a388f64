"""PF-PPO reweighting (verl's compute_pf_ppo_reweight_data) against a reference and by its statistics."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from algos_test_helpers import outcome_rewards, random_mask, uids

from verl.algos.advantages.pf_ppo import pf_ppo_resample, pf_ppo_weights
from verl.core.protocol import DataProto


def ref_weights(scores: list[float], method: str, power: float) -> list[float]:
    hi, lo = max(scores), min(scores)
    out = []
    for s in scores:
        if method == "pow":
            w = abs(s) ** power
        elif method == "max_min":
            w = 1.0 if s in (hi, lo) else 0.0
        else:
            w = 0.4 if s == hi else 0.1
        out.append(max(w + 1e-8, 1e-8))
    return out


def batch(seed: int) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    mask = random_mask(8, 5, g, empty_rows=(6,))
    scores = [1.0, -0.5, 0.0, 2.0, 0.25, 2.0, 0.0, -1.5]
    data = DataProto.from_dict(
        {
            "token_level_scores": outcome_rewards(scores, mask),
            "response_mask": mask,
            "advantages": torch.randn(8, 5, generator=g) * mask,
        },
        {"uid": uids(2, 2, 2, 2), "row": np.arange(8)},
        meta_info={"global_step": 3, "per_row": list(range(8))},
    )
    return data


@pytest.mark.parametrize("method,power", [("pow", 2.0), ("pow", 0.5), ("max_min", 1.0), ("max_random", 1.0)])
def test_weights(method, power):
    data = batch(0)
    scores = data.batch["token_level_scores"].sum(-1)
    weights = pf_ppo_weights(scores, method, power)
    torch.testing.assert_close(weights, torch.tensor(ref_weights(scores.tolist(), method, power)))


def test_resample_keeps_rows_whole_and_is_reproducible():
    data = batch(1)
    first = pf_ppo_resample(data, "pow", 2.0, generator=torch.Generator().manual_seed(7))
    again = pf_ppo_resample(data, "pow", 2.0, generator=torch.Generator().manual_seed(7))
    picks = first.non_tensor_batch["row"]
    assert len(first) == len(data) and np.array_equal(picks, again.non_tensor_batch["row"])
    # the draw is torch.multinomial over the reference weights with the same generator
    scores = data.batch["token_level_scores"].sum(-1).tolist()
    expected = torch.multinomial(
        torch.tensor(ref_weights(scores, "pow", 2.0)), 8, replacement=True, generator=torch.Generator().manual_seed(7)
    )
    assert picks.tolist() == expected.tolist()
    for key in ("token_level_scores", "response_mask", "advantages"):
        torch.testing.assert_close(first.batch[key], data.batch[key][expected])
    assert list(first.non_tensor_batch["uid"]) == [data.non_tensor_batch["uid"][i] for i in picks]
    assert first.meta_info["per_row"] == picks.tolist() and first.meta_info["global_step"] == 3


def test_resample_frequencies_follow_the_weights():
    data = batch(2)
    scores = data.batch["token_level_scores"].sum(-1).tolist()
    weights = ref_weights(scores, "pow", 1.0)
    counts = np.zeros(8)
    g = torch.Generator().manual_seed(0)
    for _ in range(600):
        rows = pf_ppo_resample(data, "pow", 1.0, generator=g).non_tensor_batch["row"]
        counts += np.bincount(rows.astype(int), minlength=8)
    expected = np.array(weights) / sum(weights)
    np.testing.assert_allclose(counts / counts.sum(), expected, atol=0.01)
    assert counts[2] == 0 and counts[6] == 0, "a zero score has (almost) no chance under pow"


def test_all_equal_scores_sample_uniformly_and_bad_method_is_named():
    data = batch(3)
    data.batch["token_level_scores"].zero_()
    weights = pf_ppo_weights(data.batch["token_level_scores"].sum(-1), "pow", 2.0)
    assert torch.all(weights == weights[0]) and weights[0] > 0
    single = data[[0]]
    assert len(pf_ppo_resample(single, "max_min", 1.0, generator=torch.Generator().manual_seed(0))) == 1
    with pytest.raises(ValueError, match="reweight_method='best'"):
        pf_ppo_weights(torch.ones(3), "best", 1.0)
