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
            # Again with dynamic batching: token-budget micro-batches of varying rows, outputs in row order.
            engine.config.log_prob_use_dynamic_bsz, engine.config.log_prob_max_token_len_per_gpu = True, 24
            dynamic = engine.forward_only(batch, compute_entropy=True)
            weights = {name: tensor.clone() for name, tensor in engine.named_full_parameters()}
        return {"outputs": out, "dynamic": dynamic, "weights": weights, "dp": (engine.dp_rank, engine.dp_size)}
    finally:
        from verl.engines.megatron.parallel import destroy_megatron_parallel

        destroy_megatron_parallel()


def fsdp_engine_outputs(rank, world_size, model_dir, batch: DataProto):
    from verl.engines.fsdp import FSDPEngine, FSDPEngineConfig

    engine = FSDPEngine(FSDPEngineConfig(model_path=model_dir, log_prob_micro_batch_size_per_gpu=2))
    engine.initialize()
    with engine.eval_mode():
        return engine.forward_only(batch, compute_entropy=True)


#: The FSDP tests' optimizer settings (``rank_programs.make_engine``): warmup, weight decay and a large lr so
#: that three steps move every weight visibly. eps 1e-4 instead of 1e-8: some gradients are rounding noise
#: (a key bias's is exactly zero in exact arithmetic: softmax ignores a shift shared by all keys), and Adam
#: turns any noise above eps into a full lr-sized step of random sign; 1e-4 keeps those steps negligible.
OPTIM = {"lr": 1e-2, "lr_warmup_steps": 3, "weight_decay": 0.1, "eps": 1e-4}


def whole_batch_loss(total: int):
    """``rank_programs.token_mean_loss`` normalised by a fixed token count instead of the call's."""
    from rank_programs import token_mean_loss

    def loss_fn(outputs, micro_batch):
        view = micro_batch.select()  # a view with its own meta_info dict
        view.meta_info["global_response_tokens"] = total
        return token_mean_loss(outputs, view)

    return loss_fn


def megatron_training(
    rank,
    world_size,
    model_dir,
    megatron: dict,
    batch: DataProto,
    steps: int,
    micro: int,
    split_first_call: bool = False,
    nan_step: bool = False,
    engine_config: dict | None = None,
):
    """``steps`` optimizer steps of MegatronEngine on ``batch`` (split over its data-parallel ranks): the
    first step's gathered gradients, each step's metrics / grad norm / lr, and the final HF weights.

    ``split_first_call``: the first step's gradients come from two ``forward_backward`` calls on the two
    halves of the shard (accumulated, not reduced twice). With offload in ``megatron``, every train_mode /
    eval_mode moves parameters and optimizer state back and forth and frees / restores the grad buffers. ``nan_step``: then one more step whose loss is
    nan; its grad norm and the weights after it are returned too (the update must be skipped).
    ``engine_config``: more MegatronEngineConfig fields (dynamic batching)."""
    from rank_programs import token_mean_loss

    from verl.engines.megatron.config import MegatronEngineConfig
    from verl.engines.megatron.engine import MegatronEngine
    from verl.engines.megatron.parallel import destroy_megatron_parallel

    engine = MegatronEngine(
        MegatronEngineConfig(
            model_path=model_dir,
            megatron=megatron,
            optim=OPTIM,
            ppo_micro_batch_size_per_gpu=micro,
            **(engine_config or {}),
        )
    )
    engine.initialize()
    try:
        shard = batch.chunk(engine.dp_size)[engine.dp_rank]
        out: dict = {"metrics": [], "grad_norms": [], "lrs": [engine.lr]}
        with engine.train_mode():
            for step in range(steps):
                engine.optimizer_zero_grad()
                if step == 0 and split_first_call:
                    # Each call's global_response_tokens counts only its half: normalise by the whole batch's.
                    total = int(batch.batch["response_mask"].sum())
                    parts = [engine.forward_backward(half, whole_batch_loss(total)) for half in shard.chunk(2)]
                    out["metrics"].append({k: parts[0][k] + parts[1][k] for k in parts[0]})
                else:
                    out["metrics"].append(engine.forward_backward(shard, token_mean_loss))
                if step == 0 and not engine.config.megatron.use_distributed_optimizer:
                    out["grads"] = {n: g.clone() for n, g in engine.named_full_gradients()}
                out["grad_norms"].append(engine.optimizer_step())
                out["lrs"].append(engine.lr_scheduler_step())
        out["offload_state"] = engine.offload_state
        out["optimizers"] = sorted(type(sub).__name__ for sub in getattr(engine.optimizer, "chained_optimizers", []))
        with engine.eval_mode():
            out["weights"] = {n: t.clone() for n, t in engine.named_full_parameters()}
        out["dp"] = (engine.dp_rank, engine.dp_size)
        if nan_step:

            def nan_loss(outputs, micro_batch):
                loss, metrics = token_mean_loss(outputs, micro_batch)
                return loss * float("nan"), metrics

            with engine.train_mode():
                engine.optimizer_zero_grad()
                engine.forward_backward(shard, nan_loss)
                out["nan_grad_norm"] = engine.optimizer_step()
            with engine.eval_mode():
                out["weights_after_nan"] = {n: t.clone() for n, t in engine.named_full_parameters()}
        return out
    finally:
        destroy_megatron_parallel()


