"""The peer: TRL's GRPOTrainer doing the same work as ``verl train`` (see ``benchmarks/runners.py``).

    python benchmarks/peers/trl_grpo.py SPEC.json

SPEC gives the model folder, our train/held-out parquet files and the shared settings. TRL gets our
training prompts in the order our trainer visits them (its own shuffling off), scores completions with
our arithmetic scorer, and logs one JSON line per step to ``<out>/steps.jsonl``: the wall time of the
step (generation + loss + backward + optimizer, measured from ``on_step_begin`` to ``on_step_end``),
completion and total tokens, and, every ``eval_every`` steps, held-out greedy accuracy (its time is not
counted as training).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pandas as pd
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from verl.algos.data.source import ResumableBatchOrder
from verl.algos.rewards.default import default_compute_score


def rows_in_our_order(train_file: str, batch_size: int, seed: int) -> pd.DataFrame:
    df = pd.read_parquet(train_file)
    order = ResumableBatchOrder(len(df), batch_size, shuffle=True, seed=seed)
    indices = [i for _ in range(order.batches_per_epoch) for i in order.next_batch()]
    return df.iloc[indices].reset_index(drop=True)


def to_trl_dataset(df: pd.DataFrame) -> Dataset:
    return Dataset.from_dict(
        {
            "prompt": [[{"role": m["role"], "content": m["content"]} for m in p] for p in df["prompt"]],
            "ground_truth": [rm["ground_truth"] for rm in df["reward_model"]],
            "data_source": list(df["data_source"]),
        }
    )


def arithmetic_reward(completions, ground_truth, data_source, **_):
    return [
        float(default_compute_score(src, c[0]["content"], gt))
        for c, gt, src in zip(completions, ground_truth, data_source)
    ]


def greedy_accuracy(model, tokenizer, val: Dataset, max_new_tokens: int, batch_size: int = 64) -> float:
    model.eval()
    correct = 0
    tokenizer.padding_side = "left"
    with torch.no_grad():
        for start in range(0, len(val), batch_size):
            rows = val[start : start + batch_size]
            texts = [
                tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in rows["prompt"]
            ]
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            out = model.generate(
                **enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
            answers = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            scores = [
                default_compute_score(s, a, g) for s, a, g in zip(rows["data_source"], answers, rows["ground_truth"])
            ]
            correct += sum(float(x) for x in scores)
    model.train()
    return correct / len(val)


class StepRecorder(TrainerCallback):
    def __init__(self, path: Path, val: Dataset, tokenizer, spec: dict):
        self.file = open(path, "a")
        self.val, self.tokenizer, self.spec = val, tokenizer, spec
        self.step_start = 0.0
        self.train_s = 0.0
        self.pending: dict = {}
        self.tokens_seen = 0
        self.trainer = None

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def evaluate(self, step: int) -> None:
        start = time.perf_counter()
        acc = greedy_accuracy(self.trainer.model, self.tokenizer, self.val, self.spec["max_new_tokens"])
        self.write({"step": step, "train_s": self.train_s, "val_acc": acc, "eval_s": time.perf_counter() - start})

    def on_train_begin(self, args, state, control, **kwargs):
        if self.spec["eval_every"] > 0:
            self.evaluate(0)

    def on_step_begin(self, args, state, control, **kwargs):
        self.step_start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        step_s = time.perf_counter() - self.step_start
        self.train_s += step_s
        self.pending = {"step": state.global_step, "step_s": step_s}

    def on_log(self, args, state, control, logs=None, **kwargs):
        # TRL logs after on_step_end: completion length and the cumulative prompt+completion tokens
        if not self.pending or not logs or "num_tokens" not in logs:
            return
        completions = self.spec["prompts_per_step"] * self.spec["completions_per_prompt"]
        total = float(logs["num_tokens"]) - self.tokens_seen
        self.tokens_seen = float(logs["num_tokens"])
        record = {
            **self.pending,
            "gen_tokens": float(logs["completions/mean_length"]) * completions,
            "total_tokens": total,
            "reward": float(logs.get("reward", float("nan"))),
        }
        self.write(record)
        self.pending = {}
        every = self.spec["eval_every"]
        if every > 0 and (state.global_step % every == 0 or state.global_step == self.spec["steps"]):
            self.evaluate(state.global_step)


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(os.cpu_count() or 1)  # every core, like our single worker on this machine
    torch.manual_seed(spec["seed"])
    out = Path(spec["out"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    train = to_trl_dataset(rows_in_our_order(spec["train_file"], spec["prompts_per_step"], spec["seed"]))
    val = to_trl_dataset(pd.read_parquet(spec["val_file"]))
    completions = spec["prompts_per_step"] * spec["completions_per_prompt"]
    args = GRPOConfig(
        output_dir=str(out / "trl"),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=completions,
        gradient_accumulation_steps=1,
        num_generations=spec["completions_per_prompt"],
        max_completion_length=spec["max_new_tokens"],
        temperature=spec["temperature"],
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=spec["grad_clip"],
        beta=0.0,
        loss_type="dapo",
        num_iterations=1,
        max_steps=spec["steps"],
        seed=spec["seed"],
        shuffle_dataset=False,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
    )
    recorder = StepRecorder(out / "steps.jsonl", val, tokenizer, spec)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[arithmetic_reward],
        args=args,
        train_dataset=train,
        processing_class=tokenizer,
        callbacks=[recorder],
    )
    recorder.trainer = trainer
    trainer.train()


if __name__ == "__main__":
    main(sys.argv[1])
