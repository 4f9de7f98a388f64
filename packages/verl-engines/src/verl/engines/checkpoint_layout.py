"""A transformers model's weights under their checkpoint names, one tensor at a time.

transformers (>= 5) converts some weights when it loads a folder and keeps them converted in memory: an MoE
layer's experts become two fused parameters (``mlp.experts.gate_up_proj`` ``[experts, 2 * intermediate,
hidden]`` and ``mlp.experts.down_proj``) where the checkpoint has one ``gate_proj`` / ``up_proj`` /
``down_proj`` per expert. Everything a training engine hands its weights to reads the checkpoint's layout:
vLLM's loaders (which skip a name they do not know, silently: the experts would keep their old weights),
the Megatron engine's converter, ``from_pretrained`` on an export. So the engines that train a transformers
model (FSDP2, VeOmni) yield what ``save_pretrained`` would write, through transformers' own reversal of its
conversions, tensor by tensor (a fused tensor becomes one tensor per expert, copied, as it streams). The Megatron
engine already yields this layout; the hf rollout takes either.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn


class CheckpointLayout:
    """The reversal of ``model``'s load-time conversions; a no-op for a model that has none (dense
    Llama / Qwen families), decided once at construction."""

    def __init__(self, model: nn.Module, names_and_shapes: Iterable[tuple[str, torch.Size]]):
        self._model = model
        self._revert = _reverter()
        in_memory = list(names_and_shapes)
        #: (checkpoint name, shape) of every tensor :meth:`weights` yields, in order (exports plan files from it).
        self.shapes = self._shapes(in_memory)
        if self.shapes == in_memory:
            self._revert = None

    @property
    def converts(self) -> bool:
        return self._revert is not None

    def weights(self, named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """``named`` (in-memory names and full tensors) in the checkpoint's names and layout."""
        if self._revert is None:
            yield from named
            return
        for name, tensor in named:
            yield from self._revert(self._model, {name: tensor}).items()

    def _shapes(self, in_memory: list[tuple[str, torch.Size]]) -> list[tuple[str, torch.Size]]:
        if self._revert is None:
            return in_memory
        meta = ((name, torch.empty(shape, device="meta")) for name, shape in in_memory)
        return [(name, tensor.shape) for name, tensor in self.weights(meta)]


def _reverter():
    """transformers' ``revert_weight_conversion`` (what ``save_pretrained`` applies), or None before 5.x."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:
        return None
    return revert_weight_conversion
