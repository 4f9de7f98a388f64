"""Linear layers run through oneDNN with weights reordered once per generation (CPU), where that pays.

A decode step multiplies a few rows (the batch) by every weight matrix. torch's default CPU path for
``F.linear`` (MKL sgemm on the plain row-major weight) can be slow at that shape, by how much depends on
the CPU: with SmolLM2-135M's weights and 16 rows, oneDNN's linear on a weight reordered into its blocked
layout (``torch.ops.mkldnn._reorder_linear_weight``, what inductor's CPU freezing pass emits) took 35 ms
against MKL's 68 ms on an AMD EPYC (MKL's lm-head product ran at 45 GFLOP/s there, oneDNN's at 155),
and 39 against 45 ms on an Intel Xeon. The reorder is a copy of every weight, so it is redone at the
start of each ``generate`` (the hybrid engine's weights change after every optimizer step) and released
at its end; it costs one to three decode steps.

Since the gain ranges from a wash to 2x with the CPU and is never a loss worth the name, the engine's
default (``packed_linear=None``) packs wherever it can (CPU, fp32 weights, the eager step) and the copy fits
in free memory (:func:`reordered_copy_fits`). It does not choose by timing both ways: on a CPU where the two
are close, a timed choice could differ between a run and its resumption, and with it the rounding of every
product, so a seeded run would no longer repeat itself.

Projections that read the same input in a decoder layer (:data:`FUSED_PROJECTIONS`: q/k/v, gate/up) are
reordered as one stacked weight and computed as one product, whose columns each of them then takes: fewer,
wider products, ~3 ms of a ~57 ms SmolLM2 decode step (q/k/v 230 -> 165 us a layer at 16 rows).

Results equal ``F.linear``'s to fp32 rounding (a different summation order), which the exactness tests of
the decode paths cover.
"""

from __future__ import annotations

import contextlib
import functools
from typing import TypeGuard

import torch


@functools.cache
def packed_linear_unsupported_reason() -> str | None:
    """None when this torch can reorder linear weights for oneDNN, else why not."""
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (mkldnn)"
    try:
        torch.ops.mkldnn._reorder_linear_weight  # noqa: B018  (resolving the op is the check)
        torch.ops.mkldnn._linear_pointwise  # noqa: B018
    except (AttributeError, RuntimeError) as exc:
        return f"torch {torch.__version__} lacks oneDNN's packed linear ops ({exc})"
    return None


