"""Loss aggregation (``loss_agg_mode``) normalized over the GLOBAL mini-batch.

The problem: one optimizer step sees a mini-batch B that is split across D data-parallel ranks and,
on each rank, into micro-batches (fixed size, or by token budget with dynamic batching). If each
micro-batch averaged its own tokens, the step's gradient would depend on how B happened to be cut.

The contract: the caller counts the normalizer over the whole of B *before* the micro-batch loop
(:func:`global_normalizer`: valid tokens and non-empty sequences, summed over all DP ranks) and
passes it to :func:`agg_loss` for every micro-batch m. Each micro-batch returns

    loss_m = (its share of the global numerator) / (global normalizer) * dp_size

so that, with the engine *summing* gradients over micro-batches and FSDP *averaging* them over the D
ranks, the gradient is exactly that of the global loss L(B):

    (1/D) * sum_ranks sum_m grad(loss_m) = sum_all_m grad(numerator_m) / normalizer = grad L(B).

``dp_size`` is the factor that undoes the rank averaging. Pass ``dp_size=1`` to an engine that
all-reduces gradients with SUM instead of AVG. The loss *values* obey the same rule: the sum of
``loss_m`` over micro-batches and ranks, divided by ``dp_size``, is L(B).

Modes (l = per-token loss, m = mask; sequences with no valid token are not counted):

- ``token-mean``:               L = sum_{i,t} m l / N_tokens
- ``seq-mean-token-sum``:       L = sum_i (sum_t m l) / N_seqs
- ``seq-mean-token-mean``:      L = sum_i (sum_t m l / sum_t m) / N_seqs
- ``seq-mean-token-sum-norm``:  L = sum_i (sum_t m l) / (C * N_seqs), C a constant (default: the
  response length). This is Dr.GRPO's objective (arXiv:2503.20783): no per-response length
  normalization. verl's older code omitted the 1/N_seqs; here the loss scale does not grow with the
  batch size.

Without a normalizer, the micro-batch is taken to be the whole batch (the local counts, dp_size 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


@dataclass(frozen=True)
class LossNormalizer:
    """Counts over the global mini-batch (every micro-batch on every DP rank) for :func:`agg_loss`.

    ``num_tokens``: valid response tokens; ``num_seqs``: sequences with at least one valid token;
    ``dp_size``: the factor that undoes FSDP's averaging of gradients over ranks (1 for an engine
    that sums); ``loss_scale_factor``: the constant C of ``seq-mean-token-sum-norm`` (None: the
    micro-batch's response length, which is only constant if all micro-batches share one padding).
    """

    num_tokens: float
    num_seqs: float
    dp_size: int = 1
    loss_scale_factor: float | None = None

    @classmethod
    def from_mask(cls, response_mask: torch.Tensor, dp_size: int = 1, loss_scale_factor: float | None = None):
        """Local counts of one mask (the whole mini-batch, when there is no data parallelism)."""
        num_tokens, num_seqs = _counts(response_mask)
        return cls(float(num_tokens), float(num_seqs), dp_size, loss_scale_factor)


def _counts(response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mask = response_mask.float()
    return mask.sum(), (mask.sum(dim=-1) > 0).float().sum()


def global_normalizer(
    response_masks: torch.Tensor | list[torch.Tensor],
    group=None,
    dp_size: int | None = None,
    loss_scale_factor: float | None = None,
) -> LossNormalizer:
    """Count the normalizer of a mini-batch across data-parallel ranks.

    ``response_masks``: this rank's share of the mini-batch (one mask, or the list of its
    micro-batch masks, which may differ in shape). When torch.distributed is initialized the counts
    are all-reduced (SUM) over ``group`` (None: the default group), and ``dp_size`` defaults to that
    group's size; otherwise the local counts are global and ``dp_size`` defaults to 1. Every rank
    must call this (it is a collective).
    """
    masks = [response_masks] if isinstance(response_masks, torch.Tensor) else list(response_masks)
    if not masks:
        raise ValueError("global_normalizer: no response masks given")
    counts = torch.zeros(2, dtype=torch.float64, device=masks[0].device)
    for mask in masks:
        tokens, seqs = _counts(mask)
        counts += torch.stack([tokens, seqs]).to(counts)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(counts, op=dist.ReduceOp.SUM, group=group)
        if dp_size is None:
            dp_size = dist.get_world_size(group)
    return LossNormalizer(float(counts[0]), float(counts[1]), dp_size or 1, loss_scale_factor)


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    normalizer: LossNormalizer | None = None,
) -> torch.Tensor:
    """Aggregate a [batch, response_length] loss matrix into this micro-batch's scalar share of the
    global loss (see the module docstring for the scaling contract)."""
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode={loss_agg_mode!r}; choose one of {list(LOSS_AGG_MODES)}")
    if normalizer is None:
        normalizer = LossNormalizer.from_mask(loss_mask)
    mask = loss_mask.to(loss_mat.dtype)
    token_sums = (loss_mat * mask).sum(dim=-1)
    if loss_agg_mode == "token-mean":
        numerator, denominator = token_sums.sum(), normalizer.num_tokens
    else:
        lengths = mask.sum(dim=-1)
        if loss_agg_mode == "seq-mean-token-mean":
            seq_losses = token_sums / lengths.clamp(min=1)
        elif loss_agg_mode == "seq-mean-token-sum":
            seq_losses = token_sums
        else:  # seq-mean-token-sum-norm
            scale = normalizer.loss_scale_factor or loss_mask.shape[-1]
            seq_losses = token_sums / scale
        numerator, denominator = seq_losses.sum(), normalizer.num_seqs
    # An empty global batch has nothing to learn; keep the graph connected with a zero loss.
    return numerator / max(denominator, 1.0) * normalizer.dp_size


def agg_seq_loss(
    seq_losses: torch.Tensor, loss_mask: torch.Tensor, normalizer: LossNormalizer | None = None
) -> torch.Tensor:
    """Aggregate one loss per sequence ([batch]) as a mean over the global mini-batch's non-empty
    sequences, scaled like :func:`agg_loss` (for objectives defined per sequence, such as GMPO's).
    Empty sequences contribute nothing."""
    if normalizer is None:
        normalizer = LossNormalizer.from_mask(loss_mask)
    nonempty = (loss_mask.sum(dim=-1) > 0).to(seq_losses.dtype)
    return (seq_losses * nonempty).sum() / max(normalizer.num_seqs, 1.0) * normalizer.dp_size


def micro_mean(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str = "token-mean") -> float:
    """The micro-batch's own aggregate (local normalization, no grad): the value reported in metrics,
    which the trainer averages over micro-batches."""
    with torch.no_grad():
        return float(agg_loss(loss_mat.detach(), loss_mask, loss_agg_mode))
