"""``SFTWorker``: supervised fine-tuning (token-mean negative log-likelihood of the responses) on any
registered training engine."""

from __future__ import annotations

import time

import torch

from verl.algos.config.sft_schema import SFTConfig
from verl.algos.losses.aggregation import LossNormalizer, agg_loss, global_normalizer
from verl.algos.workers.engine_config import training_engine_values
from verl.algos.workers.engine_worker import EngineWorker
from verl.core.controller import Dispatch, register
from verl.core.engine import LANGUAGE_MODEL, EngineRegistry
from verl.core.protocol import DataProto


def nll_loss_fn(normalizer: LossNormalizer):
    def loss_fn(outputs: dict[str, torch.Tensor], micro: DataProto):
        mask = micro.batch["response_mask"]
        loss = agg_loss(-outputs["log_probs"], mask, "token-mean", normalizer)
        # The micro-batch's own mean NLL, for the metric (the loss is scaled for the global batch).
        local_nll = (-outputs["log_probs"] * mask).sum() / mask.sum().clamp(min=1)
        return loss, {"sft/loss": local_nll.detach()}

    return loss_fn


class SFTWorker(EngineWorker):
    def __init__(self, config: SFTConfig):
        super().__init__(config)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> str:
        cfg = self.config
        model_path = self.begin_init(cfg.model.path)
        engine_cls = EngineRegistry.get(LANGUAGE_MODEL, "fsdp2")
        values = training_engine_values(
            model_path=model_path,
            model=cfg.model,
            optim=cfg.optim,
            fsdp_config=cfg.fsdp_config,
            micro_batch_size=cfg.data.micro_batch_size_per_gpu,
            use_dynamic_bsz=cfg.use_dynamic_bsz,
            max_token_len=cfg.max_token_len_per_gpu,
            sequence_parallel=cfg.ulysses_sequence_parallel_size,
            seed=cfg.trainer.seed,
        )
        self.engine = self.build_engine(engine_cls, values, "fsdp2")
        return model_path

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def train_step(self, batch: DataProto) -> dict[str, float]:
        start = time.perf_counter()
        with self.engine.train_mode():
            # dp_size=1: training engines sum gradients over ranks (see verl.core.engine.LossFn).
            normalizer = global_normalizer(batch.batch["response_mask"], group=self.engine.dp_group, dp_size=1)
            self.engine.optimizer_zero_grad()
            metrics = self.engine.forward_backward(batch, nll_loss_fn(normalizer))
            grad_norm = self.engine.optimizer_step()
            lr = self.engine.lr_scheduler_step()
        losses = metrics["sft/loss"]
        return {
            "sft/loss": float(sum(losses) / len(losses)),
            "sft/grad_norm": grad_norm,
            "sft/lr": lr,
            "timing_s/update_in_worker": time.perf_counter() - start,
        }

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def eval_loss(self, batch: DataProto) -> DataProto:
        """Per row: summed NLL of the response and its token count (padding rows are trimmed by the
        dispatcher, so the driver's totals are exact)."""
        with self.engine.eval_mode():
            log_probs = self.engine.forward_only(batch)["log_probs"]
        mask = batch.batch["response_mask"]
        return DataProto.from_dict({"nll_sum": (-log_probs * mask).sum(-1), "tokens": mask.sum(-1).float()})
