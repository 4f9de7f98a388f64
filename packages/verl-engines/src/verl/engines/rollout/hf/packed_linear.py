"""Linear layers run through oneDNN with weights reordered once per generation (CPU), where that pays.

A decode step multiplies a few rows (the batch) by every weight matrix. torch's default CPU path for
``F.linear`` (MKL sgemm on the plain row-major weight) can be slow at that shape, by how much depends on
the CPU: with SmolLM2-135M's weights and 16 rows, oneDNN's linear on a weight reordered into its blocked
layout (``torch.ops.mkldnn._reorder_linear_weight``, what inductor's CPU freezing pass emits) took 35 ms
against MKL's 68 ms on an AMD EPYC (MKL's lm-head product ran at 45 GFLOP/s there, oneDNN's at 155),
and 39 against 45 ms on an Intel Xeon. The reorder is a copy of every weight, so it is redone at the
start of each ``generate`` (the hybrid engine's weights change after every optimizer step) and released
at its end; it costs one to three decode steps.

Since the gain ranges from a wash to 2x with the CPU, the engine's default (``packed_linear=None``) decides
by measurement: :func:`probe_packed_linear` times one step's products both ways, and the reorder, on the
model's own weights at the run's rows, once per engine.

Results equal ``F.linear``'s to fp32 rounding (a different summation order), which the exactness tests of
the decode paths cover.
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass

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


@dataclass(frozen=True)
class LinearProbe:
    """One decode step's linear products timed both ways on the model's weights (best of a few sweeps)."""

    rows: int
    steps: int
    plain_s: float  # every layer through F.linear
    packed_s: float  # every layer through oneDNN on reordered weights
    reorder_s: float  # reordering every weight once (paid per generate)

    @property
    def use_packed(self) -> bool:
        """Whether ``steps`` steps on packed weights, reorder included, beat the plain products."""
        return self.reorder_s + self.steps * self.packed_s < self.steps * self.plain_s


def probe_packed_linear(model: torch.nn.Module, rows: int, steps: int, sweeps: int = 3) -> LinearProbe:
    """Times the model's fp32 CPU linear layers at ``rows`` input rows: F.linear, the reorder, and oneDNN on
    the reordered weights, alternating sweeps so that a noisy neighbour hits both alike. ``steps``: forwards
    per generate that would share one reorder (the decode steps)."""
    layers = _packable_layers(model)
    inputs = {k: torch.randn(rows, k) for k in {layer.in_features for layer in layers}}

    def timed(fn) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    def reorder() -> list[torch.Tensor]:
        return [torch.ops.mkldnn._reorder_linear_weight(layer.weight, max(1, rows)) for layer in layers]

    with torch.no_grad():
        # Twice: the first reorder also faults its fresh memory in, which later generates mostly reuse.
        reorder_s = min(timed(reorder) for _ in range(2))
        packed = reorder()

        def plain_sweep():
            for layer in layers:
                torch.nn.functional.linear(inputs[layer.in_features], layer.weight, layer.bias)

        def packed_sweep():
            for layer, weight in zip(layers, packed, strict=True):
                torch.ops.mkldnn._linear_pointwise(inputs[layer.in_features], weight, layer.bias, "none", [], "")

        plain_sweep(), packed_sweep()  # first touches (page faults, oneDNN's kernel creation)
        plain, fast = [], []
        for _ in range(sweeps):
            plain.append(timed(plain_sweep))
            fast.append(timed(packed_sweep))
    return LinearProbe(rows, steps, min(plain), min(fast), reorder_s)


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
