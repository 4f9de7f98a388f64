"""PF-PPO (``algorithm.use_pf_ppo``): resample the batch towards responses whose reward is reliable."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch

from verl.core.checks import check_finite, check_literals
from verl.core.protocol import DataProto

ReweightMethod = Literal["pow", "max_min", "max_random"]
REWEIGHT_METHODS = get_args(ReweightMethod)


@dataclass
class PFPPOConfig:
    """verl's ``algorithm.pf_ppo`` (used with ``algorithm.use_pf_ppo``)."""

    #: "pow" (|score|^weight_pow), "max_min" or "max_random", as verl.
    reweight_method: ReweightMethod = "pow"
    weight_pow: float = 2.0

    def __post_init__(self) -> None:
        check_literals(self)
        check_finite("weight_pow", self.weight_pow)


def pf_ppo_weights(scores: torch.Tensor, reweight_method: str = "pow", weight_pow: float = 2.0) -> torch.Tensor:
    """Sampling weights from sequence scores (verl's ``compute_pf_ppo_reweight_data``):

    - ``pow``:        |s|^weight_pow
    - ``max_min``:    1 for the batch's highest and lowest scores, 0 otherwise
    - ``max_random``: 0.4 for the highest score, 0.1 otherwise

    plus 1e-8 so that every row stays drawable (an all-zero batch samples uniformly)."""
    if reweight_method == "pow":
        weights = scores.abs().pow(weight_pow)
    elif reweight_method == "max_min":
        extreme = (scores == scores.max()) | (scores == scores.min())
        weights = extreme.to(scores.dtype)
    elif reweight_method == "max_random":
        weights = torch.where(scores == scores.max(), 0.4, 0.1).to(scores.dtype)
    else:
        raise ValueError(
            f"algorithm.pf_ppo.reweight_method={reweight_method!r}: choose one of {list(REWEIGHT_METHODS)}"
        )
    return (weights + 1e-8).clamp(min=1e-8)


@torch.no_grad()
def pf_ppo_resample(
    data: DataProto, reweight_method: str = "pow", weight_pow: float = 2.0, generator: torch.Generator | None = None
) -> DataProto:
    """PF-PPO (Shen and Zhang 2024, "Policy Filtration in RLHF to Fine-Tune LLM for Code Generation",
    arXiv:2409.06957): the reward model is least reliable in the middle of its range, so the update
    should see more of the responses it scores confidently. Draws len(data) rows with replacement,
    row i with probability proportional to :func:`pf_ppo_weights` of its score sum_t token_level_scores,
    and returns them as a new batch (tensors, non-tensors and per-row meta_info lists alike; advantages
    already computed travel with their rows). ``generator`` makes the draw reproducible (the trainer
    seeds it from trainer.seed and the step). verl applies it only after ``gae`` and silently ignores
    ``use_pf_ppo`` with other estimators; here it follows whichever estimator ran."""
    scores = data.batch["token_level_scores"].sum(dim=-1).float()
    weights = pf_ppo_weights(scores, reweight_method, weight_pow)
    rows = torch.multinomial(weights.cpu(), len(data), replacement=True, generator=generator)
    resampled = data[rows]
    picks = rows.numpy()
    for key, value in data.meta_info.items():
        if isinstance(value, list) and len(value) == len(data):
            resampled.meta_info[key] = [value[i] for i in picks]
    return resampled
