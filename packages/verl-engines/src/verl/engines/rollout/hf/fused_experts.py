"""Checkpoint-format expert weights into a transformers model whose experts are fused.

transformers (5.x) keeps an MoE layer's experts as two 3D parameters, ``experts.gate_up_proj``
``[experts, 2 * intermediate, hidden]`` (each expert's gate rows, then its up rows) and ``experts.down_proj``
``[experts, hidden, intermediate]``, and converts the checkpoint's per-expert tensors
(``experts.<e>.gate_proj.weight``, ``up_proj``, ``down_proj``) into them when it loads a folder. A trainer that
streams weights under the checkpoint's names (the Megatron engine's converter does, as vLLM expects) has each
tensor copied here into its slice of the fused parameter instead.
"""

from __future__ import annotations

import re
from collections import defaultdict

import torch

_PER_EXPERT = re.compile(r"^(?P<layer>.+\.experts)\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")


class FusedExpertWeights:
    """Routes per-expert tensors of ``tensors`` (the rollout's fused parameters by name) and counts what
    arrived, so that a fused parameter counts as updated only when every expert's part did."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = tensors
        self._parts: dict[str, set[tuple[int, str]]] = defaultdict(set)

    def fused_name(self, name: str) -> tuple[str, int, str] | None:
        """(fused parameter, expert, projection) for a per-expert checkpoint name this model fuses, else None."""
        match = _PER_EXPERT.match(name)
        if match is None:
            return None
        proj = match["proj"]
        fused = f"{match['layer']}.{'down_proj' if proj == 'down_proj' else 'gate_up_proj'}"
        return (fused, int(match["expert"]), proj) if fused in self.tensors else None

    def target(self, fused: str, expert: int, proj: str) -> torch.Tensor:
        """The slice of the fused parameter that holds this expert's projection (a view to copy into)."""
        tensor = self.tensors[fused]
        if not 0 <= expert < tensor.shape[0]:
            raise KeyError(f"expert {expert} of {fused!r}: the rollout model has {tensor.shape[0]} experts")
        if proj == "down_proj":
            return tensor[expert]
        half = tensor.shape[1] // 2
        return tensor[expert, :half] if proj == "gate_proj" else tensor[expert, half:]

    def received(self, fused: str, expert: int, proj: str) -> None:
        self._parts[fused].add((expert, proj))

    def complete(self) -> set[str]:
        """The fused parameters every part of which arrived (gate and up, or down, of every expert)."""
        done = set()
        for fused, parts in self._parts.items():
            per_expert = 1 if fused.endswith("down_proj") else 2
            if len(parts) == self.tensors[fused].shape[0] * per_expert:
                done.add(fused)
        return done
