"""Adam's state per *model* parameter, whichever way megatron's optimizer holds it.

- fp32, plain optimizer: the torch optimizer's parameters are the model parameters.
- bf16/fp16 (``Float16OptimizerWithFloat16Params``): fp32 main copies, one per model parameter.
- distributed optimizer: each data-parallel rank holds one contiguous slice of each flattened parameter's
  fp32 main copy and Adam moments (a "shard", possibly empty); the full tensor is the slices summed over
  the data-parallel group (each rank writes its slice into zeros, then an all-reduce).

:class:`AdamState` reads and writes the full fp32 master weight (``"model"``) and moments (``"exp_avg"``,
``"exp_avg_sq"``) of a model parameter, which is what the checkpoint stores.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

MOMENTS = ("exp_avg", "exp_avg_sq")


class AdamState:
    def __init__(self, optimizer: Any) -> None:
        self.inner: list[torch.optim.Optimizer] = []
        #: model parameter -> the fp32 tensor the torch optimizer updates (whole parameter)
        self.main_of: dict[torch.nn.Parameter, torch.Tensor] = {}
        #: model parameter -> (this rank's fp32 shard, start, end in the flattened parameter); distributed
        self.shard_of: dict[torch.nn.Parameter, tuple[torch.Tensor, int, int]] = {}
        self.owner: dict[torch.Tensor, torch.optim.Optimizer] = {}  # optimizer tensor -> its torch optimizer
        self.dp_group = None
        for sub in getattr(optimizer, "chained_optimizers", [optimizer]):
            inner = getattr(sub, "optimizer", None)
            if inner is None:
                continue
            self.inner.append(inner)
            self.owner.update({p: inner for group in inner.param_groups for p in group["params"]})
            if hasattr(sub, "shard_fp32_groups"):  # megatron's DistributedOptimizer
                self.dp_group = sub.data_parallel_group
                pairs = zip(
                    sub.model_float16_groups + sub.model_fp32_groups,
                    sub.shard_fp32_from_float16_groups + sub.shard_fp32_groups,
                    strict=True,
                )
                for models, shards in pairs:
                    for model_param, shard in zip(models, shards, strict=True):
                        piece = sub._get_model_param_range_map(model_param)["param"]
                        self.shard_of[model_param] = (shard, piece.start, piece.end)
            else:
                for models, mains in zip(
                    getattr(sub, "float16_groups", []), getattr(sub, "fp32_from_float16_groups", []), strict=True
                ):
                    self.main_of.update(zip(models, mains, strict=True))

    @property
    def sharded(self) -> bool:
        return self.dp_group is not None

    def step(self) -> int:
        """Adam steps taken so far on this rank (0 before the first: the state is created lazily)."""
        steps = [int(s["step"]) for inner in self.inner for s in inner.state.values() if "step" in s]
        steps += [int(g["step"]) for inner in self.inner for g in inner.param_groups if "step" in g]
        return max(steps, default=0)

    def full(self, param: torch.nn.Parameter, *, kind: str) -> torch.Tensor:
        """The full fp32 master weight (``kind="model"``) or moment of ``param``; collective over the
        data-parallel group with the distributed optimizer."""
        if not self.sharded:
            main = self.main_of.get(param, param)
            return main if kind == "model" else self.owner[main].state[main][kind]
        flat = torch.zeros(param.numel(), dtype=torch.float32, device=param.device)
        if param in self.shard_of:
            shard, start, end = self.shard_of[param]
            flat[start:end] = shard if kind == "model" else self.owner[shard].state[shard][kind]
        dist.all_reduce(flat, group=self.dp_group)
        return flat.view(param.shape)

    def load(self, param: torch.nn.Parameter, value: torch.Tensor, *, kind: str, step: int) -> None:
        """Set ``param``'s master weight (and the model parameter itself) or moment from its full value."""
        if kind == "model":
            param.copy_(value)
        if self.sharded:
            if param not in self.shard_of:
                return
            target, start, end = self.shard_of[param]
            piece = value.reshape(-1)[start:end]
        else:
            target = self.main_of.get(param, param)
            piece = value
        if kind == "model":
            if target is not param:
                target.copy_(piece)
            return
        inner = self.owner[target]
        state = inner.state[target]
        state[kind] = piece.to(target.device, target.dtype).clone()
        state["step"] = torch.tensor(float(step))  # torch's Adam keeps a float tensor on the host
        for group in inner.param_groups:
            if "step" in group:  # fused (Apex / Transformer Engine) Adam counts per group
                group["step"] = step
