"""Programs the megatron tests run on each gloo rank (``engine_helpers.run_ranks`` spawns them)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron_helpers import hf_state, megatron_rank

from verl.core.protocol import DataProto


def _build(model_dir: str):
    from transformers import AutoConfig

    from verl.engines.megatron.build import Layout, build_model_chunks, load_hf_weights
    from verl.engines.megatron.model_config import model_shape

    shape = model_shape(AutoConfig.from_pretrained(model_dir))
    layout = Layout.current()
    chunks, padded = build_model_chunks(shape, layout, "local", use_cpu_initialization=True)
    load_hf_weights(chunks, hf_state(model_dir), shape, layout, padded)
    for chunk in chunks:
        chunk.eval()
    return shape, layout, chunks, padded


def _full_logits(chunks, input_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B, S, vocab] logits of unpadded rows through the pipeline schedule, TP slices gathered (test
    only: the engine never gathers the vocabulary)."""
    from megatron.core import parallel_state as mpu
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    from verl.engines.megatron.inputs import causal_mask

    b, s = input_ids.shape

    def forward_step(data_iterator, model):
        ids = next(data_iterator)
        out = model(ids, torch.arange(s).expand(b, -1), causal_mask(s))

        def loss_func(logits):
            full = gather_from_tensor_model_parallel_region(logits)[..., :vocab_size]
            return logits.sum() * 0.0, torch.ones((), dtype=torch.int), {"logits": full.detach()}

        return out, loss_func

    results = get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter([input_ids]),
        model=chunks[0],
        num_microbatches=1,
        seq_length=s,
        micro_batch_size=b,
        forward_only=True,
    )
    payload = [results[0]["logits"] if mpu.is_pipeline_last_stage() else None]
    group = mpu.get_pipeline_model_parallel_group()
    dist.broadcast_object_list(payload, src=dist.get_process_group_ranks(group)[-1], group=group)
    return payload[0]


def logits_and_logprobs(rank, world_size, model_dirs, tp, pp, input_ids, batch: DataProto, micro_batch_size: int):
    """For each model folder: full logits of ``input_ids`` and the per-token log-probs / entropy of the
    rollout ``batch`` (in micro-batches), from a TP x PP megatron layout."""
    from verl.engines.megatron.schedule import run_micro_batches

    out = {}
    with megatron_rank(tp=tp, pp=pp):
        for model_dir in model_dirs:
            shape, _, chunks, padded = _build(model_dir)
            with torch.no_grad():
                logits = _full_logits(chunks, input_ids, shape.vocab_size)
                micro = batch.split(micro_batch_size)
                results = run_micro_batches(
                    chunks,
                    micro,
                    vocab_size=shape.vocab_size,
                    padded_vocab=padded,
                    temperature=0.8,
                    compute_entropy=True,
                )
            out[model_dir] = {
                "logits": logits,
                "log_probs": torch.cat([r["outputs"]["log_probs"] for r in results]),
                "entropy": torch.cat([r["outputs"]["entropy"] for r in results]),
            }
    return out


def vocab_parallel_on_slices(
    rank, world_size, logits: torch.Tensor, targets: torch.Tensor, vocab_size: int, temperature
):
    """Log-probs / entropy (and their gradients) from this rank's vocabulary slice of ``logits``, the
    world being the TP group."""
    from verl.engines.megatron.logprob import tp_vocab_range, vocab_parallel_logprobs

    start, end = tp_vocab_range(logits.shape[1], rank, world_size)
    local = logits[:, start:end].clone().requires_grad_(True)
    logp, entropy = vocab_parallel_logprobs(
        local,
        targets,
        vocab_start=start,
        vocab_size=vocab_size,
        group=dist.group.WORLD,
        temperature=temperature,
        compute_entropy=True,
    )
    (logp.sum() + 0.5 * entropy.sum()).backward()
    return {"log_probs": logp.detach(), "entropy": entropy.detach(), "grad": local.grad}


def megatron_engine_outputs(rank, world_size, model_dir, megatron: dict, batch: DataProto):
    """MegatronEngine: forward-only log-probs / entropy of ``batch`` and the gathered HF weights."""
    from verl.engines.megatron.config import MegatronEngineConfig
    from verl.engines.megatron.engine import MegatronEngine

    engine = MegatronEngine(
        MegatronEngineConfig(model_path=model_dir, megatron=megatron, log_prob_micro_batch_size_per_gpu=2)
    )
    engine.initialize()
    try:
        with engine.eval_mode():
            out = engine.forward_only(batch, compute_entropy=True)
        weights = {name: tensor.clone() for name, tensor in engine.named_full_parameters()}
        return {"outputs": out, "weights": weights, "dp": (engine.dp_rank, engine.dp_size)}
    finally:
        from verl.engines.megatron.parallel import destroy_megatron_parallel

        destroy_megatron_parallel()


def fsdp_engine_outputs(rank, world_size, model_dir, batch: DataProto):
    from verl.engines.fsdp import FSDPEngine, FSDPEngineConfig

    engine = FSDPEngine(FSDPEngineConfig(model_path=model_dir, log_prob_micro_batch_size_per_gpu=2))
    engine.initialize()
    with engine.eval_mode():
        return engine.forward_only(batch, compute_entropy=True)
