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

Results equal ``F.linear``'s to fp32 rounding (a different summation order), which the exactness tests of
the decode paths cover.
"""

from __future__ import annotations

import contextlib
import functools

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


def _packed_forward(weight: torch.Tensor, bias: torch.Tensor | None):
    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")

    return forward


def _packable_layers(model: torch.nn.Module) -> list[torch.nn.Linear]:
    return [
        m
        for m in model.modules()
        if type(m) is torch.nn.Linear and m.weight.device.type == "cpu" and m.weight.dtype == torch.float32
    ]


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
    of its weight (reordered for ``rows`` input rows, a performance hint only)."""
    layers = _packable_layers(model)
    try:
        for layer in layers:
            packed = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), max(1, rows))
            layer.forward = _packed_forward(packed, layer.bias)  # type: ignore[method-assign]  # shadows the method
        yield len(layers)
    finally:
        for layer in layers:
            layer.__dict__.pop("forward", None)
