"""The clipped value loss of PPO critics (``critic.cliprange_value``)."""

from __future__ import annotations

import torch

from verl.algos.data.fields import response_mask_of
from verl.algos.data.masked import masked_mean
from verl.algos.losses.aggregation import LossNormalizer, agg_loss, micro_mean
from verl.core.engine.training import LossFn
from verl.core.protocol import DataProto


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float | None = 0.5,
    loss_agg_mode: str = "token-mean",
    normalizer: LossNormalizer | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped value loss (Schulman et al. 2017; the form used by OpenAI baselines and TRL)::

        v_clip = values + clip(vpreds - values, -cliprange_value, cliprange_value)
        l      = 0.5 * max((vpreds - R)^2, (v_clip - R)^2)

    ``values`` are the critic's predictions when the batch was collected, ``returns`` R the targets.
    ``cliprange_value=None`` disables clipping. Metrics: ``critic/vf_loss``, ``critic/vf_clipfrac``
    (share of tokens where the clipped error is larger), ``critic/vpred_mean``.
    """
    loss_unclipped = (vpreds - returns) ** 2
    if cliprange_value is None:
        loss_clipped = loss_unclipped
    else:
        v_clip = values + torch.clamp(vpreds - values, -cliprange_value, cliprange_value)
        loss_clipped = (v_clip - returns) ** 2
    losses = 0.5 * torch.maximum(loss_unclipped, loss_clipped)
    loss = agg_loss(losses, response_mask, loss_agg_mode, normalizer)
    with torch.no_grad():
        metrics = {
            "critic/vf_loss": micro_mean(losses, response_mask, loss_agg_mode),
            "critic/vf_clipfrac": float(masked_mean((loss_clipped > loss_unclipped).float(), response_mask)),
            "critic/vpred_mean": float(masked_mean(vpreds, response_mask)),
        }
    return loss, metrics


def make_critic_loss_fn(
    cliprange_value: float | None, loss_agg_mode: str = "token-mean", normalizer: LossNormalizer | None = None
) -> LossFn:
    """The engine ``loss_fn(outputs, micro_batch)`` of a critic update: ``outputs["values"]`` against
    the micro-batch's ``returns``, clipped around its ``values`` (the critic's values at collection
    time), over ``response_mask`` (or the response part of ``attention_mask``)."""

    def loss_fn(outputs: dict[str, torch.Tensor], micro_batch: DataProto):
        for key in ("values", "returns"):
            if key not in micro_batch.batch.keys():
                raise ValueError(f"the critic update needs {key!r} in the batch (fields: {micro_batch.keys()})")
        return compute_value_loss(
            outputs["values"],
            micro_batch.batch["returns"],
            micro_batch.batch["values"],
            response_mask_of(micro_batch),
            cliprange_value,
            loss_agg_mode,
            normalizer,
        )

    return loss_fn
