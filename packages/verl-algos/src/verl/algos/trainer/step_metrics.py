"""Per-step metrics that the algorithm library does not compute: throughput and MFU (timing: ``run.timing``)."""

from __future__ import annotations

import math

import torch

from verl.core.protocol import DataProto


def throughput_metrics(batch: DataProto, step_time: float, num_devices: int) -> dict[str, float]:
    """verl's ``perf/*``: tokens (prompt + response, unpadded) per second per device."""
    total_tokens = int(batch.batch["attention_mask"].sum())
    response_tokens = int(batch.batch["response_mask"].sum())
    return {
        "perf/total_num_tokens": float(total_tokens),
        "perf/response_tokens": float(response_tokens),
        "perf/time_per_step": step_time,
        "perf/throughput": total_tokens / max(step_time, 1e-9) / max(num_devices, 1),
    }


def transformer_flops_per_token(num_params: float, num_layers: int, hidden: int, seq_len: float) -> float:
    """Forward FLOPs per token: 2 x parameters (the matmuls) plus attention's 2 x 2 x layers x hidden x
    context (scores and weighted sum; causal halves the average context)."""
    return 2.0 * num_params + 4.0 * num_layers * hidden * seq_len / 2.0


def mfu_metrics(
    batch: DataProto, update_seconds: float, flops_info: dict[str, float] | None, peak_flops: float | None, devices: int
) -> dict[str, float]:
    """``perf/mfu/actor``: achieved training FLOP/s (3 x forward: forward + backward) over the peak."""
    if not flops_info or not peak_flops or update_seconds <= 0:
        return {}
    lengths = batch.batch["attention_mask"].sum(-1).float()
    tokens = float(lengths.sum())
    mean_len = float(lengths.mean()) if len(lengths) else 0.0
    per_token = transformer_flops_per_token(
        flops_info["num_params"], int(flops_info["num_layers"]), int(flops_info["hidden"]), mean_len
    )
    achieved = 3.0 * per_token * tokens / update_seconds
    mfu = achieved / (peak_flops * max(devices, 1))
    return {"perf/mfu/actor": mfu} if math.isfinite(mfu) else {}


def model_flops_info(model_path: str) -> dict[str, float] | None:
    """Parameter count, layers and hidden size from a Hugging Face config (no weights loaded)."""
    try:
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(model_path)
        hidden, layers = cfg.hidden_size, cfg.num_hidden_layers
        inter = getattr(cfg, "intermediate_size", 4 * hidden)
        heads = cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", heads) or heads
        head_dim = getattr(cfg, "head_dim", None) or hidden // heads
        attn = hidden * head_dim * (heads + 2 * kv_heads) + heads * head_dim * hidden
        mlp = 3 * hidden * inter
        params = layers * (attn + mlp) + cfg.vocab_size * hidden  # lm head; embeddings cost no FLOPs
        return {"num_params": float(params), "num_layers": float(layers), "hidden": float(hidden)}
    except Exception:
        return None


def entropy_metric(batch: DataProto) -> dict[str, float]:
    t = batch.batch
    if "entropys" not in t.keys():
        return {}
    mask = t["response_mask"].to(torch.float32)
    return {"actor/entropy": float((t["entropys"] * mask).sum() / mask.sum().clamp(min=1))}
