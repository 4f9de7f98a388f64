"""Benchmark 5: how our step time grows as prompts per step, completions per prompt and the response
length limit each double (where does cost grow faster than the work?).

    python benchmarks/bench_scaling.py [--out bench_out] [--steps 4] [--rollout vllm]

Four runs of ``verl train`` with the same settings as benchmark 1 but one dimension doubled. For each:
median seconds per step (first step is warm-up), its growth over the base, the growth of the tokens
actually generated and trained (a response limit only costs what the model generates), and the main
phases. A time ratio above the token ratio means cost grows faster than the work.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import base_parser, markdown_table, median, pyplot, report, runs_folder, save_plot  # noqa: E402
from runners import SAME_WORK, run_verl  # noqa: E402

VARIANTS = {
    "base": [],
    "2x prompts/step": [
        f"data.train_batch_size={2 * SAME_WORK['prompts_per_step']}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={2 * SAME_WORK['prompts_per_step']}",
    ],
    "2x completions/prompt": [f"actor_rollout_ref.rollout.n={2 * SAME_WORK['completions_per_prompt']}"],
    "2x response length": [f"data.max_response_length={2 * SAME_WORK['max_new_tokens']}"],
}
PHASES = ("gen", "update_weights", "update_actor")


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rollout", default="vllm")
    args = parser.parse_args()
    out = Path(args.out)
    measured = {}
    runs = runs_folder(out, "scaling_runs")
    for name, extra in VARIANTS.items():
        folder = runs / name.replace(" ", "_").replace("/", "-")
        print(f"scaling: {name} ...", flush=True)
        result = run_verl(name, str(folder), args.steps, args.rollout, extra=extra)
        steps = result.measured()
        measured[name] = {
            "step_s": median([s["step_s"] for s in steps]),
            "gen_tokens": median([s["gen_tokens"] for s in steps]),
            "total_tokens": median([s["total_tokens"] for s in steps]),
            **{p: median([s.get(f"timing_s/{p}", float("nan")) for s in steps]) for p in PHASES},
            "failed": result.returncode != 0,
        }
    base = measured["base"]
    headers = [
        "variant",
        "s/step",
        "x base",
        "generated tokens",
        "x base",
        "trained tokens",
        "x base",
        *[f"{p} s" for p in PHASES],
    ]
    rows = [
        [
            name,
            m["step_s"],
            m["step_s"] / base["step_s"],
            m["gen_tokens"],
            m["gen_tokens"] / base["gen_tokens"],
            m["total_tokens"],
            m["total_tokens"] / base["total_tokens"],
            *[m[p] for p in PHASES],
        ]
        for name, m in measured.items()
    ]
    notes = [
        f"rollout {args.rollout}; base: {SAME_WORK['prompts_per_step']} prompts x {SAME_WORK['completions_per_prompt']} "
        f"completions, <= {SAME_WORK['max_new_tokens']} tokens; {args.steps} steps per run, first one not measured",
        "tokens are medians per step; 'x base' of time above 'x base' of tokens = cost grows faster than the work",
    ]
    failed = [n for n, m in measured.items() if m["failed"]]
    if failed:
        notes.append(f"failed runs: {failed}")
    report(
        out,
        "scaling",
        f"Scaling of our step time ({args.rollout} rollout)",
        markdown_table(headers, rows),
        measured,
        notes,
    )

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    names = list(measured)
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], [measured[n]["step_s"] / base["step_s"] for n in names], 0.4, label="step time x base")
    ax.bar(
        [i + 0.2 for i in x],
        [measured[n]["total_tokens"] / base["total_tokens"] for n in names],
        0.4,
        label="trained tokens x base",
    )
    ax.set_xticks(list(x), names, rotation=15)
    ax.legend()
    ax.set_title("Step time vs work as one dimension doubles")
    save_plot(fig, out, "scaling")


if __name__ == "__main__":
    main()
