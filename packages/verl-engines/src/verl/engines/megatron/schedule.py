"""Micro-batches through megatron's pipeline schedule, with verl's per-token outputs and loss.

``get_forward_backward_func()`` picks the schedule (no pipelining, 1F1B, interleaved 1F1B for virtual
stages). Every rank of a model-parallel group runs the same micro-batches; the last pipeline stage turns
its vocab-parallel logits into ``log_probs`` (and ``entropy``) of the response tokens, calls verl's
``loss_fn`` there, and the results are broadcast to the other stages, so every rank returns the same.

Loss scaling: verl's ``loss_fn`` returns a loss already scaled for the global batch, and engines *sum*
gradients over micro-batches and data-parallel ranks. megatron divides a loss by the number of
micro-batches unless ``calculate_per_token_loss`` is set, and then scales gradients by a token count in
``finalize_model_grads``; we set the flag (also what makes megatron's DDP sum instead of average) and
finalize without a token count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from verl.core.protocol import DataProto
from verl.engines.fsdp.packing import scatter_to_responses
from verl.engines.megatron.inputs import causal_mask, left_align
from verl.engines.megatron.logprob import tp_vocab_range, vocab_parallel_logprobs

_MODEL_KEYS = ("input_ids", "attention_mask", "responses")


def finalize_grads_without_token_scaling(models, num_tokens=None, **kwargs) -> None:
    """megatron's ``finalize_model_grads`` (DP all-reduce, tied-embedding and layernorm syncs) with the
    gradients summed, not divided by a token count (verl's losses are already scaled)."""
    from megatron.core.distributed import finalize_model_grads

    finalize_model_grads(models, None, **kwargs)


def global_counts(batch: DataProto, dp_size: int, dp_group, device: torch.device | str = "cpu") -> dict[str, int]:
    """What every micro-batch's ``meta_info`` carries (the ``LossFn`` contract): ``dp_size`` and the
    response tokens / sequences of this call's batch summed over the data-parallel ranks (the FSDP
    engine's counts: ``response_mask`` if present, else the responses' attention mask)."""
    t = batch.tensors
    if "response_mask" in t.keys():
        tokens = t["response_mask"].sum()
    else:
        tokens = t["attention_mask"][:, -t["responses"].shape[1] :].sum()
    counts = torch.tensor([float(tokens), float(len(batch))], dtype=torch.float64)
    if dp_size > 1:
        if dist.get_backend(dp_group) != "gloo":
            counts = counts.to(device)
        dist.all_reduce(counts, group=dp_group)
    counts = counts.cpu()
    return {"dp_size": dp_size, "global_response_tokens": int(counts[0]), "global_num_sequences": int(counts[1])}


def run_micro_batches(
    chunks: list[torch.nn.Module],
    micro_batches: list[DataProto],
    *,
    vocab_size: int,
    padded_vocab: int,
    temperature: float = 1.0,
    compute_entropy: bool = False,
    loss_fn: Callable | None = None,
    device: torch.device | str = "cpu",
    values: bool = False,
) -> list[dict[str, Any]]:
    """Forward (and backward when ``loss_fn`` is given) over ``micro_batches``. Returns one dict per
    micro-batch on every rank: ``outputs`` (per-token tensors, [b, R], on the host) for forward only,
    ``metrics`` (what ``loss_fn`` reported) for training. ``values``: the chunks are a value model (its
    head's output per position, replicated over TP) and the outputs are ``values`` instead of
    ``log_probs`` / ``entropy``."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    fixed_width = _fixed_width(chunks, micro_batches)
    step = _MicroBatchStep(
        vocab_size, padded_vocab, temperature, compute_entropy, loss_fn, torch.device(device), values, fixed_width
    )
    iterators = [iter(micro_batches) for _ in chunks]
    results = get_forward_backward_func()(
        forward_step_func=step.forward,
        data_iterator=iterators if len(chunks) > 1 else iterators[0],
        model=chunks if len(chunks) > 1 else chunks[0],
        num_microbatches=len(micro_batches),
        seq_length=fixed_width or int(micro_batches[0].tensors["input_ids"].shape[1]),
        micro_batch_size=len(micro_batches[0]),
        forward_only=loss_fn is None,
    )
    return _from_last_stage(results)


def _fixed_width(chunks: list[torch.nn.Module], micro_batches: list[DataProto]) -> int | None:
    """Interleaved stages (several chunks) exchange fixed shapes ([seq, micro-batch, hidden]): megatron's
    per-message shape exchange (variable_seq_lengths) mismatches there, so every micro-batch is cut to
    the call's longest row and all must have the same number of rows. One chunk (None): each its own width."""
    if len(chunks) == 1:
        return None
    sizes = {len(m) for m in micro_batches}
    if len(sizes) > 1:
        raise ValueError(
            f"with virtual pipeline stages every micro-batch needs the same number of rows, got sizes "
            f"{sorted(sizes)}: make the batch a multiple of the micro-batch size"
        )
    return max(max(1, int(m.tensors["attention_mask"].sum(-1).max())) for m in micro_batches)


class _MicroBatchStep:
    """megatron's ``forward_step_func``: one micro-batch through a model chunk, and (on the last stage)
    its per-token outputs and loss."""

    def __init__(self, vocab_size, padded_vocab, temperature, compute_entropy, loss_fn, device, values, fixed_width):
        from megatron.core import parallel_state as mpu

        self.vocab_size, self.temperature, self.compute_entropy = vocab_size, temperature, compute_entropy
        self.loss_fn, self.device, self.values, self.fixed_width = loss_fn, device, values, fixed_width
        self.tp_group = mpu.get_tensor_model_parallel_group()
        self.vocab_start, _ = tp_vocab_range(
            padded_vocab, mpu.get_tensor_model_parallel_rank(), mpu.get_tensor_model_parallel_world_size()
        )

    def forward(self, data_iterator, model):
        micro = next(data_iterator)
        t = micro.tensors
        missing = [k for k in _MODEL_KEYS if k not in t.keys()]
        if missing:
            raise KeyError(f"the batch lacks {missing}; the engine reads {list(_MODEL_KEYS)} (the rollout layout)")
        aligned = left_align(t["input_ids"], t["attention_mask"], t["responses"])
        # Trim to the longest real row (pipeline stages exchange shapes: variable_seq_lengths).
        width = self.fixed_width or max(1, int(t["attention_mask"].sum(-1).max()))
        ids = aligned.input_ids[:, :width].to(self.device)
        output = model(ids, aligned.position_ids[:, :width].to(self.device), causal_mask(width, self.device))
        return output, lambda logits: self.loss(logits, aligned, width, micro)

    def loss(self, logits: torch.Tensor, aligned: Any, width: int, micro: DataProto):
        kept = logits[aligned.keep[:, :width].to(self.device)]  # [N, V/tp], or [N, 1] for values
        outputs = self.outputs(kept, aligned)
        one = torch.ones((), dtype=torch.int, device=self.device)
        if self.loss_fn is None:
            return kept.sum() * 0.0, one, {"outputs": {k: v.detach().cpu() for k, v in outputs.items()}}
        loss, metrics = self.loss_fn(outputs, micro)
        metrics = {k: (v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v) for k, v in metrics.items()}
        return loss, one, {"metrics": metrics}

    def outputs(self, kept: torch.Tensor, aligned: Any) -> dict[str, torch.Tensor]:
        valid = aligned.response_valid.to(self.device)
        if self.values:
            # Like the FSDP critic: the value of response token j is the output just before it.
            return {"values": scatter_to_responses(kept.squeeze(-1).float(), valid)}
        log_probs, entropy = vocab_parallel_logprobs(
            kept,
            aligned.targets.to(self.device),
            vocab_start=self.vocab_start,
            vocab_size=self.vocab_size,
            group=self.tp_group,
            temperature=self.temperature,
            compute_entropy=self.compute_entropy,
        )
        outputs = {"log_probs": scatter_to_responses(log_probs, valid)}
        if entropy is not None:
            outputs["entropy"] = scatter_to_responses(entropy, valid)
        return outputs


def _from_last_stage(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last pipeline stage's per-micro-batch results, on every stage."""
    from megatron.core import parallel_state as mpu

    if mpu.get_pipeline_model_parallel_world_size() == 1:
        return results
    group = mpu.get_pipeline_model_parallel_group()
    payload: list[Any] = [results if mpu.is_pipeline_last_stage() else None]
    dist.broadcast_object_list(payload, src=dist.get_process_group_ranks(group)[-1], group=group)
    return payload[0]
