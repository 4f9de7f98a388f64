"""LoRA against full fine-tuning in the FSDP2 engine: step time and memory side by side.

    python benchmarks/bench_lora.py [--out bench_out] [--steps 4] [--rank 16] [--threads N] [--models tiny smollm2]

Each mode runs in a fresh process (one gloo rank), set up as the PPO worker sets up an actor and its KL
reference: full fine-tuning builds a second engine for the reference (a second copy of the weights); LoRA
uses the actor's own base model with the adapter switched off. Each step is a reference forward pass and
an actor update (forward, backward, AdamW) over the same RL-shaped batch.

Memory columns: trainable parameters; bytes of parameters held by actor + reference (distinct storages);
optimizer state bytes; gradient bytes after backward; and the peak resident memory the process gained
from building the engines and running the steps (VmHWM minus VmRSS before the first engine; host memory,
which on CPU is the device memory). Times are the fastest step and the median (a shared machine: read
ratios, not seconds). No assertions on times.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_training_engine import build_tiny_model, loss_fn, rl_batch  # noqa: E402
from common import markdown_table, report  # noqa: E402

MODES = ("full", "lora")


@dataclass
class Row:
    model: str
    mode: str
    trainable_params_m: float
    actor_and_ref_param_mb: float
    optimizer_state_mb: float
    grad_mb: float
    peak_rss_gain_mb: float
    update_step_s: float
    median_update_step_s: float
    ref_forward_s: float


def _status_kb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return float(line.split()[1])
    return float("nan")


def _mb(tensors) -> float:
    seen: dict[int, int] = {}
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        seen[local.untyped_storage().data_ptr()] = local.untyped_storage().nbytes()
    return sum(seen.values()) / 2**20


def run_mode(mode: str, model_path: str, steps: int, rank: int, threads: int, batch_shape, queue) -> None:
    import torch.distributed as dist

    from verl.engines.fsdp import FSDPEngine, FSDPEngineConfig

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    vocab = int(__import__("json").load(open(os.path.join(model_path, "config.json")))["vocab_size"])
    batch = rl_batch(*batch_shape, vocab=vocab, n=4)
    lora = {"lora_rank": rank, "lora_alpha": 2 * rank} if mode == "lora" else {}

    def config(**extra):
        return FSDPEngineConfig(
            model_path=model_path, ppo_micro_batch_size_per_gpu=len(batch), optim={"lr": 1e-5}, **extra
        )

    rss_before = _status_kb("VmRSS")
    actor = FSDPEngine(config(lora=lora))
    actor.initialize()
    if mode == "lora":
        ref = actor.adapter_disabled_reference()
        ref_params = list(actor.module.parameters())
    else:
        ref = FSDPEngine(config())
        ref.initialize()
        ref_params = list(ref.module.parameters())
    update_times, ref_times, grad_mb = [], [], 0.0
    for _ in range(steps):
        start = time.perf_counter()
        with ref.eval_mode():
            ref.forward_only(batch)
        ref_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        with actor.train_mode():
            actor.optimizer_zero_grad()
            actor.forward_backward(batch, loss_fn)
            grad_mb = _mb(p.grad for p in actor.module.parameters() if p.grad is not None)
            actor.optimizer_step()
        update_times.append(time.perf_counter() - start)
    state = [v for s in actor.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    queue.put(
        {
            "mode": mode,
            "trainable_params_m": sum(p.numel() for p in actor.module.parameters() if p.requires_grad) / 1e6,
            "actor_and_ref_param_mb": _mb([*actor.module.parameters(), *ref_params]),
            "optimizer_state_mb": _mb(state),
            "grad_mb": grad_mb,
            "peak_rss_gain_mb": (_status_kb("VmHWM") - rss_before) / 1024,
            "update_step_s": min(update_times[1:] or update_times),
            "median_update_step_s": statistics.median(update_times[1:] or update_times),
            "ref_forward_s": min(ref_times[1:] or ref_times),
        }
    )
    dist.destroy_process_group()


def model_folders(names: list[str], tmp: str) -> dict[str, str]:
    folders = {}
    for name in names:
        if name == "tiny":
            folders["tiny-qwen2 (h256, 4 layers, vocab 8192)"] = build_tiny_model(os.path.join(tmp, "tiny"))
        elif name == "smollm2":
            from verl.engines.model_zoo import resolve_model_path

            folders["SmolLM2-135M"] = resolve_model_path("smollm2-135m-instruct")
        else:
            raise SystemExit(f"unknown model {name!r}: use tiny or smollm2")
    return folders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench_out")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--models", nargs="+", default=["tiny"])
    parser.add_argument("--batch", type=int, nargs=3, default=[16, 64, 64], metavar=("ROWS", "PROMPT", "RESPONSE"))
    args = parser.parse_args()

    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, path in model_folders(args.models, tmp).items():
            for mode in MODES:
                queue = context.Queue()
                proc = context.Process(
                    target=run_mode, args=(mode, path, args.steps, args.rank, args.threads, tuple(args.batch), queue)
                )
                proc.start()
                result = queue.get()
                proc.join()
                rows.append(Row(model=label, **result))
                print(rows[-1], flush=True)  # a long run shows each result as it comes
    headers = [
        "model",
        "mode",
        "trainable M",
        "actor+ref params MB",
        "optimizer MB",
        "grads MB",
        "peak RSS gain MB",
        "update s (min)",
        "update s (median)",
        "ref fwd s",
    ]
    table = markdown_table(headers, [list(vars(r).values()) for r in rows])
    report(
        args.out,
        "lora",
        f"LoRA (rank {args.rank}, all-linear) vs full fine-tuning, FSDP2, one rank",
        table,
        rows,
        notes=[
            f"batch: {args.batch[0]} rows (4 responses per prompt), prompt <= {args.batch[1]}, response <= "
            f"{args.batch[2]} tokens; {args.steps} steps, the first not counted",
            "full: the reference is a second engine (a copy of the weights); lora: the actor with its adapter off",
        ],
    )


if __name__ == "__main__":
    main()
