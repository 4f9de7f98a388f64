"""Training throughput of the FSDP2 engine on this machine's CPU, packed vs padded, beside the CPU's
measured fp32 matmul rate (so the table shows the fraction of peak the engine reaches).

    python benchmarks/bench_training_engine.py [--out bench_out] [--threads N] [--steps 3] [--models tiny smollm2]

One process, one data-parallel rank. Each step is a full actor update: forward, chunked log-probs,
backward and AdamW over a batch of RL-shaped sequences (left-padded prompts and right-padded
responses of random lengths). Throughput counts real (non-pad) tokens; the padded mode spends compute
on the pad tokens too, which is what packing saves.

Model FLOPs per step (training = 3x forward):
    6 * N_body * tokens                (every matmul of the blocks; N_body = parameters outside the embeddings)
  + 6 * hidden * vocab * resp_tokens   (the output head, evaluated only where a response token is predicted)
  + 6 * layers * hidden * sum(s_i^2)   (causal attention: QK^T and AV over a sequence of s_i tokens)
The peak is torch.mm of two fp32 1024x1024 matrices with the same thread count, sampled before every
step of the same run; the best sample is used (the machine may be shared with other jobs).
Prints a markdown table and writes it (and a JSON record) under --out. No assertions on times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from dataclasses import asdict, dataclass

import torch

#: Packed without padding, padded, and packed with each prompt computed once for its GROUP responses.
SHARED = "packed, shared prompts"
MODES = ("packed", "padded", SHARED)
GROUP = 8


@dataclass
class Row:
    model: str
    params_m: float
    mode: str
    real_tokens_per_step: int
    computed_tokens_per_step: int
    step_s: float
    median_step_s: float
    tokens_per_s: float
    model_gflop_per_s: float
    fraction_of_mm_peak: float


class MatmulPeak:
    """The fp32 torch.mm rate (GFLOP/s, 1024x1024, the benchmark's thread count), sampled between
    training steps; on a shared machine the best sample is the closest to what the cores can do."""

    def __init__(self, size: int = 1024):
        self.a, self.b = torch.randn(size, size), torch.randn(size, size)
        self.flops = 2 * size**3
        self.samples: list[float] = []

    def sample(self, repeats: int = 5) -> float:
        torch.mm(self.a, self.b)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(self.a, self.b)
            best = min(best, time.perf_counter() - start)
        self.samples.append(self.flops / best / 1e9)
        return self.samples[-1]

    @property
    def best(self) -> float:
        return max(self.samples)


def build_tiny_model(folder: str) -> str:
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=8192,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def rl_batch(batch: int, prompt_len: int, response_len: int, vocab: int, seed: int = 0, n: int = 1):
    """Random RL-shaped rows; ``n`` > 1: ``batch / n`` prompts with ``n`` responses each (GRPO)."""
    from verl.core.protocol import DataProto

    g = torch.Generator().manual_seed(seed)
    p_lens = torch.randint(prompt_len // 4, prompt_len + 1, (batch // n,), generator=g).repeat_interleave(n)
    r_lens = torch.randint(1, response_len + 1, (batch,), generator=g)
    p_mask = (torch.arange(prompt_len)[None] >= (prompt_len - p_lens)[:, None]).long()
    r_mask = (torch.arange(response_len)[None] < r_lens[:, None]).long()
    prompts = torch.randint(0, vocab, (batch // n, prompt_len), generator=g).repeat_interleave(n, 0) * p_mask
    responses = torch.randint(0, vocab, (batch, response_len), generator=g) * r_mask
    mask = torch.cat([p_mask, r_mask], 1)
    return DataProto.from_dict(
        {
            "input_ids": torch.cat([prompts, responses], 1),
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": responses,
            "response_mask": r_mask,
            "advantages": torch.randn(batch, response_len, generator=g),
        }
    )


def loss_fn(outputs, micro):
    mask = micro.batch["response_mask"].float()
    loss = -(outputs["log_probs"] * micro.batch["advantages"] * mask).sum() / micro.meta_info["global_response_tokens"]
    return loss, {}


def model_flops(engine, batch, shared: bool = False) -> float:
    """FLOPs the engine computes for ``batch``; ``shared``: each distinct prompt once (its responses
    attend to it: their attention spans prompt + response)."""
    cfg = engine.hf_config
    hidden, vocab, layers = cfg.hidden_size, cfg.vocab_size, cfg.num_hidden_layers
    embeddings = {id(engine.module.get_input_embeddings().weight), id(engine.module.get_output_embeddings().weight)}
    body = sum(p.numel() for p in engine.module.parameters() if id(p) not in embeddings)
    seqlens = batch.batch["attention_mask"].sum(-1).double()
    response_lens = batch.batch["response_mask"].sum(-1).double()
    tokens = float(seqlens.sum())
    attention = float((seqlens**2).sum())
    if shared:
        prompts = {tuple(row.tolist()) for row in batch.batch["input_ids"][:, : -batch.batch["responses"].shape[1]]}
        prompt_tokens = float((seqlens - response_lens).mean()) * len(prompts)  # equal-length groups
        tokens = prompt_tokens + float(response_lens.sum())
        attention = float(((seqlens - response_lens) ** 2).mean()) * len(prompts) + float(
            (seqlens**2 - (seqlens - response_lens) ** 2).sum()
        )
    response_tokens = float(batch.batch["response_mask"].sum())
    return training_flops(body, hidden, vocab, layers, tokens, response_tokens, attention)


def training_flops(
    body: int, hidden: int, vocab: int, layers: int, tokens: float, response_tokens: float, attention: float
) -> float:
    """The module docstring's formula: ``attention`` is the sum of the squared sequence lengths."""
    return 6 * body * tokens + 6 * hidden * vocab * response_tokens + 6 * layers * hidden * attention


def bench_model(name: str, path: str, batch_cfg: tuple[int, int, int], steps: int, peak: MatmulPeak) -> list[Row]:
    """Packed and padded engines side by side, their steps interleaved so both see the same machine
    load; the fastest step of each is reported (on a shared machine the minimum is the closest to
    what the hardware can do, and the median is printed beside it)."""
    from verl.engines.fsdp import FSDPEngine, FSDPEngineConfig

    b, p, r = batch_cfg
    engines = {}
    for mode in MODES:
        engines[mode] = FSDPEngine(
            FSDPEngineConfig(
                model_path=path,
                use_remove_padding=mode != "padded",
                share_prompts=mode == SHARED,
                ppo_micro_batch_size_per_gpu=b,
                optim={"lr": 1e-6},
            )
        )
        engines[mode].initialize()
    any_engine = engines["packed"]
    # GRPO-shaped: n responses per prompt (the shared mode computes each prompt once)
    batch = rl_batch(b, p, r, any_engine.hf_config.vocab_size, n=GROUP)
    flops = {mode: model_flops(any_engine, batch, shared=mode == SHARED) for mode in MODES}
    params = sum(t.numel() for t in any_engine.module.parameters()) / 1e6
    times: dict[str, list[float]] = {mode: [] for mode in engines}
    warmup = 2  # optimizer state creation and the allocator's first large blocks
    for step in range(warmup + steps):
        for mode, engine in engines.items():
            peak.sample()
            start = time.perf_counter()
            with engine.train_mode():
                engine.optimizer_zero_grad()
                engine.forward_backward(batch, loss_fn)
                engine.optimizer_step()
            if step >= warmup:
                times[mode].append(time.perf_counter() - start)
    rows = []
    real = int(batch.batch["attention_mask"].sum())
    for mode, samples in times.items():
        best, median = min(samples), sorted(samples)[len(samples) // 2]
        rows.append(
            Row(
                model=name,
                params_m=round(params, 1),
                mode=mode,
                real_tokens_per_step=real,
                computed_tokens_per_step=computed_tokens(batch, mode),
                step_s=best,
                median_step_s=median,
                tokens_per_s=real / best,
                model_gflop_per_s=flops[mode] / best / 1e9,
                fraction_of_mm_peak=0.0,  # set once the run's best matmul rate is known
            )
        )
    engines.clear()
    return rows


def computed_tokens(batch, mode: str) -> int:
    mask = batch.batch["attention_mask"]
    if mode == "padded":
        return int(mask.numel())
    if mode == "packed":
        return int(mask.sum())
    response = batch.batch["response_mask"].sum(-1)
    prompt = mask.sum(-1) - response
    return int(prompt.sum() // GROUP + response.sum())


def plot(rows: list[Row], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r.model for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [r for r in rows if r.model == model]
        ax.bar([r.mode for r in mine], [100 * r.fraction_of_mm_peak for r in mine], color="#2a7")
        ax.axhline(60, color="#c33", linestyle=":", label="target 60%")
        ax.set_ylabel("% of measured fp32 matmul rate")
        ax.set_title(model, fontsize=9)
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "bench_training_engine.png"), dpi=110)


def markdown(rows: list[Row], header: list[str]) -> str:
    lines = [*header, ""]
    lines.append(
        "| model | params (M) | mode | real tokens/step | computed tokens/step | best step (s) | median step (s) "
        "| tokens/s | model GFLOP/s | of mm peak |"
    )
    lines.append("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        lines.append(
            f"| {r.model} | {r.params_m} | {r.mode} | {r.real_tokens_per_step} | {r.computed_tokens_per_step} | "
            f"{r.step_s:.2f} | {r.median_step_s:.2f} | {r.tokens_per_s:.0f} | {r.model_gflop_per_s:.1f} | {100 * r.fraction_of_mm_peak:.0f}% |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench_out")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"], choices=["tiny", "smollm2"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)

    peak = MatmulPeak()
    peak.sample(repeats=20)
    rows: list[Row] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        if "tiny" in args.models:
            rows += bench_model(
                "tiny qwen2 (4x256, vocab 8192)", build_tiny_model(tmp), (16, 96, 96), 3 * args.steps, peak
            )
        if "smollm2" in args.models:
            try:
                from verl.engines.model_zoo import resolve_model_path

                path = resolve_model_path("smollm2-135m-instruct")
            except (ImportError, FileNotFoundError) as exc:
                notes.append(f"SmolLM2-135M skipped: {exc}")
                print(notes[-1])
            else:
                rows += bench_model("SmolLM2-135M-Instruct", path, (16, 64, 64), args.steps, peak)

    header = [
        "## FSDP2 engine training throughput (1 rank, fp32, CPU)",
        "",
        f"- machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical cores, "
        f"{args.threads} torch threads, torch {torch.__version__}",
        f"- fp32 torch.mm (1024x1024), sampled before every step: best {peak.best:.1f} GFLOP/s, median "
        f"{sorted(peak.samples)[len(peak.samples) // 2]:.1f}; the last column divides by the best",
        f"- {args.steps} timed steps per mode (tiny model: {3 * args.steps}) after two warm-up steps, packed and padded interleaved; tokens/s and GFLOP/s "
        "from the best step (the machine may be shared: compare the median column for load effects)",
        "- batch: 16 x (96 prompt + 96 response) for the tiny model, 16 x (64 + 64) for SmolLM2, lengths random "
        f"(prompts 1/4..1 of the width, responses 1..width), {GROUP} responses per prompt; one micro-batch per step",
        "- tokens/s counts the real (unpadded, unshared) tokens of the batch; GFLOP/s and % of peak count what each "
        "mode computes (padded: pad tokens too; shared prompts: each prompt once)",
        *[f"- {n}" for n in notes],
    ]
    for row in rows:  # divide by the best matmul rate seen in the run
        row.fraction_of_mm_peak = row.model_gflop_per_s / peak.best
    table = markdown(rows, header)
    print(table)
    plot(rows, args.out)
    with open(os.path.join(args.out, "bench_training_engine.md"), "w") as f:
        f.write(table)
    with open(os.path.join(args.out, "bench_training_engine.json"), "w") as f:
        json.dump(
            {"mm_gflops_samples": peak.samples, "threads": args.threads, "rows": [asdict(r) for r in rows]}, f, indent=2
        )


if __name__ == "__main__":
    main()
