"""Rollout decode against its roofline: how close the hf engine's decode step comes to what the machine
can do for this model and batch, next to a plain transformers decode loop, in one invocation.

    python benchmarks/bench_rollout_roofline.py [--out bench_out] [--prompts 2] [--n 8] [--max-new-tokens 24]

The work is the main job's generation: SmolLM2-135M-Instruct, 2 a+b chat prompts x 8 samples, 24 new
tokens, the prompts left-padded to ``data.max_prompt_length`` (128) as the trainer hands them to the
rollout. Every contender decodes all 24 tokens (eos is switched off) so they do the same work.

The floor of one decode step (``rows`` = prompts x n sequences, each one token):

- bytes: every weight a step multiplies by (the decoder's linear layers and the lm head, once per step
  whatever the batch) plus the KV cache it attends over (rows x layers x 2 x kv heads x head dim x the
  mean context); activations are negligible;
- FLOPs: 2 x rows x those weights, plus the attention's 4 x rows x layers x heads x head dim x context;
- the machine: streaming-read bandwidth (the sum of a 1 GiB tensor) and the fp32 matmul rate (torch.mm of
  1024x1024, as the training-engine benchmark measures it), both on the platform's device;
- floor = max(bytes / bandwidth, FLOPs / matmul rate).

Also shown, measured in every round next to the contenders: the same step's products alone at this batch
(``F.linear`` on the plain weights; oneDNN on reordered weights, one product per layer and with the sibling
projections stacked as the engine runs them), i.e. what the BLAS library reaches before any model code
runs. Each is the mean of as many passes in a row as a generate has decode steps. The fastest of these is
the issue's "weight-streaming floor" (the weights streamed once through batch-16 products, measured); the
``x products`` column is the median over rounds of decode against it in the same round. ``x floor`` is the
best decode step against the roofline above, which no library reaches at 16 rows.

The process runs with the environment the platform gives its Ray workers (on CPU, glibc keeping freed
memory for reuse), re-executing itself to set it: the engine is timed as it runs inside ``verl train``.

Contenders, taking turns ``--repeats`` times (best and median reported; the machine is shared):
- ``transformers loop``: the model's forward with a DynamicCache, 16 rows, the prompt unpadded (its best
  case), the mask grown by concatenation: the loop our engine used to be;
- ``hf dynamic``: our engine with ``cache_implementation=dynamic, packed_linear=false`` (the engine before
  this change: every sample prefilled with the padded prompt, cache grown by concatenation);
- ``hf static, F.linear``: padding trimmed, each prompt prefilled once, static cache, finished rows
  dropped (none here, every row runs to the end), the linear layers through MKL's ``F.linear``
  (``packed_linear=false``);
- ``hf static, oneDNN``: the default on CPU, linear layers through oneDNN on weights reordered once per
  generate (``packed_linear``), norms, rotary embedding and decode attention through verl's fused CPU
  kernels (``cpu_kernels``) and each decoder layer's decode step as direct calls (``fused_layer``); next
  to it the same with transformers' own decoder layers around the kernels, and without the kernels
  (``cpu_kernels=false``);
- ``hf static compiled`` with ``--compile`` (the default on CUDA, with CUDA graphs).

On a GPU (the CUDA platform is picked up by ``get_platform()``) the same code measures the same
quantities with the rollout's default dtype (bf16 where supported).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_rollout import arithmetic_prompts  # noqa: E402
from common import base_parser, markdown_table, report  # noqa: E402


@dataclass
class Machine:
    bandwidth_gbs: float
    matmul_gflops: float


@dataclass
class StepWork:
    rows: int
    weight_bytes: int
    kv_bytes: int
    flops: float

    def floor_s(self, machine: Machine) -> float:
        memory = (self.weight_bytes + self.kv_bytes) / (machine.bandwidth_gbs * 1e9)
        compute = self.flops / (machine.matmul_gflops * 1e9)
        return max(memory, compute)


@dataclass
class Row:
    contender: str
    first_s: float
    best_s: float
    median_s: float
    prefill_s: float
    step_ms: float
    step_median_ms: float
    x_floor: float
    x_products: float


def measure_machine(device: torch.device, dtype: torch.dtype, sync, seconds: float = 1.0) -> Machine:
    """Best-of-several streaming-read bandwidth and square-matmul rate on ``device``."""

    def best_rate(fn, work: float) -> float:
        fn()
        sync()
        best, deadline = 0.0, time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            fn()
            sync()
            best = max(best, work / (time.perf_counter() - start))
        return best

    big = torch.ones(256 << 20, dtype=torch.float32, device=device)  # 1 GiB, far beyond any cache
    bandwidth = best_rate(big.sum, big.numel() * big.element_size())
    big = None  # free it before the matmuls
    a = torch.randn(1024, 1024, dtype=dtype, device=device)
    b = torch.randn(1024, 1024, dtype=dtype, device=device)
    matmul = best_rate(lambda: a @ b, 2 * 1024**3)
    return Machine(bandwidth / 1e9, matmul / 1e9)


def step_work(model, rows: int, context: float) -> StepWork:
    """What one decode step (one token for each of ``rows`` sequences at mean ``context``) must do."""
    cfg = model.config
    linears = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    weight_elems = sum(w.numel() for w in linears)
    size = linears[0].element_size()
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    layers, kv_heads = cfg.num_hidden_layers, cfg.num_key_value_heads
    kv_bytes = int(rows * layers * 2 * kv_heads * head_dim * context * size)
    attention_flops = 4 * rows * layers * cfg.num_attention_heads * head_dim * context
    return StepWork(rows, weight_elems * size, kv_bytes, 2.0 * rows * weight_elems + attention_flops)


class StepProducts:
    """One step's linear layers alone at ``rows`` rows: default ``F.linear``, and where the engine uses it
    (CPU, fp32) oneDNN on reordered weights, one product per layer and with the sibling projections of
    ``FUSED_PROJECTIONS`` stacked into one. Each call times every variant over ``steps`` passes in a row,
    as many as a generate's decode steps, and gives the mean pass: the same kind of number as a decode
    step's (a best of many short samples would pick the machine's luckiest moments)."""

    def __init__(self, model, rows: int, sync, steps: int):
        from verl.engines.rollout.hf.packed_linear import (
            fused_projection_groups,
            packed_linear_unsupported_reason,
            reorder_weight,
        )

        self.sync, self.steps = sync, steps
        layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        weights = [layer.weight.detach() for layer in layers]
        self.inputs = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=w.dtype, device=w.device) for w in weights}
        self.variants = {"F.linear": [(w.shape[1], w) for w in weights]}
        cpu_fp32 = weights[0].device.type == "cpu" and weights[0].dtype == torch.float32
        if cpu_fp32 and packed_linear_unsupported_reason() is None:
            self.variants["oneDNN, reordered"] = [(k, reorder_weight(w, rows)) for k, w in self.variants["F.linear"]]
            groups = fused_projection_groups(model)
            stacked = [torch.cat([layer.weight.detach() for layer in group]) for group in groups]
            grouped = {layer for group in groups for layer in group}
            stacked += [layer.weight.detach() for layer in layers if layer not in grouped]
            self.variants["oneDNN, siblings stacked"] = [(w.shape[1], reorder_weight(w, rows)) for w in stacked]

    def _run(self, name: str) -> None:
        from verl.engines.rollout.hf.packed_linear import onednn_linear

        if name == "F.linear":
            for k, w in self.variants[name]:
                torch.nn.functional.linear(self.inputs[k], w)
        else:
            for k, w in self.variants[name]:
                onednn_linear(self.inputs[k], w)

    def __call__(self) -> dict[str, float]:
        out = {}
        for name in self.variants:
            self._run(name)
            self.sync()
            start = time.perf_counter()
            for _ in range(self.steps):
                self._run(name)
            self.sync()
            out[name] = (time.perf_counter() - start) / self.steps
        return out


@contextlib.contextmanager
def own_decoder_layers():
    """Within the block, a generate keeps transformers' decoder layers around the fused kernels (no
    ``fused_layer`` step): the contender that shows what the fused layer step alone gains."""
    from unittest import mock

    from verl.engines.rollout.hf import cpu_kernels

    def none_fused(*args, **kwargs):
        return contextlib.nullcontext(0)

    with mock.patch.object(cpu_kernels.fused_layer, "fused_decoder_layers", none_fused):
        yield


@contextlib.contextmanager
def python_layer_steps():
    """Within the block, the fused layer step makes its calls from Python (no C++ ``LayerStep``): the
    contender that shows what the native step gains."""
    from unittest import mock

    from verl.engines.rollout.hf import fused_layer

    with mock.patch.object(fused_layer, "native_step", lambda w, ops: None):
        yield


#: Contenders that are the default engine with a part of it set aside for their generates.
SET_ASIDE = {
    "hf static, oneDNN, transformers' layers": own_decoder_layers,
    "hf static, oneDNN, fused step from Python": python_layer_steps,
}


#: What :func:`with_worker_env` set, for the report (the platform leaves out what the environment has).
WORKER_ENV_NOTE = "VERL_BENCH_WORKER_ENV"


def with_worker_env(platform) -> str:
    """Re-execute this process with the environment the platform gives its Ray workers, if it lacks it
    (glibc reads its allocator settings once, at start). Returns what was set, for the report."""
    missing = platform.worker_process_env()
    if missing:
        note = " ".join(f"{k}={v}" for k, v in missing.items())
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **missing, WORKER_ENV_NOTE: note})
    return os.environ.get(WORKER_ENV_NOTE, "nothing to add")


def with_context(prompts, tokens: int, seed: int = 0):
    """The prompts with ``tokens`` random token ids (100..19999) right before each one's first token (after
    its left padding), as long prompts."""
    if tokens <= 0:
        return prompts
    from verl.core.protocol import DataProto

    b = prompts.batch
    context = torch.randint(100, 20_000, (len(b["input_ids"]), tokens), generator=torch.Generator().manual_seed(seed))
    ids, mask = [], []
    for row_ids, row_mask, row_context in zip(b["input_ids"], b["attention_mask"], context, strict=True):
        padding = int((row_mask == 0).sum())
        ids.append(torch.cat([row_ids[:padding], row_context, row_ids[padding:]]))
        mask.append(torch.cat([row_mask[:padding], torch.ones_like(row_context), row_mask[padding:]]))
    mask_t = torch.stack(mask)
    return DataProto.from_dict(
        {"input_ids": torch.stack(ids), "attention_mask": mask_t, "position_ids": (mask_t.cumsum(1) - 1).clamp(min=0)}
    )


def padded_to(prompts, width: int, pad_id: int):
    from verl.core.protocol import DataProto

    b = prompts.batch
    extra = width - b["input_ids"].shape[1]
    if extra <= 0:
        return prompts

    def pad(t, value):
        return torch.cat([torch.full((t.shape[0], extra), value, dtype=t.dtype), t], dim=1)

    return DataProto.from_dict(
        {
            "input_ids": pad(b["input_ids"], pad_id),
            "attention_mask": pad(b["attention_mask"], 0),
            "position_ids": pad(b["position_ids"], 0),
        }
    )


class TransformersLoop:
    """The plain decode loop (forward + DynamicCache + concatenated mask), every token forced."""

    def __init__(self, model, prompts, n: int, tokens: int, device):
        self.model, self.tokens, self.device = model, tokens, device
        b = prompts.batch
        self.ids = b["input_ids"].repeat_interleave(n, 0).to(device)
        self.mask = b["attention_mask"].repeat_interleave(n, 0).to(device)
        self.pos = b["position_ids"].repeat_interleave(n, 0).to(device)

    def __call__(self, sync) -> tuple[float, float]:
        """(prefill seconds, mean decode step seconds)."""
        from verl.engines.rollout.hf.transformers_compat import cache_kwarg, output_cache

        name = cache_kwarg(self.model)
        with torch.no_grad():
            start = time.perf_counter()
            out = self.model(input_ids=self.ids, attention_mask=self.mask, position_ids=self.pos, logits_to_keep=1)
            cache, mask, pos = output_cache(out), self.mask, self.pos[:, -1:]
            token = torch.multinomial(torch.softmax(out.logits[:, -1].float(), -1), 1)
            sync()
            prefill = time.perf_counter() - start
            for _ in range(self.tokens - 1):
                mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
                pos = pos + 1
                out = self.model(
                    input_ids=token, attention_mask=mask, position_ids=pos, logits_to_keep=1, **{name: cache}
                )
                cache = output_cache(out)
                token = torch.multinomial(torch.softmax(out.logits[:, -1].float(), -1), 1)
            sync()
        return prefill, (time.perf_counter() - start - prefill) / (self.tokens - 1)


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--prompt-width", type=int, default=128, help="left-pad prompts to this (the trainer's)")
    parser.add_argument(
        "--context", type=int, default=0, help="random tokens put before every prompt (a long prompt's case)"
    )
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--compile", action="store_true", help="also the compiled static step")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores on CPU)")
    args = parser.parse_args()

    from verl.core.engine import SamplingParams
    from verl.core.platform import get_platform
    from verl.engines.model_zoo import resolve_model_path
    from verl.engines.rollout.hf import HFRolloutConfig, HFRolloutEngine
    from verl.engines.rollout.hf.static_decode import SHARED_PREFIX_MIN_PROMPT

    platform = get_platform()
    worker_env = with_worker_env(platform)
    if platform.device_name == "cpu":
        torch.set_num_threads(args.threads or platform.torch_threads_per_worker(1))
    sync = platform.synchronize
    model_path = resolve_model_path(args.model)
    raw_prompts = with_context(arithmetic_prompts(model_path, args.prompts), args.context)
    rows = args.prompts * args.n

    contenders: dict[str, HFRolloutEngine] = {}

    def build(label: str, **kw) -> HFRolloutEngine:
        engine = HFRolloutEngine(HFRolloutConfig(model_path=model_path, load_format="dummy", **kw))
        engine.update_weights(first.model.named_parameters())  # one set of weights, shared by all
        contenders[label] = engine
        return engine

    vocab = None
    first = HFRolloutEngine(HFRolloutConfig(model_path=model_path, cache_implementation="dynamic", packed_linear=False))
    vocab = first.model.config.vocab_size
    first.eos_token_ids = [vocab]  # never sampled: every row decodes all tokens
    contenders["hf dynamic (before)"] = first
    if first.device.type == "cpu" and first.dtype == torch.float32:
        build("hf static, F.linear", packed_linear=False)
        build("hf static, oneDNN (default)")
        build("hf static, oneDNN, fused step from Python", cpu_kernels=True)
        build("hf static, oneDNN, transformers' layers", cpu_kernels=True)
        build("hf static, oneDNN, without CPU kernels", cpu_kernels=False)
        # The default shares each prompt's cache among its samples from SHARED_PREFIX_MIN_PROMPT tokens on;
        # the other way, side by side.
        if int(raw_prompts.batch["attention_mask"].sum(-1).max()) >= SHARED_PREFIX_MIN_PROMPT:
            build("hf static, oneDNN, prompt cache repeated", shared_prefix=False)
        else:
            build("hf static, oneDNN, prompt cache shared", shared_prefix=True)
    else:
        build("hf static (default)")
    if args.compile:
        build("hf static compiled", compile_decode=True)
    for engine in contenders.values():
        engine.eos_token_ids = [vocab]
    prompts = padded_to(raw_prompts, args.prompt_width, first.pad_token_id)
    loop = TransformersLoop(first.model, raw_prompts, args.n, args.max_new_tokens, first.device)
    sampling = SamplingParams(n=args.n, max_new_tokens=args.max_new_tokens, logprobs=True, seed=1)

    machine = measure_machine(first.device, first.dtype, sync)
    prompt_len = float(raw_prompts.batch["attention_mask"].sum(-1).float().mean())
    work = step_work(first.model, rows, prompt_len + args.max_new_tokens / 2)
    floor = work.floor_s(machine)
    step_products = StepProducts(first.model, rows, sync, steps=args.max_new_tokens - 1)
    products: list[dict[str, float]] = []

    times: dict[str, list[tuple[float, float, float]]] = {"transformers loop": []}
    times.update({label: [] for label in contenders})
    first_call: dict[str, float] = {}
    for _ in range(args.repeats + 1):  # the first round is the warm-up, reported on its own
        products.append(step_products())
        start = time.perf_counter()
        prefill, step = loop(sync)
        times["transformers loop"].append((time.perf_counter() - start, prefill, step))
        for label, engine in contenders.items():
            start = time.perf_counter()
            with SET_ASIDE.get(label, contextlib.nullcontext)():
                out = engine.generate(prompts, sampling)
            sync()
            total = time.perf_counter() - start
            m = out.meta_info["metrics"]
            steps = max(1.0, m["rollout/decode_steps"])
            times[label].append((total, m["timing_s/rollout_prefill"], m["timing_s/rollout_decode"] / steps))
    warm_products = products[1:]
    kernels = {name: min(round_[name] for round_ in warm_products) for name in warm_products[0]}
    # The floor: the weights streamed through batch-`rows` products, the fastest way, per round.
    weight_stream = [min(round_.values()) for round_ in warm_products]
    table_rows = []
    for label, samples in times.items():
        first_call[label] = samples[0][0]
        warm = samples[1:]
        best_total = min(s[0] for s in warm)
        best_step = min(s[2] for s in warm)
        table_rows.append(
            Row(
                label,
                first_call[label],
                best_total,
                statistics.median(s[0] for s in warm),
                min(s[1] for s in warm),
                best_step * 1e3,
                statistics.median(s[2] for s in warm) * 1e3,
                best_step / floor,
                statistics.median(s[2] / stream for s, stream in zip(warm, weight_stream, strict=True)),
            )
        )

    floor_rows = [
        ["weights read per step (MB)", work.weight_bytes / 1e6],
        ["KV cache read per step (MB, mean context)", work.kv_bytes / 1e6],
        ["FLOPs per step (G)", work.flops / 1e9],
        ["streaming-read bandwidth (GB/s, measured)", machine.bandwidth_gbs],
        ["matmul rate (GFLOP/s, torch.mm 1024^2, measured)", machine.matmul_gflops],
        ["memory floor (ms)", (work.weight_bytes + work.kv_bytes) / machine.bandwidth_gbs / 1e6],
        ["compute floor (ms)", work.flops / machine.matmul_gflops / 1e6],
        ["**floor per decode step (ms)**", floor * 1e3],
        *[[f"the step's products alone, {name} (ms, best round)", t * 1e3] for name, t in kernels.items()],
        [f"floor for {args.max_new_tokens - 1} decode steps (s)", floor * (args.max_new_tokens - 1)],
    ]
    where = f"{platform.name}, {first.device}, {str(first.dtype).removeprefix('torch.')}"
    report(
        args.out,
        "rollout_roofline",
        f"Roofline of one decode step: {args.model}, {rows} rows ({args.prompts} prompts x {args.n}), {where}",
        markdown_table(["quantity", "value"], floor_rows),
        {"machine": vars(machine), "work": vars(work), "floor_s": floor, "matmuls_only_s": kernels},
        [
            f"mean prompt {prompt_len:.0f} tokens (left-padded to {args.prompt_width} for the engines), "
            f"{args.max_new_tokens} new tokens, every token forced",
            f"the platform's worker environment: {worker_env}",
        ],
    )
    records = [vars(r) for r in table_rows]
    report(
        args.out,
        "rollout_decode_vs_floor",
        "Decode against the floor (one invocation, contenders in turns)",
        markdown_table(
            [
                "contender",
                "first call s (warm-up)",
                "generate s (best)",
                "median s",
                "prefill s (best)",
                "decode step ms (best)",
                "median ms",
                "x floor",
                "x products",
            ],
            [
                [
                    r.contender,
                    r.first_s,
                    r.best_s,
                    r.median_s,
                    r.prefill_s,
                    r.step_ms,
                    r.step_median_ms,
                    r.x_floor,
                    r.x_products,
                ]
                for r in table_rows
            ],
        ),
        records,
        [
            f"x floor: the best decode step against the floor per decode step ({floor * 1e3:.1f} ms, table above)",
            "x products: the median over rounds of the round's decode step against the step's products alone, "
            f"fastest variant, in that round ({min(weight_stream) * 1e3:.1f}-{max(weight_stream) * 1e3:.1f} ms: "
            "the weight-streaming floor of the issue); target: decode within 1.5x of it",
            "transformers loop: its prompts are not padded (its best case); the engines get them padded to "
            f"{args.prompt_width} as in verl train",
            f"{args.repeats} timed rounds after one warm-up round",
        ],
    )


if __name__ == "__main__":
    main()
