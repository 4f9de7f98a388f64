"""Benchmark 1 and 6: end-to-end GRPO, us against TRL's GRPOTrainer on the same work, and where our step
time goes (the hybrid engine's transitions: weight sync, offload and reload).

    python benchmarks/bench_e2e_grpo.py [--out bench_out] [--steps 6] [--rounds 2] [--contenders trl verl-hf verl-vllm]

Each round runs TRL, then us with each rollout engine (``*-before``: with this repository's prompt
sharing and on-policy log-prob reuse switched off, for a before/after), each a fresh process (the order alternates so
every framework sees the same machine load on average; ``verl-hf-plain-rollout``: the hf rollout's plain decode
loop, for the rollout's before/after). Seconds per step are the median over steps
after the first (warm-up); tokens per second are the measured steps' tokens over their time. Ratios
are against TRL in the same invocation. Prints tables, writes ``e2e_grpo.{md,json,png}`` and
``hybrid_transitions.{md,json}``.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import base_parser, markdown_table, median, pyplot, report, runs_folder, save_plot  # noqa: E402
from runners import SAME_WORK, RunResult, run_trl, run_verl  # noqa: E402

from verl.core.platform.cpu import MALLOC_REUSE  # noqa: E402

#: Phases of our step, as the trainer and the hybrid engine time them (timing_s/<phase>).
PHASES = (
    "gen",
    "rollout_wake_up",
    "update_weights",
    "actor_offload",
    "rollout_generate",
    "rollout_pack_weights",
    "rollout_prefill",
    "rollout_decode",
    "rollout_sleep",
    "actor_reload",
    "reward",
    "old_log_prob",
    "adv",
    "update_actor",
)


#: This session's optimizations switched off: the prompt is computed for every response and the old
#: log-probs in a separate forward pass (what verl does by default).
BEFORE = ["actor_rollout_ref.model.share_prompts=false", "actor_rollout_ref.actor.recompute_old_log_prob=true"]
#: The hf rollout's linear layers through MKL's F.linear (the default before the engine packed them for
#: oneDNN wherever it can).
MKL_LINEAR = ["actor_rollout_ref.rollout.engine_kwargs.packed_linear=false"]
#: The hf rollout's norms, rotary embedding and decode attention through torch's operations instead of
#: verl's fused CPU kernels.
NO_CPU_KERNELS = ["actor_rollout_ref.rollout.engine_kwargs.cpu_kernels=false"]
#: The hf rollout as it was before its static decode path: the plain transformers loop over padded
#: prompts (every sample prefilled, cache grown by concatenation) with MKL's default linear layers.
PLAIN_HF_ROLLOUT = ["actor_rollout_ref.rollout.engine_kwargs.cache_implementation=dynamic", *MKL_LINEAR]
#: The CPU platform's allocator setting off (``MALLOC_REUSE``): glibc returns freed blocks to the system
#: and each step faults its large tensors in again.
GLIBC_DEFAULT_MALLOC = {"VERL_CPU_MALLOC_REUSE": "0"}
#: label -> (``trl`` or the rollout engine of ``verl train``, extra overrides, extra environment). TRL's
#: process also runs with the allocator setting our CPU workers get, for a like-for-like ratio.
CONTENDERS = {
    "trl": ("trl", [], {}),
    "trl-malloc-reuse": ("trl", [], MALLOC_REUSE),
    "verl-hf": ("hf", [], {}),
    "verl-vllm": ("vllm", [], {}),
    "verl-hf-before": ("hf", BEFORE, {}),
    "verl-vllm-before": ("vllm", BEFORE, {}),
    "verl-hf-plain-rollout": ("hf", PLAIN_HF_ROLLOUT, {}),
    "verl-hf-glibc-malloc": ("hf", [], GLIBC_DEFAULT_MALLOC),
    "verl-hf-mkl-linear": ("hf", MKL_LINEAR, {}),
    "verl-hf-no-cpu-kernels": ("hf", NO_CPU_KERNELS, {}),
}


def summarize(results: list[RunResult]) -> dict[str, float]:
    steps = [s for r in results for s in r.measured()]
    seconds = sum(s["step_s"] for s in steps)
    return {
        "runs": len(results),
        "failed": sum(1 for r in results if r.returncode != 0),
        "steps": len(steps),
        "step_s": median([s["step_s"] for s in steps]),
        "gen_tok_s": sum(s["gen_tokens"] for s in steps) / seconds if seconds else float("nan"),
        "total_tok_s": sum(s["total_tokens"] for s in steps) / seconds if seconds else float("nan"),
        "startup_s": median([r.wall_s - sum(s["step_s"] for s in r.steps) for r in results]),
    }


def transitions(results: list[RunResult]) -> list[list]:
    """Per rollout engine: each phase's median seconds and share of the step."""
    rows = []
    for label in sorted({r.label for r in results}):
        steps = [s for r in results if r.label == label for s in r.measured()]
        step = median([s["step_s"] for s in steps])
        for phase in PHASES:
            values = [s[f"timing_s/{phase}"] for s in steps if f"timing_s/{phase}" in s]
            if values:
                rows.append([label, phase, median(values), 100.0 * median(values) / step])
    return rows


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--contenders", nargs="+", default=["trl", "verl-hf", "verl-vllm"], choices=list(CONTENDERS))
    args = parser.parse_args()
    out = Path(args.out)
    results: dict[str, list[RunResult]] = defaultdict(list)
    run_root = runs_folder(out, "e2e_runs")
    for round_index in range(args.rounds):
        contenders = list(args.contenders)
        if round_index % 2:
            contenders.reverse()
        for label in contenders:
            folder = str(run_root / f"{label}-{round_index}")
            print(f"round {round_index}: {label} ...", flush=True)
            runner, extra, env = CONTENDERS[label]
            if runner == "trl":
                result = run_trl(label, folder, args.steps, env=env)
            else:
                result = run_verl(label, folder, args.steps, rollout=runner, extra=extra, env=env)
            results[label].append(result)

    summary = {label: summarize(runs) for label, runs in results.items()}
    base = summary.get("trl")
    rows = []
    for label, s in summary.items():
        ratio = (s["total_tok_s"] / base["total_tok_s"]) if base and base["total_tok_s"] else float("nan")
        gen_ratio = (s["gen_tok_s"] / base["gen_tok_s"]) if base and base["gen_tok_s"] else float("nan")
        step_ratio = (base["step_s"] / s["step_s"]) if base else float("nan")
        rows.append(
            [
                label,
                s["steps"],
                s["step_s"],
                step_ratio,
                s["gen_tok_s"],
                gen_ratio,
                s["total_tok_s"],
                ratio,
                s["startup_s"],
            ]
        )
    headers = [
        "run",
        "steps measured",
        "s/step (median)",
        "speed-up vs TRL",
        "generated tok/s",
        "x TRL",
        "trained tok/s",
        "x TRL",
        "startup s",
    ]
    w = SAME_WORK
    notes = [
        f"same work: SmolLM2-135M-Instruct fp32, {w['prompts_per_step']} prompts x {w['completions_per_prompt']} "
        f"completions per step, <= {w['max_new_tokens']} new tokens, same prompts in the same order, lr {w['lr']}",
        f"{args.rounds} alternating rounds of {args.steps} steps; the first step of each run is warm-up and not measured",
        "trained tokens: prompt + completion tokens without padding, per second of step time",
    ]
    failed = {label: s["failed"] for label, s in summary.items() if s["failed"]}
    if failed:
        notes.append(f"failed runs: {failed} (see {run_root}/*/bench-stdout.log)")
    report(out, "e2e_grpo", "End-to-end GRPO: verl vs TRL GRPOTrainer", markdown_table(headers, rows), rows, notes)

    verl_runs = [r for label, runs in results.items() if label.startswith("verl") for r in runs]
    trans = transitions(verl_runs)
    report(
        out,
        "hybrid_transitions",
        "Where our step time goes (median seconds per step and share of the step)",
        markdown_table(["run", "phase", "s/step", "% of step"], trans),
        trans,
        ["update_weights: the actor -> rollout weight sync of the hybrid engine (hf with one rank shares storage)"],
    )

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    labels = list(summary)
    ax.bar(
        labels, [summary[k]["total_tok_s"] for k in labels], color=["#999" if k == "trl" else "#2a7" for k in labels]
    )
    ax.set_ylabel("trained tokens / s")
    ax.set_title("GRPO on SmolLM2-135M, CPU: same work per step")
    save_plot(fig, out, "e2e_grpo")


if __name__ == "__main__":
    main()
