"""Step time of the megatron engine's parallel layouts against the FSDP2 engine: the same model, the same
batch, the same seed, the same number of processes.

    python benchmarks/bench_megatron_engine.py [--out bench_out] [--steps 5] [--size tiny|small] [--layouts ...]

Each layout runs in its own processes (spawned, joined as a torchrun-style group: gloo on the CPU, the
platform's backend on accelerators), ``--rounds`` times, the layouts in turns (the machine may be shared:
its load changes), and each run takes ``--warmup`` + ``--steps`` training steps, each a full
actor update: ``train_mode``, ``optimizer_zero_grad``, ``forward_backward`` of the token-mean policy loss
over micro-batches of 4 rows, ``optimizer_step`` (AdamW). A step's time is the slowest rank's; the table
gives the best and the median of the timed steps of all rounds, and their ratios to FSDP2's with the same
number of processes, measured in the same run.

Layouts (``--layouts``): ``fsdp1`` / ``tp1`` (FSDP2 and megatron TP1, one process) and ``fsdp2`` /
``tp2`` / ``pp2`` / ``dp2`` (two processes: FSDP2 sharding, megatron tensor parallel, megatron 1F1B
pipeline with its micro-batches, megatron data parallel). On accelerators only the layouts that fit the
visible devices run.

What differs between the engines by design, and shows in the numbers: FSDP2 packs the rows (it computes
only the real tokens), megatron computes each row at the batch's width (left-aligned, padding after the
real tokens: its local attention has no padding mask). The "computed tokens" column says so. The model
FLOPs (``bench_training_engine.training_flops``: matmuls of the real tokens, the output head at the
response tokens, causal attention) are the same for every layout, so the utilisation column compares the
useful work per second.

Utilisation: on the CPU the fraction of the node's measured fp32 matmul rate (``bench_training_engine.
MatmulPeak``, sampled between layouts, best sample: the processes of a layout share the node's cores);
on accelerators MFU, model FLOP/s over the platform's datasheet peak (``peak_flops`` for the engines'
compute dtype) times the processes' devices.

The first step's gradient norm is printed per layout: the same weights and batch give the same global
norm on every layout (fp32 on the CPU), a check that the layouts do the same work.

On the CPU megatron runs in the CPU platform's cuda -> cpu redirect, for testing layouts, not for speed:
read the ratios, not the seconds (the machine may be shared). No assertions on times.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_training_engine import MatmulPeak, rl_batch, training_flops  # noqa: E402
from common import base_parser, markdown_table, median, report  # noqa: E402

MICRO_BATCH = 4
GROUP = 8  # responses per prompt (GRPO-shaped rows, as bench_training_engine)


@dataclass(frozen=True)
class Layout:
    key: str
    label: str
    engine: str  # "fsdp" or "megatron"
    world: int
    tp: int = 1
    pp: int = 1


LAYOUTS = {
    layout.key: layout
    for layout in (
        Layout("fsdp1", "FSDP2", "fsdp", 1),
        Layout("tp1", "megatron TP1", "megatron", 1),
        Layout("fsdp2", "FSDP2", "fsdp", 2),
        Layout("tp2", "megatron TP2", "megatron", 2, tp=2),
        Layout("pp2", "megatron PP2 (1F1B)", "megatron", 2, pp=2),
        Layout("dp2", "megatron DP2", "megatron", 2),
    )
}

#: Qwen2 configs (head counts divisible by TP=2, layers by PP=2) and their batch: rows, prompt, response.
SIZES = {
    "tiny": (dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4), (16, 96, 96)),
    "small": (
        dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=12, num_attention_heads=16),
        (64, 512, 512),
    ),
}


@dataclass
class Row:
    layout: str
    processes: int
    dtype: str
    computed_tokens_per_step: int
    best_step_s: float
    median_step_s: float
    best_ratio_to_fsdp2: float
    median_ratio_to_fsdp2: float
    model_tflop_per_s: float
    utilisation: float
    first_grad_norm: float


def build_model(folder: str, size: str) -> str:
    from transformers import AutoModelForCausalLM, Qwen2Config

    shape, _ = SIZES[size]
    config = Qwen2Config(
        **shape, num_key_value_heads=2, vocab_size=8192, max_position_embeddings=2048, tie_word_embeddings=True
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def model_flops(folder: str, batch) -> float:
    """Training FLOPs of one step on ``batch``'s real tokens (the same for every layout)."""
    from safetensors import safe_open
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(folder)
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        sizes = {name: f.get_slice(name).get_shape() for name in f.keys()}
    body = sum(
        int(torch.Size(s).numel()) for name, s in sizes.items() if "embed_tokens" not in name and "lm_head" not in name
    )
    seqlens = batch.batch["attention_mask"].sum(-1).double()
    return training_flops(
        body,
        cfg.hidden_size,
        cfg.vocab_size,
        cfg.num_hidden_layers,
        tokens=float(seqlens.sum()),
        response_tokens=float(batch.batch["response_mask"].sum()),
        attention=float((seqlens**2).sum()),
    )


