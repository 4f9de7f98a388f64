"""Linear layers run through oneDNN with weights reordered once per generation (CPU).

A decode step multiplies a few rows (the batch) by every weight matrix. torch's default CPU path for
``F.linear`` (MKL sgemm on the plain row-major weight) is slow at that shape: with SmolLM2-135M's
weights and 16 rows it ran at ~8 GB/s here, a quarter of the memory bandwidth. oneDNN's linear on a weight
reordered into its blocked layout (``torch.ops.mkldnn._reorder_linear_weight``, what inductor's CPU
freezing pass emits) took half the time. The reorder is a copy of every weight, so it is redone at
the start of each ``generate`` (the hybrid engine's weights change after every optimizer step) and
released at its end; it costs about one decode step.

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


@contextlib.contextmanager
def packed_linear_weights(model: torch.nn.Module, rows: int):
    """Within the block, every fp32 ``nn.Linear`` of ``model`` on the CPU computes with a reordered copy
    of its weight (reordered for ``rows`` input rows, a performance hint only)."""
    layers = [
        m
        for m in model.modules()
        if type(m) is torch.nn.Linear and m.weight.device.type == "cpu" and m.weight.dtype == torch.float32
    ]
    try:
        for layer in layers:
            packed = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), max(1, rows))
            layer.forward = _packed_forward(packed, layer.bias)  # type: ignore[method-assign]  # shadows the method
        yield len(layers)
    finally:
        for layer in layers:
            layer.__dict__.pop("forward", None)
