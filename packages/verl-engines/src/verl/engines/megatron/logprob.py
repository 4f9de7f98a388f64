"""Token log-probs and entropy from vocabulary-parallel logits, without gathering the vocabulary.

With tensor parallelism each rank of the TP group holds the logits of a contiguous slice of the (padded)
vocabulary, ``[N, V_local]``. Gathering them would put a float ``[N, V]`` tensor on every rank; instead
each rank reduces its slice and the group all-reduces per-token scalars:

    m      = max over ranks of max_v z_v                  (all-reduce MAX, a constant for autograd)
    lse    = m + log(sum over ranks of sum_v exp(z_v - m)) (all-reduce SUM)
    logp   = z_target - lse     (z_target: the rank holding the target contributes it, all-reduce SUM)
    H      = lse - (sum over ranks of sum_v exp(z_v - m) z_v) / sum_exp   (all-reduce SUM)

The sums are all-reduced with an identity backward (megatron's ``reduce_from_tensor_model_parallel_region``
semantics): every TP rank computes the same loss, and each rank's gradient flows to its own slice only.
That is exact only when each reduced term depends on the rank's own columns alone (and constants), so
every quantity combining ranks is formed after a reduction, never inside one.
Columns at or beyond the real vocabulary size (megatron's padding) are left out of every sum.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class _AllReduceSum(torch.autograd.Function):
    """Sum over ``group`` forward, identity backward (the loss is replicated over the group)."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group) -> torch.Tensor:
        out = tensor.clone()
        if group is not None and dist.get_world_size(group) > 1:
            dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def _all_reduce_sum(tensor: torch.Tensor, group) -> torch.Tensor:
    return _AllReduceSum.apply(tensor, group)


def vocab_parallel_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    vocab_start: int,
    vocab_size: int,
    group=None,
    temperature: float = 1.0,
    compute_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-row ``log_softmax(z / temperature)[target]`` (and the entropy) in float32.

    ``logits``: [N, V_local], this rank's columns ``vocab_start .. vocab_start + V_local`` of the padded
    vocabulary; ``targets``: [N] global token ids; ``vocab_size``: the real vocabulary size (columns from
    it on are padding); ``group``: the TP process group (None: the logits are the whole vocabulary).
    """
    if logits.ndim != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(
            f"expected logits [N, V_local] and targets [N], got {tuple(logits.shape)} and {tuple(targets.shape)}"
        )
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    width = max(0, min(logits.shape[1], vocab_size - vocab_start))
    z = logits[:, :width].float()
    if temperature != 1.0:
        z = z / temperature
    n = z.shape[0]
    with torch.no_grad():
        local_max = z.max(dim=-1).values if width else z.new_full((n,), float("-inf"))
        shift = local_max.clone()
        if group is not None and dist.get_world_size(group) > 1:
            dist.all_reduce(shift, op=dist.ReduceOp.MAX, group=group)
    shifted = z - shift.unsqueeze(-1)
    exp = shifted.exp()
    sum_exp = _all_reduce_sum(exp.sum(-1), group)
    lse = sum_exp.log() + shift

    local = targets - vocab_start
    here = (local >= 0) & (local < width)
    picked = z.gather(-1, local.clamp(0, max(width - 1, 0)).unsqueeze(-1)).squeeze(-1) if width else z.new_zeros(n)
    target_logit = _all_reduce_sum(torch.where(here, picked, torch.zeros_like(picked)), group)
    logp = target_logit - lse
    if not compute_entropy:
        return logp, None
    # sum_v p_v z_v = (sum_v exp(z_v - m) z_v) / sum_exp: reduce the numerator, which depends on this
    # rank's columns only, then divide. (Reducing sum_v p_v z_v directly would make each rank's term
    # depend on the global sum_exp, whose gradient an identity-backward reduction then misses.)
    weighted = _all_reduce_sum((exp * z).sum(-1), group)
    entropy = lse - weighted / sum_exp
    return logp, entropy


def tp_vocab_range(padded_vocab: int, tp_rank: int, tp: int) -> tuple[int, int]:
    """[start, end) of the padded vocabulary that TP rank ``tp_rank`` holds."""
    per_rank = padded_vocab // tp
    return tp_rank * per_rank, (tp_rank + 1) * per_rank
