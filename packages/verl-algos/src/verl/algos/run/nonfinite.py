"""Numerical faults: finding the samples whose rewards, advantages, log-probs or loss are NaN/inf, and
naming them so a user can find them in the data.

The trainer checks rewards and advantages on the driver before the update, and the actor worker
checks each micro-batch's loss (log-probs can overflow where the inputs looked fine); a non-finite
gradient norm makes the engine skip the optimizer step on every rank. ``trainer.nonfinite`` then
says whether the step is skipped ("skip": nothing of it reaches the weights, the run goes on) or the
run stops ("stop": :class:`NonFiniteError`, the last complete checkpoint is kept).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from verl.core.protocol import DataProto

POLICIES = ("skip", "stop")


class NonFiniteError(RuntimeError):
    """A NaN or inf reached the loss or the gradients and ``trainer.nonfinite=stop``."""


def nonfinite_rows(mask: torch.Tensor, *tensors: torch.Tensor | None) -> list[int]:
    """Rows where any of ``tensors`` ([B, R] or [B]) is NaN/inf at a position ``mask`` ([B, R]) marks."""
    bad = torch.zeros(mask.shape[0], dtype=torch.bool)
    valid = mask.bool().cpu()
    for tensor in tensors:
        if tensor is None:
            continue
        finite = torch.isfinite(tensor.detach().cpu())
        if finite.dim() == 1:
            bad |= ~finite
        else:
            bad |= (~finite & valid).any(-1)
    return bad.nonzero().flatten().tolist()


def sample_ids(batch: DataProto, rows: Iterable[int]) -> list[str]:
    """How a row is named in reports: its prompt uid, its response number, and its dataset index."""
    non_tensor = batch.non_tensor_batch
    uids = non_tensor.get("uid")
    infos = non_tensor.get("extra_info")
    names = []
    for row in rows:
        parts = [f"uid={uids[row]}" if uids is not None else f"row={row}"]
        if infos is not None and isinstance(infos[row], dict) and "index" in infos[row]:
            parts.append(f"index={infos[row]['index']}")
        names.append(" ".join(parts))
    return names


def describe(step: int, where: str, ids: Sequence[str], limit: int = 16) -> str:
    shown = ", ".join(ids[:limit]) + (f", ... ({len(ids)} in all)" if len(ids) > limit else "")
    return f"step {step}: non-finite {where} in {len(ids)} sample(s): {shown or 'not attributable to samples'}"
