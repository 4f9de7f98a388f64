"""megatron's DistributedDataParallel around the model chunks, summing gradients over data parallelism.

verl's losses are pre-scaled for the global batch and engines SUM gradients over micro-batches and
data-parallel ranks (``verl.core.engine.LossFn``). megatron's DDP pre-scales gradients by ``1 / dp``
unless ``TransformerConfig.calculate_per_token_loss`` is set (then the factor is 1 and the all-reduce
sums); ``model_config.transformer_config`` sets that flag, and :func:`wrap_ddp` refuses a config
without it rather than silently averaging. ``finalize_model_grads`` would then divide by the token count
the schedule collects; ``schedule.finalize_grads_without_token_scaling`` passes none.

Gradients live in DDP's contiguous fp32 buffers (``param.main_grad``); the optimizer copies them to
``param.grad`` in its ``prepare_grads``.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch


def wrap_ddp(chunks: list[torch.nn.Module], *, use_distributed_optimizer: bool = False) -> list[torch.nn.Module]:
    """Each chunk wrapped in megatron's DDP (bf16/fp16 chunks first in ``Float16Module``, as megatron's
    ``get_model`` does), the schedule's hooks set on the shared ``TransformerConfig``."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.transformer.module import Float16Module

    from verl.engines.megatron.schedule import finalize_grads_without_token_scaling

    config: Any = chunks[0].config  # megatron's TransformerConfig
    if not config.calculate_per_token_loss:
        raise ValueError(
            "the megatron engine needs TransformerConfig.calculate_per_token_loss=True: without it megatron's "
            "DDP averages gradients over data-parallel ranks and the schedule divides the loss by the number of "
            "micro-batches, while verl's losses are already scaled for the global batch"
        )
    ddp_config = DistributedDataParallelConfig(
        # fp32 accumulation of the micro-batches' gradients whatever the parameters' dtype.
        grad_reduce_in_fp32=True,
        # One all-reduce after the last micro-batch (finalize_model_grads), not overlapped with backward.
        overlap_grad_reduce=False,
        use_distributed_optimizer=use_distributed_optimizer,
        average_in_collective=False,
    )
    wrapped = []
    for index, chunk in enumerate(chunks):
        if config.bf16 or config.fp16:
            chunk = Float16Module(config, chunk)
        # megatron buckets only the first chunk (the others' grads are reduced together at the end).
        wrapped.append(DistributedDataParallel(config, ddp_config, chunk, disable_bucketing=index > 0))
    config.finalize_model_grads_func = finalize_grads_without_token_scaling
    config.grad_scale_func = None
    return wrapped


def zero_grad_buffers(chunks: list[Any]) -> None:
    """Zero DDP's grad buffers (``main_grad``) of every chunk."""
    for chunk in chunks:
        chunk.zero_grad_buffer()


@contextlib.contextmanager
def accumulate_onto_reduced(chunks: list[torch.nn.Module], already_reduced: bool):
    """Make a second ``forward_backward`` before ``zero_grad`` add to the first one's gradients.

    ``finalize_model_grads`` all-reduces the whole grad buffer (over DP, and the tied embedding over the
    first and last stage). Gradients that are already reduced would be summed again, so they are set
    aside, the buffer zeroed, the new micro-batches reduced alone, and the old sums added back.
    """
    if not already_reduced:
        yield
        return
    params: list[Any] = [p for c in chunks for p in c.parameters() if getattr(p, "main_grad", None) is not None]
    saved = [p.main_grad.clone() for p in params]
    zero_grad_buffers(chunks)
    yield
    with torch.no_grad():
        for param, grad in zip(params, saved, strict=True):
            param.main_grad.add_(grad)
