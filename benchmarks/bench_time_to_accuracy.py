"""Benchmark 2: time to accuracy. Held-out greedy accuracy on the a+b task (128 problems disjoint from
the 313 training ones) against training wall time, us and TRL's GRPOTrainer, one plot.

    python benchmarks/bench_time_to_accuracy.py [--out bench_out] [--steps 20] [--eval-every 5] [--rollout vllm]

Same work as benchmark 1 (``runners.SAME_WORK``). The x axis is the cumulative time of training steps
(validation and start-up excluded on both sides: the same greedy evaluation of 128 prompts is not what
is compared). The table gives each run's accuracy by step and the time at which each of our runs first
reaches TRL's final accuracy. One seed per framework: with 2 prompts per step and 128 validation
problems, accuracy has about +-4 points of noise.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import base_parser, markdown_table, plot_accuracy_over_time, report, runs_folder  # noqa: E402
from runners import run_trl, run_verl  # noqa: E402


def first_time_reaching(evals: list[dict], target: float) -> float | None:
    for e in evals:
        if e["val_acc"] >= target:
            return e["train_s"]
    return None


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--rollouts", nargs="+", default=["vllm"])
    args = parser.parse_args()
    out = Path(args.out)
    folder = runs_folder(out, "tta_runs")
    runs = [run_trl("trl", str(folder / "trl"), args.steps, args.eval_every)]
    for rollout in args.rollouts:
        label = f"verl-{rollout}"
        runs.append(run_verl(label, str(folder / label), args.steps, rollout, args.eval_every))

    trl = runs[0]
    target = trl.evals[-1]["val_acc"] if trl.evals else float("nan")
    trl_time = trl.evals[-1]["train_s"] if trl.evals else float("nan")
    steps = sorted({e["step"] for r in runs for e in r.evals})
    headers = [
        "run",
        *[f"acc @ step {s}" for s in steps],
        "train s",
        f"s to reach TRL's final {target:.3f}",
        "x TRL's time",
    ]
    rows = []
    for r in runs:
        by_step = {e["step"]: e["val_acc"] for e in r.evals}
        reach = first_time_reaching(r.evals, target)
        rows.append(
            [
                r.label,
                *[by_step.get(s, "") for s in steps],
                r.evals[-1]["train_s"] if r.evals else float("nan"),
                reach if reach is not None else "not reached",
                (reach / trl_time) if reach is not None and trl_time else "",
            ]
        )
    notes = [
        f"{args.steps} steps, greedy held-out accuracy every {args.eval_every} steps (128 problems, +-4 points noise)",
        "train s: cumulative step time, validation and start-up excluded; the target is TRL's final accuracy",
    ]
    failed = [r.label for r in runs if r.returncode]
    if failed:
        notes.append(f"failed runs: {failed}")
    report(
        out,
        "time_to_accuracy",
        "Time to accuracy: a+b held-out greedy accuracy",
        markdown_table(headers, rows),
        [r.__dict__ for r in runs],
        notes,
    )

    plot_accuracy_over_time(runs, out, "time_to_accuracy", "GRPO on SmolLM2-135M, a+b task, CPU", target)


if __name__ == "__main__":
    main()