def fsdp_training(rank, world_size, model_dir, batch: DataProto, steps: int, micro: int):
    """The same as :func:`megatron_training` with the FSDP2 engine."""
    from rank_programs import full_params, make_engine, train_step

    engine = make_engine(model_dir, optim=OPTIM, ppo_micro_batch_size_per_gpu=micro)
    out: dict = {"metrics": [], "grad_norms": [], "lrs": [engine.lr]}
    for step in range(steps):
        result = train_step(engine, batch, rank, world_size)
        if step == 0:
            out["grads"] = result["grads"]
        out["metrics"].append(result["metrics"])
        out["grad_norms"].append(result["grad_norm"])
        out["lrs"].append(engine.lr)
    with engine.eval_mode():
        out["weights"] = full_params(engine)
    return out


def _engine(model_dir, megatron: dict, micro: int = 2):
    from verl.engines.megatron.config import MegatronEngineConfig
    from verl.engines.megatron.engine import MegatronEngine

    engine = MegatronEngine(
        MegatronEngineConfig(model_path=model_dir, megatron=megatron, optim=OPTIM, ppo_micro_batch_size_per_gpu=micro)
    )
    engine.initialize()
    return engine


def _step(engine, batch: DataProto) -> float:
    from rank_programs import token_mean_loss

    with engine.train_mode():
        engine.optimizer_zero_grad()
        engine.forward_backward(batch.chunk(engine.dp_size)[engine.dp_rank], token_mean_loss)
        norm = engine.optimizer_step()
        engine.lr_scheduler_step()
    return norm


def _weights(engine) -> dict[str, torch.Tensor]:
    with engine.eval_mode():
        return {n: t.clone() for n, t in engine.named_full_parameters()}


def checkpoint_round(rank, world_size, model_dir, megatron: dict, batch_a, batch_b, ckpt_dir, export_dir=None):
    """Without ``export_dir``: load ``ckpt_dir``, then step on ``batch_b``. With it: step on ``batch_a``, save
    ``ckpt_dir``, export, step on ``batch_b``. Returns the weights at the checkpoint and after ``batch_b``."""
    from verl.engines.megatron.parallel import destroy_megatron_parallel

    engine = _engine(model_dir, megatron)
    try:
        if export_dir is None:
            engine.load_checkpoint(ckpt_dir)
        else:
            _step(engine, batch_a)
            engine.save_checkpoint(ckpt_dir)
            engine.export_hf(export_dir)
        at_checkpoint = {"weights": _weights(engine), "lr": engine.lr, "rng": torch.get_rng_state()}
        norm = _step(engine, batch_b)
        return {"at_checkpoint": at_checkpoint, "after": _weights(engine), "norm": norm, "lr": engine.lr}
    finally:
        destroy_megatron_parallel()


