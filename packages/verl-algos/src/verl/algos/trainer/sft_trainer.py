"""``verl sft``: supervised fine-tuning on the same engines, workers on Ray, verl's checkpoint layout.

At the end the model is exported as a Hugging Face folder, ``<trainer.default_local_dir>/huggingface``,
ready to be ``actor_rollout_ref.model.path`` of an RL run (warm start).
"""

from __future__ import annotations

import logging
import os
import time

from verl.algos.config.sft_schema import SFTConfig
from verl.algos.data.sft_dataset import SFTDataset, sft_collate
from verl.algos.data.source import ResumableBatchOrder, resolve_files
from verl.algos.run.loop import RunLoop, reduce_over_ranks
from verl.algos.workers.sft import SFTWorker
from verl.core.controller import WorkerGroup

logger = logging.getLogger("verl.sft")

HF_EXPORT_DIR = "huggingface"


class SFTTrainer(RunLoop):
    strategy = "fsdp2"

    def __init__(self, config: SFTConfig, model_path: str):
        super().__init__()
        self.config = config
        self.model_path = model_path
        self.local_dir = config.trainer.default_local_dir
        self.group = None
        self.pool = None

    def setup_data(self) -> None:
        from transformers import AutoTokenizer

        cfg = self.config
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer_path or self.model_path)
        cache = os.path.join(self.local_dir, "data")
        args = dict(
            tokenizer=self.tokenizer,
            prompt_key=cfg.data.prompt_key,
            response_key=cfg.data.response_key,
            max_prompt_length=cfg.data.max_prompt_length,
            max_response_length=cfg.data.max_response_length,
            prompt_dict_keys=cfg.data.prompt_dict_keys,
            response_dict_keys=cfg.data.response_dict_keys,
            apply_chat_template_kwargs=cfg.data.apply_chat_template_kwargs,
        )
        self.train_set = SFTDataset(resolve_files(cfg.data.train_files, "train", cfg.data.builtin, cache), **args)
        self.val_set = SFTDataset(
            resolve_files(cfg.data.val_files, "test", cfg.data.builtin, cache),
            max_samples=cfg.data.val_max_samples,
            **args,
        )
        self.train_set[0]  # a bad response_key fails here, before Ray starts
        self.batch_order = ResumableBatchOrder(
            len(self.train_set), cfg.data.train_batch_size, cfg.data.shuffle, cfg.data.seed
        )
        self.plan_steps(cfg.optim)

    def start(self) -> None:
        self.pool = self.start_ray()
        timeout_s = self.config.trainer.worker_timeout_s
        self.group = WorkerGroup(self.pool, SFTWorker, self.config, call_timeout_s=timeout_s)
        self.group.init_model()
        self.start_tracking()
        self.resume()

    def checkpoint_roles(self) -> dict[str, WorkerGroup]:
        return {"actor": self.group}

    def validate(self) -> dict[str, float]:
        rows = [self.val_set[i] for i in range(len(self.val_set))]
        out = self.group.eval_loss(sft_collate(rows))
        return {"val/loss": float(out.batch["nll_sum"].sum() / out.batch["tokens"].sum().clamp(min=1))}

    def train_step(self) -> dict[str, float]:
        start = time.perf_counter()
        batch = sft_collate([self.train_set[i] for i in self.batch_order.next_batch()])
        per_replica = self.group.train_step(batch)  # one result per data-parallel rank (a Ulysses group is one)
        metrics = reduce_over_ranks(per_replica)
        metrics["perf/dp_size"] = len(per_replica)
        metrics["timing_s/step"] = time.perf_counter() - start
        return metrics

    def export(self) -> str:
        """The trained model as a Hugging Face folder, ``<trainer.default_local_dir>/huggingface``."""
        export = os.path.abspath(os.path.join(self.local_dir, HF_EXPORT_DIR))
        self.group.export_hf(export)
        logger.info("exported the fine-tuned model to %s", export)
        return export

    def stop_workers(self) -> None:
        if self.group is not None:
            self.group.shutdown()
        if self.pool is not None:
            self.pool.shutdown()