def reorder_weight(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """``weight`` [out, in] copied into oneDNN's blocked layout for products of ``rows`` input rows."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, rows)


def onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` computed by oneDNN on ``packed = reorder_weight(weight, rows)``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class _PackedForward:
    """A linear layer's forward on its reordered weight (its ``packed`` weight and ``bias`` readable by
    :func:`packed_product`)."""

    def __init__(self, packed: torch.Tensor, bias: torch.Tensor | None):
        self.packed, self.bias = packed, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return onednn_linear(x, self.packed, self.bias)


def _packable(module: torch.nn.Module | None) -> TypeGuard[torch.nn.Linear]:
    return (
        type(module) is torch.nn.Linear and module.weight.device.type == "cpu" and module.weight.dtype == torch.float32
    )


def _packable_layers(model: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if _packable(m)]


#: Sibling projections that the decoder layers of Llama-family models (Llama, Mistral, Qwen2/3, SmolLM2)
#: apply to one and the same input tensor.
FUSED_PROJECTIONS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class _FusedProjections:
    """Linear layers applied to the same input, computed as one product over their stacked weights.

    The first member called with an input computes every member's output; the others, called with that
    same tensor (the same object, not modified since), take their columns. A member called with another
    input recomputes the product for it, so a model that feeds the members different inputs still gets
    correct results, only slower. Outputs are released once every member has taken its own.
    """

    def __init__(self, layers: list[torch.nn.Linear], rows: int):
        weight = torch.cat([layer.weight.detach() for layer in layers])
        self.packed = reorder_weight(weight, rows)
        biases = [layer.bias for layer in layers]
        self.bias = None if biases[0] is None else torch.cat([b.detach() for b in biases if b is not None])
        self.sizes = [layer.out_features for layer in layers]
        self._input: torch.Tensor | None = None
        self._version = -1
        self._outputs: tuple[torch.Tensor, ...] = ()
        self._pending: set[int] = set()

    @staticmethod
    def fusable(layers: list[torch.nn.Module | None]) -> list[torch.nn.Linear] | None:
        """The layers, if they can be one product: packable, the same input size, all or none with a bias."""
        linear = [layer for layer in layers if _packable(layer)]
        if len(linear) != len(layers):
            return None
        first = linear[0]
        same = all(
            layer.in_features == first.in_features and (layer.bias is None) == (first.bias is None) for layer in linear
        )
        return linear if same else None

    def member_forward(self, index: int) -> _MemberForward:
        return _MemberForward(self, index)

    def output(self, x: torch.Tensor, index: int) -> torch.Tensor:
        if not (x is self._input and x._version == self._version and index in self._pending):
            out = onednn_linear(x, self.packed, self.bias)
            self._input, self._version = x, x._version
            self._outputs = out.split(self.sizes, dim=-1)
            self._pending = set(range(len(self.sizes)))
        self._pending.discard(index)
        output = self._outputs[index]
        if not self._pending:
            self._input, self._outputs = None, ()
        return output


class _MemberForward:
    """The forward of member ``index`` of fused ``projections``."""

    def __init__(self, projections: _FusedProjections, index: int):
        self.projections, self.index = projections, index

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.projections.output(x, self.index)


def packed_product(layers: list[torch.nn.Module]) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """Within :func:`packed_linear_weights`: the reordered weight and the bias that compute ``layers``' outputs
    side by side in one product (one layer packed alone, or a whole group of :data:`FUSED_PROJECTIONS` in
    its order); None when the layers are not packed that way."""
    forwards = [layer.__dict__.get("forward") for layer in layers]
    if len(forwards) == 1 and isinstance(forwards[0], _PackedForward):
        return forwards[0].packed, forwards[0].bias
    if not all(isinstance(f, _MemberForward) for f in forwards):
        return None
    projections = forwards[0].projections  # type: ignore[union-attr]
    in_order = [f.projections is projections and f.index == i for i, f in enumerate(forwards)]  # type: ignore[union-attr]
    if all(in_order) and len(forwards) == len(projections.sizes):
        return projections.packed, projections.bias
    return None


def fused_projection_groups(model: torch.nn.Module) -> list[list[torch.nn.Linear]]:
    """The groups of sibling projections (:data:`FUSED_PROJECTIONS`) that :func:`packed_linear_weights` runs
    as one product each."""
    groups = []
    for parent in model.modules():
        for names in FUSED_PROJECTIONS:
            layers = _FusedProjections.fusable([getattr(parent, name, None) for name in names])
            if layers is not None:
                groups.append(layers)
    return groups


def packable_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights :func:`packed_linear_weights` would reorder (the size of the copy it makes)."""
    return sum(layer.weight.numel() * layer.weight.element_size() for layer in _packable_layers(model))


def reordered_copy_fits(copy_bytes: int, free_bytes: int, total_bytes: int) -> bool:
    """Whether a reordered copy of ``copy_bytes`` leaves room: it must take at most half of the free memory
    (the rest of the step allocates too). ``total_bytes`` 0: the platform cannot tell, assume it fits."""
    return total_bytes == 0 or 2 * copy_bytes <= free_bytes


@contextlib.contextmanager
def packed_linear_weights(model: torch.nn.Module, rows: int):
    """Within the block, every fp32 ``nn.Linear`` of ``model`` on the CPU computes with a reordered copy
    of its weight (reordered for ``rows`` input rows, a performance hint only), the sibling projections of
    :data:`FUSED_PROJECTIONS` as one stacked product."""
    layers = _packable_layers(model)
    rows = max(1, rows)
    try:
        fused: set[torch.nn.Linear] = set()
        for group in fused_projection_groups(model):
            projections = _FusedProjections(group, rows)
            for index, layer in enumerate(group):
                layer.forward = projections.member_forward(index)  # type: ignore[method-assign,assignment]  # shadows the method
            fused.update(group)
        for layer in layers:
            if layer not in fused:
                layer.forward = _PackedForward(reorder_weight(layer.weight.detach(), rows), layer.bias)  # type: ignore[method-assign,assignment]
        yield len(layers)
    finally:
        for layer in layers:
            layer.__dict__.pop("forward", None)