def loss_fn(outputs, micro):
    mask = micro.batch["response_mask"].float()
    loss = -(outputs["log_probs"] * micro.batch["advantages"] * mask).sum() / micro.meta_info["global_response_tokens"]
    return loss, {}


# -- one rank ------------------------------------------------------------------------------------------


def _make_engine(layout: Layout, model_dir: str):
    optim = {"lr": 1e-6, "lr_warmup_steps": 0}
    if layout.engine == "fsdp":
        from verl.engines.fsdp import FSDPEngine, FSDPEngineConfig

        engine = FSDPEngine(
            FSDPEngineConfig(
                model_path=model_dir, use_remove_padding=True, ppo_micro_batch_size_per_gpu=MICRO_BATCH, optim=optim
            )
        )
    else:
        from verl.engines.megatron.config import MegatronEngineConfig
        from verl.engines.megatron.engine import MegatronEngine

        megatron = {"tensor_model_parallel_size": layout.tp, "pipeline_model_parallel_size": layout.pp}
        engine = MegatronEngine(
            MegatronEngineConfig(
                model_path=model_dir, megatron=megatron, ppo_micro_batch_size_per_gpu=MICRO_BATCH, optim=optim
            )
        )
    engine.initialize()
    return engine


def _compute_dtype(engine, layout: Layout, platform) -> torch.dtype:
    if layout.engine == "fsdp":
        return engine.config.fsdp_config.resolved_param_dtype(platform.device_name, platform.is_bf16_supported())
    return engine._params_dtype()


def _computed_tokens(engine, layout: Layout, shard) -> int:
    """Token positions this rank's model computes per step: packed (FSDP2) or rows x width (megatron)."""
    mask = shard.batch["attention_mask"]
    return int(mask.sum()) if layout.engine == "fsdp" else int(mask.numel())


def _timed_steps(engine, shard, steps: int, platform) -> tuple[list[float], float]:
    import torch.distributed as dist

    times, first_norm = [], float("nan")
    for step in range(steps):
        platform.synchronize()
        dist.barrier()
        start = time.perf_counter()
        with engine.train_mode():
            engine.optimizer_zero_grad()
            engine.forward_backward(shard, loss_fn)
            norm = engine.optimizer_step()
        platform.synchronize()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=platform.device())
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the step ends when its slowest rank does
        times.append(float(elapsed))
        if step == 0:
            first_norm = float(norm)
    return times, first_norm


def rank_main(rank: int, layout: Layout, port: int, model_dir: str, batch, steps: int, result: str) -> None:
    import torch.distributed as dist

    from verl.core.platform import get_platform

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(layout.world),
    )
    platform = get_platform()
    torch.set_num_threads(platform.torch_threads_per_worker(layout.world))
    torch.manual_seed(0)
    try:
        engine = _make_engine(layout, model_dir)
        shard = batch.chunk(engine.dp_size)[engine.dp_rank]
        times, first_norm = _timed_steps(engine, shard, steps, platform)
        computed = torch.tensor([_computed_tokens(engine, layout, shard)], device=platform.device())
        if not engine.is_collect_rank:
            computed.zero_()  # each data-parallel replica once (its TP / PP ranks compute the same tokens)
        dist.all_reduce(computed)
        if rank == 0:
            dtype = str(_compute_dtype(engine, layout, platform)).removeprefix("torch.")
            torch.save({"times": times, "norm": first_norm, "computed": int(computed), "dtype": dtype}, result)
    except BaseException:
        with open(f"{result}.rank{rank}.err", "w") as f:
            f.write(traceback.format_exc())
        raise
    finally:
        if layout.engine == "megatron":
            from verl.engines.megatron.parallel import destroy_megatron_parallel

            destroy_megatron_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_layout(layout: Layout, model_dir: str, batch, steps: int, tmp: str) -> dict:
    import torch.multiprocessing as mp

    result = os.path.join(tmp, f"{layout.key}.pt")
    try:
        mp.spawn(
            rank_main, args=(layout, _free_port(), model_dir, batch, steps, result), nprocs=layout.world, join=True
        )
    except Exception as exc:
        errors = [Path(tmp, n).read_text() for n in sorted(os.listdir(tmp)) if n.startswith(f"{layout.key}.pt.rank")]
        raise RuntimeError(f"layout {layout.label} failed:\n" + "\n".join(errors)) from exc
    return torch.load(result)


# -- the table -----------------------------------------------------------------------------------------


def utilisation_peak(platform, dtype: str, processes: int, mm_peak: MatmulPeak) -> tuple[float, str]:
    """(peak FLOP/s of the devices a layout uses, what it is)."""
    if platform.device_name == "cpu":
        return mm_peak.best * 1e9, "of the node's measured fp32 matmul rate"
    peak = platform.peak_flops(getattr(torch, dtype))
    if peak is None:
        return float("nan"), "MFU (this device's peak is unknown to the platform)"
    return peak * processes, f"MFU ({platform.device_name} datasheet peak, {dtype})"


