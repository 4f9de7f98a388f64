"""The actor's full loss for one micro-batch: policy loss, entropy bonus and KL-to-reference loss.

This is what an actor worker hands to ``TrainingEngine.forward_backward`` (wrapped in its ``loss_fn``)::

    loss = pg_loss - entropy_coeff * entropy + kl_loss_coef * kl_loss       (each aggregated globally)

Config: the ``actor_rollout_ref.actor`` section, an
:class:`~verl.algos.policy_losses.config.ActorLossConfig` (``policy_loss.loss_mode``, ``loss_agg_mode``,
``entropy_coeff``, ``use_kl_loss``, ``kl_loss_coef``, ``kl_loss_type`` and the loss's own keys).
With ``algorithm.rollout_correction.bypass_mode`` the policy loss is ``bypass_mode`` whatever
``loss_mode`` says (as verl's trainer switches it); decoupled mode's ``rollout_is_weights`` reach every
other loss.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from verl.algos.data.fields import response_mask_of
from verl.algos.losses.aggregation import LossNormalizer, agg_loss, micro_mean
from verl.algos.losses.kl import compute_kl_loss
from verl.algos.policy_losses import get_policy_loss
from verl.algos.policy_losses.config import ActorLossConfig, actor_loss_config
from verl.algos.rollout_correction.config import RolloutCorrectionConfig, rollout_correction_config
from verl.core.engine.training import LossFn
from verl.core.protocol import DataProto


def compute_actor_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    entropy: torch.Tensor | None = None,
    ref_log_prob: torch.Tensor | None = None,
    config: ActorLossConfig | Mapping[str, Any] | None = None,
    normalizer: LossNormalizer | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    rollout_correction: RolloutCorrectionConfig | Mapping[str, Any] | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss to backward for this micro-batch (scaled for the global mini-batch, see
    :mod:`verl.algos.losses.aggregation`) and its metrics: the policy loss's, ``actor/entropy`` (when
    ``entropy`` is given), ``actor/kl_loss`` and ``actor/kl_coef`` (with ``use_kl_loss``)."""
    config = actor_loss_config(config)
    correction = rollout_correction_config(rollout_correction)
    mode = config.loss_agg_mode
    loss_mode = "bypass_mode" if correction.bypass_mode else config.policy_loss.loss_mode
    # bypass_mode computes its own weights from the current policy; the others take decoupled mode's (passed
    # only when present, so a plugin's loss without the parameter works while correction is off)
    extra: dict[str, Any] = {"rollout_correction": correction} if loss_mode == "bypass_mode" else {}
    if rollout_is_weights is not None:
        extra["rollout_is_weights"] = rollout_is_weights
    loss, metrics = get_policy_loss(loss_mode)(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode=mode,
        normalizer=normalizer,
        config=config,
        **extra,
    )
    entropy_coeff = config.entropy_coeff
    if entropy is not None:
        metrics["actor/entropy"] = micro_mean(entropy, response_mask, "token-mean")
        if entropy_coeff != 0:
            loss = loss - entropy_coeff * agg_loss(entropy, response_mask, mode, normalizer)
    elif entropy_coeff != 0:
        raise ValueError(
            f"actor.entropy_coeff={entropy_coeff} needs the per-token entropy: ask the engine's forward for it"
        )
    if config.use_kl_loss:
        if ref_log_prob is None:
            raise ValueError("actor.use_kl_loss=true needs 'ref_log_prob' in the batch: enable the reference policy")
        coef = config.kl_loss_coef
        kl_loss, kl_metrics = compute_kl_loss(
            log_prob, ref_log_prob, response_mask, config.kl_loss_type, mode, normalizer
        )
        loss = loss + coef * kl_loss
        metrics.update(kl_metrics)
        metrics["actor/kl_coef"] = coef
    return loss, metrics


def _field(data: DataProto, key: str) -> torch.Tensor | None:
    return data.batch[key] if key in data.batch.keys() else None


def make_actor_loss_fn(
    config: ActorLossConfig | Mapping[str, Any] | None,
    normalizer: LossNormalizer | None,
    on_policy: bool = False,
    rollout_correction: RolloutCorrectionConfig | Mapping[str, Any] | None = None,
) -> LossFn:
    """The engine ``loss_fn(outputs, micro_batch)`` of an actor update (see
    ``verl.core.engine.LossFn``). Reads ``outputs["log_probs"]`` (and ``outputs["entropy"]``) and the
    micro-batch fields ``old_log_probs``, ``advantages``, ``response_mask`` (or ``attention_mask``)
    and ``ref_log_prob`` (with ``use_kl_loss``), ``rollout_is_weights`` when the trainer added them.
    ``rollout_correction``: the ``algorithm.rollout_correction`` section (bypass mode). ``normalizer``: the mini-batch's
    :func:`~verl.algos.losses.aggregation.global_normalizer`, computed before the micro-batch loop.

    ``on_policy``: the update is one optimizer step over the whole batch, so the policy that sampled
    it is the one being differentiated: without ``old_log_probs`` the ratio's denominator is this
    forward's own log-probs, detached (ratio 1, gradient of log-prob), as in verl's actor. That saves
    the separate old-log-prob pass."""

    def loss_fn(outputs: dict[str, torch.Tensor], micro_batch: DataProto):
        old_log_prob = _field(micro_batch, "old_log_probs")
        if old_log_prob is None and on_policy:
            old_log_prob = outputs["log_probs"].detach()
        for key, value in (("old_log_probs", old_log_prob), ("advantages", _field(micro_batch, "advantages"))):
            if value is None:
                raise ValueError(f"the actor update needs {key!r} in the batch (fields: {micro_batch.keys()})")
        return compute_actor_loss(
            outputs["log_probs"],
            old_log_prob,
            micro_batch.batch["advantages"],
            response_mask_of(micro_batch),
            entropy=outputs.get("entropy"),
            ref_log_prob=_field(micro_batch, "ref_log_prob"),
            config=config,
            normalizer=normalizer,
            rollout_is_weights=_field(micro_batch, "rollout_is_weights"),
            rollout_correction=rollout_correction,
        )

    return loss_fn
