"""The decode step compiled with ``torch.compile``, with the platform's options (CUDA graphs on CUDA).

The step is a whole-model forward of one token per row against a static cache; its shapes are (rows,
cache length), and the first call with a new shape compiles. That time is reported separately
(``timing_s/rollout_compile``) so the warm-up shows as what it is: paid once per shape and run (the
training batch and the validation batch), not per step.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from verl.engines.rollout.hf.transformers_compat import cache_kwarg


def forward_last_logits(model, input_ids, attention_mask, position_ids, cache) -> torch.Tensor:
    """One forward; the logits of the last position [b, V]. The eager decode step, and what is compiled."""
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=True,
        logits_to_keep=1,
        **{cache_kwarg(model): cache},
    )
    return out.logits[:, -1, :]


class CompiledDecodeStep:
    def __init__(self, options: dict[str, Any]):
        self.options = dict(options)
        self._fn = torch.compile(forward_last_logits, **self.options)
        self._seen: set[tuple[int, ...]] = set()

    def __call__(self, model, input_ids, attention_mask, position_ids, cache) -> tuple[torch.Tensor, float]:
        """(last logits [b, V], seconds spent compiling: the whole call when this shape is new, else 0)."""
        shape = (*input_ids.shape, attention_mask.shape[1])
        start = time.perf_counter()
        logits = self._fn(model, input_ids, attention_mask, position_ids, cache)
        if shape in self._seen:
            return logits, 0.0
        self._seen.add(shape)
        return logits, time.perf_counter() - start

    @staticmethod
    def mark_static(cache) -> None:
        """Tell dynamo the cache tensors keep their addresses (CUDA graphs then skip copying them)."""
        for layer in cache.layers:
            torch._dynamo.mark_static_address(layer.keys)
            torch._dynamo.mark_static_address(layer.values)
