"""The scalar value head of a critic / reward model on megatron's GPTModel.

verl's value models are Hugging Face ``*ForTokenClassification`` models with one label: the causal-LM
backbone and ``score`` (hidden -> 1, with a bias unless ``token_classification_bias`` is false). On megatron
the backbone is the GPTModel's and the head replaces its vocab-parallel ``output_layer``: one output cannot
be split over TP ranks, so the head is replicated on every TP rank of the last stage. Its input (the final
norm's output, without sequence parallelism) is the same on every TP rank, so are its output and its
gradient, and megatron counts a parameter without ``tensor_model_parallel`` once (TP rank 0) in the
grad norm.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class ValueHead(torch.nn.Module):
    """``output_layer`` drop-in: ``forward(hidden [s, b, h], weight=None, runtime_gather_output=None)``
    returns ``(values [s, b, 1], None)`` as megatron's ColumnParallelLinear returns (output, bias)."""

    #: GPTModel reads this in some inference paths; the head never runs sequence-parallel.
    sequence_parallel = False

    def __init__(self, hidden_size: int, bias: bool, dtype: torch.dtype):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1, hidden_size, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.zeros(1, dtype=dtype)) if bias else None

    def forward(self, hidden: torch.Tensor, weight=None, runtime_gather_output=None):
        return F.linear(hidden, self.weight, self.bias), None


def initial_head(hidden_size: int, bias: bool, std: float, seed: int) -> dict[str, torch.Tensor]:
    """A fresh head for a value model started from a causal LM (HF folders without ``score``): normal(0,
    ``std``) weights (HF's ``initializer_range``), zero bias, from ``seed`` so every rank draws the same."""
    g = torch.Generator().manual_seed(seed)
    head = {"score.weight": torch.randn(1, hidden_size, generator=g) * std}
    if bias:
        head["score.bias"] = torch.zeros(1)
    return head
