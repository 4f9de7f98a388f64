"""Masked reductions over [batch, response_length] tensors, and grouping of samples by prompt uid.

Masks mark the valid response tokens (1) and padding (0); they may be bool, int or float tensors.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import torch


def as_float_mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.to(dtype=like.dtype if like.is_floating_point() else torch.float32)


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    mask = as_float_mask(mask, values)
    return (values * mask).sum() if dim is None else (values * mask).sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean over the valid entries; 0 where there are none (instead of NaN)."""
    mask = as_float_mask(mask, values)
    total = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(values, mask, dim) / total.clamp(min=1)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over all valid entries (Bessel-corrected by default); 0 with fewer than two entries."""
    mask = as_float_mask(mask, values)
    count = mask.sum()
    mean = masked_mean(values, mask)
    sq = masked_sum((values - mean) ** 2, mask)
    denom = (count - 1) if unbiased else count
    return torch.where(denom > 0, sq / denom.clamp(min=1), torch.zeros_like(sq))


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps)`` with statistics over the valid entries of the whole tensor,
    zero outside the mask. With fewer than two valid entries there is no spread to normalize by, and
    the result is the centered values (all zero)."""
    fmask = as_float_mask(mask, values)
    mean = masked_mean(values, fmask)
    var = masked_var(values, fmask)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    if fmask.sum() < 2:
        whitened = (values - mean) if shift_mean else values
    return whitened * fmask


def group_rows(index: Sequence[Hashable] | np.ndarray) -> dict[Hashable, list[int]]:
    """Row numbers of each group, groups in order of first appearance. ``index`` holds one uid per row
    (verl passes the prompt uids as a numpy object array)."""
    if index is None:
        raise ValueError(
            "this advantage estimator groups responses by prompt: pass index= (the batch's non-tensor "
            "'uid' field, one uid per response)"
        )
    groups: dict[Hashable, list[int]] = {}
    for row, uid in enumerate(np.asarray(index, dtype=object).tolist()):
        groups.setdefault(uid, []).append(row)
    return groups


def object_array(values: Sequence) -> np.ndarray:
    """A 1-D numpy object array with one entry per value, even when the values are equal-length
    lists (which ``np.array`` would turn into a 2-D array)."""
    arr = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        arr[i] = value
    return arr
