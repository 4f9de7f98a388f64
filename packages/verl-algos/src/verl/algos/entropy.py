"""Token entropy and the entropy bonus (``actor.entropy_coeff``)."""

from __future__ import annotations

import torch


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution softmax(logits) over the last dimension::

    H = logsumexp(z) - sum_v softmax(z)_v * z_v
    """
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)
