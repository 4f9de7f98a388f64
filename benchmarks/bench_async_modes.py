"""Synchronous, one-step-off-policy and fully asynchronous training on the main job, side by side in one
invocation.

    python benchmarks/bench_async_modes.py [--out bench_out] [--steps 12] [--eval-every 4] [--rollout hf]

Same work as the end-to-end benchmark (``runners.SAME_WORK``: SmolLM2-135M, 2 prompts x 8 samples, at most
24 new tokens, fp32) on this machine's cores, split two ways:

- ``sync``: the hybrid engine, every role in each of 2 processes, generation then training;
- ``one_step_off``: the recipe ``grpo_one_step_off``, 1 process trains while 1 process generates the next
  batch with the weights one update old (bypass mode: the ratio is taken against the rollout's log-probs);
- ``fully_async``: the recipe ``grpo_async``, the same two processes, the rollout generating continuously
  (up to 3 steps' worth of prompts per push, a push every 2 steps, partial rollouts).

Reported: median s/step after the first (warm-up) step, trained tokens/s, the time a step still waits for
generation, the weight push, held-out greedy accuracy by step, and at equal training wall time (each run's
accuracy at the time the faster run finished, from its last evaluation by then). The plot is accuracy
against training wall time (validation and start-up excluded on both sides).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import base_parser, markdown_table, median, plot_accuracy_over_time, report, runs_folder  # noqa: E402
from runners import RunResult, run_verl  # noqa: E402

#: Both asynchronous modes: 1 process trains, 1 generates, and the loss takes the rollout's own log-probs.
APART = [
    "actor_rollout_ref.hybrid_engine=false",
    "trainer.n_gpus_per_node=1",
    "rollout.nnodes=1",
    "rollout.n_gpus_per_node=1",
    "algorithm.rollout_correction.bypass_mode=true",
    "actor_rollout_ref.rollout.calculate_log_probs=true",
]

MODES = {
    "sync": ["trainer.n_gpus_per_node=2"],
    "one_step_off": [
        "async_training.mode=one_step_off",
        *APART,
    ],
    "fully_async": [
        "async_training.mode=fully_async",
        "async_training.staleness_threshold=0.5",
        "async_training.trigger_parameter_sync_step=2",
        "async_training.partial_rollout=true",
        *APART,
    ],
}


def accuracy_by(run: RunResult, seconds: float) -> float | None:
    """The run's held-out accuracy as of ``seconds`` of training (its last evaluation by then)."""
    reached = [e["val_acc"] for e in run.evals if e["train_s"] <= seconds + 1e-9]
    return reached[-1] if reached else None


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--rollout", default="hf")
    args = parser.parse_args()
    out = Path(args.out)
    folder = runs_folder(out, "async_runs")
    runs = [
        run_verl(mode, str(folder / mode), args.steps, args.rollout, args.eval_every, extra)
        for mode, extra in MODES.items()
    ]
    finished = [r for r in runs if r.steps]
    equal_time = min(sum(s["step_s"] for s in r.steps) for r in finished) if finished else 0.0
    eval_steps = sorted({e["step"] for r in runs for e in r.evals})
    headers = [
        "mode",
        "s/step",
        "x sync",
        "trained tokens/s",
        "waits for gen s/step",
        "weight push s/step",
        *[f"acc @ step {s}" for s in eval_steps],
        f"acc @ {equal_time:.0f} s",
    ]
    rows = []
    sync_step = None
    for r in runs:
        measured = r.measured()
        step_s = median([s["step_s"] for s in measured]) if measured else float("nan")
        sync_step = step_s if r.label == "sync" else sync_step
        tokens_s = sum(s["total_tokens"] for s in measured) / max(1e-9, sum(s["step_s"] for s in measured))
        by_step = {e["step"]: e["val_acc"] for e in r.evals}
        rows.append(
            [
                r.label,
                step_s,
                (sync_step / step_s) if sync_step and step_s else "",
                tokens_s,
                median([s.get("timing_s/gen", 0.0) for s in measured]) if measured else "",
                median([s.get("timing_s/weight_sync", 0.0) for s in measured]) if measured else "",
                *[by_step.get(s, "") for s in eval_steps],
                accuracy_by(r, equal_time) if r.evals else "",
            ]
        )
    notes = [
        f"{args.steps} steps, rollout {args.rollout}; greedy held-out accuracy every {args.eval_every} steps "
        "(128 problems, about +-4 points of noise)",
        "x sync: the sync run's s/step over this run's (higher is faster)",
        "waits for gen: the part of a step spent waiting for its batch (the async modes: what the overlap did not "
        "hide)",
    ]
    for r in runs:  # how stale the fully async run's samples were, and how many spanned a push
        lags = [s["async/staleness_mean"] for s in r.steps if "async/staleness_mean" in s]
        if lags:
            partial = [s.get("async/partial_ratio", 0.0) for s in r.steps]
            notes.append(
                f"{r.label}: samples {sum(lags) / len(lags):.2f} updates old on average (max "
                f"{max(s['async/staleness_max'] for s in r.steps):.0f}), {sum(partial) / len(partial):.0%} of them "
                "generated across a push (partial rollouts)"
            )
    failed = [r.label for r in runs if r.returncode]
    if failed:
        notes.append(f"failed runs: {failed}")
    report(
        out,
        "async_modes",
        "Sync vs one-step-off vs fully asynchronous GRPO on the main job",
        markdown_table(headers, rows),
        [r.__dict__ for r in runs],
        notes,
    )

    plot_accuracy_over_time(runs, out, "async_modes", "GRPO on SmolLM2-135M, a+b task, CPU: sync vs asynchronous")


if __name__ == "__main__":
    main()