def make_rows(measured: dict[str, dict], flops: float, platform, mm_peak: MatmulPeak) -> tuple[list[Row], str]:
    rows, peak_note = [], ""
    for key, m in measured.items():
        layout = LAYOUTS[key]
        fsdp = measured.get("fsdp1" if layout.world == 1 else "fsdp2")
        peak, peak_note = utilisation_peak(platform, m["dtype"], layout.world, mm_peak)
        best, mid = min(m["times"]), median(m["times"])
        rows.append(
            Row(
                layout=layout.label,
                processes=layout.world,
                dtype=m["dtype"],
                computed_tokens_per_step=m["computed"],
                best_step_s=best,
                median_step_s=mid,
                best_ratio_to_fsdp2=best / min(fsdp["times"]) if fsdp else float("nan"),
                median_ratio_to_fsdp2=mid / median(fsdp["times"]) if fsdp else float("nan"),
                model_tflop_per_s=flops / mid / 1e12,
                utilisation=flops / mid / peak,
                first_grad_norm=m["norm"],
            )
        )
    return rows, peak_note


def table(rows: list[Row]) -> str:
    headers = [
        "layout",
        "processes",
        "dtype",
        "computed tokens/step",
        "best s/step",
        "median s/step",
        "best / FSDP2's",
        "median / FSDP2's",
        "model TFLOP/s",
        "utilisation",
        "grad norm, step 1",
    ]
    cells = [
        [
            r.layout,
            r.processes,
            r.dtype,
            r.computed_tokens_per_step,
            f"{r.best_step_s:.3f}",
            f"{r.median_step_s:.3f}",
            f"{r.best_ratio_to_fsdp2:.2f}",
            f"{r.median_ratio_to_fsdp2:.2f}",
            f"{r.model_tflop_per_s:.4f}",
            f"{100 * r.utilisation:.1f}%",
            f"{r.first_grad_norm:.6f}",
        ]
        for r in rows
    ]
    return markdown_table(headers, cells)


def main() -> None:
    from verl.core.platform import get_platform

    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="timed steps per layout (after the warm-up)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (optimizer state, allocator)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of every layout, in turns")
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--size", choices=list(SIZES), help="model size (default: tiny on CPU, small elsewhere)")
    args = parser.parse_args()
    platform = get_platform()
    size = args.size or ("tiny" if platform.device_name == "cpu" else "small")
    devices = platform.device_count() if platform.device_name != "cpu" else None
    skipped = [k for k in args.layouts if devices is not None and LAYOUTS[k].world > devices]
    layouts = [k for k in args.layouts if k not in skipped]

    mm_peak = MatmulPeak()
    mm_peak.sample(repeats=20)
    measured: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(os.path.join(tmp, "model"), size)
        rows_n, prompt, response = SIZES[size][1]
        batch = rl_batch(rows_n, prompt, response, vocab=8192, seed=0, n=GROUP)
        flops = model_flops(model_dir, batch)
        for round_ in range(args.rounds):  # layouts in turns: each sees the shared machine's load changes
            for key in layouts:
                print(
                    f"megatron bench: round {round_ + 1}, {LAYOUTS[key].label} ({LAYOUTS[key].world}) ...", flush=True
                )
                m = run_layout(LAYOUTS[key], model_dir, batch, args.warmup + args.steps, tmp)
                if key in measured:
                    measured[key]["times"] += m["times"][args.warmup :]
                else:
                    measured[key] = {**m, "times": m["times"][args.warmup :]}
                mm_peak.sample()
    rows, peak_note = make_rows(measured, flops, platform, mm_peak)
    shape = SIZES[size][0]
    notes = [
        f"model: Qwen2 {shape['num_hidden_layers']} layers x hidden {shape['hidden_size']}, "
        f"{shape['num_attention_heads']} heads / 2 KV heads, vocab 8192, tied embeddings ({size}); the same folder "
        "for every layout",
        f"batch: {rows_n} rows x ({prompt} prompt + {response} response), random lengths, {GROUP} responses per "
        f"prompt, {int(batch.batch['attention_mask'].sum())} real tokens; micro-batches of {MICRO_BATCH} rows; "
        f"seed 0; {args.rounds} rounds of the layouts in turns, each run {args.steps} timed steps after "
        f"{args.warmup} warm-up steps",
        f"model FLOPs per step: {flops / 1e9:.1f} GFLOP (real tokens only); utilisation: {peak_note}"
        + (
            f" (best of {len(mm_peak.samples)} samples: {mm_peak.best:.1f} GFLOP/s)"
            if platform.device_name == "cpu"
            else ""
        ),
        "best / median over FSDP2's: step time over FSDP2's with the same number of processes, same run (below 1: "
        "faster); on a shared machine the best is the closest to what the cores can do",
        "FSDP2 packs rows (computes real tokens only); megatron computes every row at the batch width",
        *([f"skipped (need more devices than the {devices} visible): {', '.join(skipped)}"] if skipped else []),
    ]
    records = {"rows": [asdict(r) for r in rows], "steps_s": measured, "mm_gflops_samples": mm_peak.samples}
    report(args.out, "bench_megatron_engine", "Megatron layouts vs FSDP2: step time", table(rows), records, notes)


if __name__ == "__main__":
    main()