def value_training(rank, world_size, model_dir, megatron: dict | None, batch: DataProto, steps: int, export_dir=None):
    """A value model (MegatronValueEngine with ``megatron``, else FSDPValueEngine): forward-only values,
    the first step's gradients, ``steps`` optimizer steps of ``rank_programs.value_loss`` (grad norms,
    metrics) and the final weights; then the export (megatron) into ``export_dir``."""
    from rank_programs import value_loss

    if megatron is None:
        from verl.engines.fsdp import FSDPEngineConfig, FSDPValueEngine

        engine = FSDPValueEngine(FSDPEngineConfig(model_path=model_dir, optim=OPTIM, ppo_micro_batch_size_per_gpu=2))
        engine.initialize()

        def gradients():
            return {n: p.grad.full_tensor().clone() for n, p in engine.module.named_parameters()}

    else:
        from verl.engines.megatron.config import MegatronEngineConfig
        from verl.engines.megatron.engine import MegatronValueEngine

        engine = MegatronValueEngine(
            MegatronEngineConfig(model_path=model_dir, megatron=megatron, optim=OPTIM, ppo_micro_batch_size_per_gpu=2)
        )
        engine.initialize()

        def gradients():
            return {n: g.clone() for n, g in engine.named_full_gradients()}

    try:
        shard = batch.chunk(engine.dp_size)[engine.dp_rank]
        with engine.eval_mode():
            out: dict = {"values": engine.forward_only(shard), "metrics": [], "grad_norms": []}
        with engine.train_mode():
            for step in range(steps):
                engine.optimizer_zero_grad()
                out["metrics"].append(engine.forward_backward(shard, value_loss))
                if step == 0:
                    out["grads"] = gradients()
                out["grad_norms"].append(engine.optimizer_step())
                engine.lr_scheduler_step()
            out["weights"] = {n: t.clone() for n, t in engine.named_full_parameters()}
        if export_dir is not None:
            engine.export_hf(export_dir)
        return out
    finally:
        if megatron is not None:
            from verl.engines.megatron.parallel import destroy_megatron_parallel

            destroy_megatron_parallel()


def value_from_causal_lm(rank, world_size, model_dir, megatron: dict, batch: DataProto):
    """MegatronValueEngine started from a causal-LM folder (a critic's usual start): its values and weights."""
    from verl.engines.megatron.config import MegatronEngineConfig
    from verl.engines.megatron.engine import MegatronValueEngine
    from verl.engines.megatron.parallel import destroy_megatron_parallel

    engine = MegatronValueEngine(MegatronEngineConfig(model_path=model_dir, megatron=megatron))
    engine.initialize()
    try:
        with engine.eval_mode():
            values = engine.forward_only(batch)["values"]
        return {"values": values, "weights": {n: t.clone() for n, t in engine.named_full_parameters()}}
    finally:
        destroy_megatron_parallel()


def moe_engine_outputs(rank, world_size, model_dirs, megatron: dict, batch: DataProto):
    """For each (MoE) model folder, one MegatronEngine after another in this process: forward-only
    log-probs / entropy of the whole ``batch`` (every data-parallel rank sends its tokens to the experts'
    ranks) and the gathered HF weights."""
    from verl.engines.megatron.config import MegatronEngineConfig
    from verl.engines.megatron.engine import MegatronEngine
    from verl.engines.megatron.parallel import destroy_megatron_parallel

    out = {}
    try:
        for model_dir in model_dirs:
            engine = MegatronEngine(
                MegatronEngineConfig(model_path=model_dir, megatron=megatron, log_prob_micro_batch_size_per_gpu=2)
            )
            engine.initialize()
            with engine.eval_mode():
                outputs = engine.forward_only(batch, compute_entropy=True)
                weights = {name: tensor.clone() for name, tensor in engine.named_full_parameters()}
            out[model_dir] = {"outputs": outputs, "weights": weights, "ep": engine.layout.ep}
        return out
    finally:
        destroy_megatron_parallel()
