"""Benchmark: GRPO teaches a small model to use a tool. SmolLM2-135M-Instruct on ``-r tool_grpo`` (3-digit
products, a calculator tool), held-out greedy accuracy and the rate of well-formed tool calls before and
during GRPO, one plot.

    python benchmarks/bench_tool_learning.py [--out bench_out] [--sft-steps 5] [--grpo-steps 16] [--eval-every 4]

SmolLM2-135M-Instruct cannot form a tool call (its chat template has no tool support, and told the call
format in the prompt it writes prose about it) and gets 3-digit products wrong. ``verl sft`` first
warm-starts it for a few steps on the task's first turns (``extra_info.solution``: the call itself),
stopping short of teaching the format fully; ``verl train -r tool_grpo`` then trains on the reward alone
(the numeric reward on the whole response: the last number, the model's answer after the tool's result).
Held-out: the task's test split (never trained on), greedy, through the same agent loop.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import base_parser, markdown_table, median, pyplot, report, save_plot  # noqa: E402

from verl.algos.config import load_config  # noqa: E402
from verl.algos.config.sft_schema import SFTConfig  # noqa: E402
from verl.algos.tracking import read_metrics  # noqa: E402
from verl.algos.trainer.main import run  # noqa: E402
from verl.algos.trainer.sft_main import run_sft  # noqa: E402
from verl.core.config import build_config  # noqa: E402


def sft(out: Path, steps: int, seed: int) -> str:
    cfg = build_config(
        SFTConfig,
        overrides=[
            "model.path=smollm2-135m-instruct",
            "data.train_files=[builtin:calculator]",
            "data.val_files=[builtin:calculator]",
            f"data.builtin.seed={seed}",
            "data.max_prompt_length=192",
            "data.max_response_length=48",
            "data.train_batch_size=8",
            "data.micro_batch_size_per_gpu=8",
            "optim.lr=1e-5",
            "optim.lr_scheduler_type=constant",
            f"trainer.total_training_steps={steps}",
            "trainer.total_epochs=1",
            "trainer.n_gpus_per_node=1",
            f"trainer.seed={seed}",
            f"trainer.default_local_dir={out}",
            "trainer.logger=[file]",
        ],
    )
    return run_sft(cfg)


def grpo(model: str, out: Path, steps: int, eval_every: int, val_size: int, seed: int) -> list[dict]:
    run(
        load_config(
            "tool_grpo",
            [
                f"actor_rollout_ref.model.path={model}",
                f"data.builtin.seed={seed}",
                f"data.val_max_samples={val_size}",
                "data.train_batch_size=8",
                "actor_rollout_ref.rollout.n=4",
                "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                "actor_rollout_ref.actor.optim.lr=2e-5",
                f"trainer.total_training_steps={steps}",
                f"trainer.test_freq={eval_every}",
                "trainer.val_before_train=true",
                "trainer.save_freq=-1",
                "trainer.n_gpus_per_node=1",
                f"trainer.seed={seed}",
                f"trainer.default_local_dir={out}",
                "trainer.logger=[file]",
            ],
        )
    )
    return read_metrics(str(out))


def plot(records: list[dict], out: Path) -> None:
    """Held-out (greedy) accuracy and good-call rate at each evaluation, the training rollouts' (sampled)
    reward and good-call rate at each step."""
    evals = [r for r in records if "val/acc" in r]
    steps = [r for r in records if "actor/grad_norm" in r]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ax.plot([e["step"] for e in evals], [e["val/acc"] for e in evals], "o-", label="held-out accuracy (greedy)")
    ax.plot(
        [e["step"] for e in evals],
        [e.get("val/agent/good_call_rate", 0.0) for e in evals],
        "s--",
        label="held-out good-call rate (greedy)",
    )
    ax.plot([s["step"] for s in steps], [s["critic/score/mean"] for s in steps], ".-", label="train reward (sampled)")
    ax.plot(
        [s["step"] for s in steps],
        [s["agent/good_call_rate"] for s in steps],
        "x:",
        label="train good-call rate (sampled)",
    )
    ax.set_xlabel("GRPO step")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    save_plot(fig, out, "tool_learning")


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--sft-steps", type=int, default=5)
    parser.add_argument("--grpo-steps", type=int, default=16)
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--val-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = Path(args.out)
    start = time.perf_counter()
    warm = sft(out / "tool_learning" / "sft", args.sft_steps, args.seed)
    sft_s = time.perf_counter() - start
    records = grpo(warm, out / "tool_learning" / "grpo", args.grpo_steps, args.eval_every, args.val_size, args.seed)
    evals = [r for r in records if "val/acc" in r]
    steps = [r for r in records if "actor/grad_norm" in r]
    rows = []
    for e in evals:
        window = [s for s in steps if e["step"] - args.eval_every < s["step"] <= e["step"]]
        rows.append(
            [
                e["step"],
                e["val/acc"],
                e.get("val/agent/good_call_rate", float("nan")),
                e.get("val/agent/tool_calls/mean", float("nan")),
                sum(s["critic/score/mean"] for s in window) / len(window) if window else float("nan"),
                sum(s["agent/good_call_rate"] for s in window) / len(window) if window else float("nan"),
            ]
        )
    table = markdown_table(
        [
            "GRPO step",
            "held-out acc",
            "held-out good-call rate",
            "held-out calls / sample",
            "train reward",
            "train good-call rate",
        ],
        rows,
    )
    step_s = [s["timing_s/step"] for s in steps]
    notes = [
        f"warm start: {args.sft_steps} `verl sft` steps of 8 demonstrations ({sft_s:.0f} s); GRPO: 8 prompts x 4 samples "
        f"per step, lr 2e-5, {args.val_size} held-out prompts, greedy",
        f"median GRPO step {median(step_s):.1f} s",
        "good-call rate: share of trajectories with a tool call that was well-formed, valid and ran without error",
    ]
    report(
        out, "tool_learning", "Tool use learnt under GRPO (SmolLM2-135M-Instruct, -r tool_grpo)", table, records, notes
    )
    plot(records, out)


if __name__ == "__main__":
    main()
