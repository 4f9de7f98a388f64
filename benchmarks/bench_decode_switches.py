"""The hf rollout's CPU decode switches side by side in one process: ``cpu_kernels`` (fused C++ kernels for
RMSNorm, rotary embedding, decode attention and the cache update) x ``shared_prefix`` (a prompt's keys and
values once for its n samples), at one or more prompt lengths.

    python benchmarks/bench_decode_switches.py [--out bench_out] [--contexts 0 450 1500] [--rounds 6]

One engine (SmolLM2-135M-Instruct, the main job's 2 a+b prompts x 8 samples, 24 tokens, every token
forced) switches between the four combinations in turns, so they see the same weights, prompts and
moments of the machine; the first round is the warm-up. ``--contexts`` puts that many random tokens
before every prompt (0: the main job's 43-token prompts, padded to 128 as the trainer hands them over).
The ratio column is each combination's median decode step against the engine's default at that length.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_rollout import arithmetic_prompts  # noqa: E402
from bench_rollout_roofline import padded_to, with_context, with_worker_env  # noqa: E402
from common import base_parser, markdown_table, report  # noqa: E402

COMBINATIONS = [(kernels, shared) for kernels in (True, False) for shared in (True, False)]


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--contexts", type=int, nargs="+", default=[0, 450, 1500])
    parser.add_argument("--rounds", type=int, default=6, help="timed rounds (after one warm-up round)")
    args = parser.parse_args()

    from verl.core.engine import SamplingParams
    from verl.core.platform import get_platform
    from verl.engines.model_zoo import resolve_model_path
    from verl.engines.rollout.hf import HFRolloutConfig, HFRolloutEngine
    from verl.engines.rollout.hf.static_decode import SHARED_PREFIX_MIN_PROMPT

    platform = get_platform()
    worker_env = with_worker_env(platform)
    torch.set_num_threads(platform.torch_threads_per_worker(1))
    model_path = resolve_model_path(args.model)
    engine = HFRolloutEngine(HFRolloutConfig(model_path=model_path))
    if not engine.cpu_kernels:
        raise SystemExit("the CPU kernels are not available here (see the warning above); nothing to compare")
    engine.eos_token_ids = [engine.model.config.vocab_size]  # never sampled: every row decodes every token
    sampling = SamplingParams(n=8, max_new_tokens=24, logprobs=True, seed=1)
    rows, records = [], []
    for context in args.contexts:
        prompts = with_context(arithmetic_prompts(model_path, 2), context)
        prompts = padded_to(prompts, max(128, prompts.batch["input_ids"].shape[1]), engine.pad_token_id)
        prompt_tokens = float(prompts.batch["attention_mask"].sum(-1).float().mean())
        steps: dict[tuple[bool, bool], list[float]] = {c: [] for c in COMBINATIONS}
        for round_ in range(args.rounds + 1):
            for kernels, shared in COMBINATIONS:
                engine.cpu_kernels, engine.shared_prefix = kernels, shared
                metrics = engine.generate(prompts, sampling).meta_info["metrics"]
                if round_:
                    steps[(kernels, shared)].append(
                        metrics["timing_s/rollout_decode"] / metrics["rollout/decode_steps"]
                    )
        default = (True, prompt_tokens >= SHARED_PREFIX_MIN_PROMPT)
        for combination in COMBINATIONS:
            best, median = min(steps[combination]) * 1e3, statistics.median(steps[combination]) * 1e3
            ratio = median / (statistics.median(steps[default]) * 1e3)
            label = f"cpu_kernels={str(combination[0]).lower()}, shared_prefix={str(combination[1]).lower()}"
            if combination == default:
                label = f"**{label} (default)**"
            rows.append([f"{prompt_tokens:.0f}", label, best, median, ratio])
            records.append(
                {
                    "prompt_tokens": prompt_tokens,
                    "cpu_kernels": combination[0],
                    "shared_prefix": combination[1],
                    "step_ms": steps[combination],
                }
            )
    report(
        args.out,
        "decode_switches",
        f"hf rollout decode switches in one process: {args.model}, 16 rows (2 prompts x 8), 24 tokens forced",
        markdown_table(
            ["prompt tokens", "combination", "decode step ms (best)", "median ms", "median / default's"], rows
        ),
        records,
        [
            f"{args.rounds} timed rounds after one warm-up round, the combinations in turns on one engine",
            f"the default shares the prompt's cache from {SHARED_PREFIX_MIN_PROMPT} prompt tokens on",
            f"the platform's worker environment: {worker_env}",
        ],
    )


if __name__ == "__main__":
    main()
