"""LoRA in the FSDP2 engine, with PEFT: adapters on a frozen base model, both sharded by ``fully_shard``.

verl's keys (``<role>.model.lora_rank``, ``lora_alpha``, ``target_modules``, ``exclude_modules``) are
:class:`LoRAConfig`; ``lora_rank=0`` (the default) leaves the engine a full fine-tuning engine.

With LoRA on:

- :func:`apply_lora` wraps the loaded model in a ``PeftModel`` before sharding. PEFT freezes the base
  weights; only the ``lora_A``/``lora_B`` matrices (and a value model's scalar head, trained in full as
  verl's critic does) require gradients, so only they sit in the optimizer.
- :func:`merged_full_weights` yields the Hugging Face names and the merged weights ``W + scale * B @ A``,
  one tensor at a time: what weight sync to a rollout engine and the merged export read.
- :func:`adapter_full_state` gathers the adapter in PEFT's own file layout (``verl export --adapter-only``,
  and the adapter-only weight sync to a rollout engine that serves adapters); :func:`base_full_weights`
  yields the frozen base weights that such an engine needs once.
- The reference policy is the same model with the adapter switched off (:class:`AdapterDisabledReference`):
  no second copy of the base weights.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from verl.engines.lora_layout import ADAPTER_NAME as _ADAPTER
from verl.engines.lora_layout import ADAPTER_WEIGHTS_FILE, hf_name, is_adapter_weight
from verl.engines.models import VALUE_MODEL, named_weights

Gather = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class LoRAConfig:
    """verl's ``model.lora_rank`` / ``lora_alpha`` / ``target_modules`` / ``exclude_modules``."""

    #: Rank of the adapters; 0 turns LoRA off (full fine-tuning).
    lora_rank: int = 0
    #: Scale of the adapters' output is lora_alpha / lora_rank.
    lora_alpha: float = 16
    #: "all-linear" (every linear layer but the output head), or a list of module names / a regex, as PEFT.
    target_modules: str | list[str] = "all-linear"
    #: Module names (list) or a regex that get no adapter, as PEFT.
    exclude_modules: str | list[str] | None = None

    def __post_init__(self) -> None:
        if self.lora_rank < 0:
            raise ValueError(f"lora_rank={self.lora_rank} must be >= 0 (0 turns LoRA off)")
        if self.lora_rank and self.lora_alpha <= 0:
            raise ValueError(f"lora_alpha={self.lora_alpha} must be > 0")
        if isinstance(self.target_modules, (list, tuple)):
            self.target_modules = list(self.target_modules)
            if not self.target_modules:
                raise ValueError("target_modules is empty: name modules, or use 'all-linear'")
        if isinstance(self.exclude_modules, (list, tuple)):
            self.exclude_modules = list(self.exclude_modules)

    @property
    def enabled(self) -> bool:
        return self.lora_rank > 0


def _require_peft():
    try:
        import peft
    except ImportError as exc:  # peft is a dependency of verl-engines; a broken env gets told so
        raise ImportError("lora_rank > 0 needs the peft package: pip install peft") from exc
    return peft


def _value_head_names(model: nn.Module) -> list[str]:
    return [name for name, _ in model.named_children() if name in ("score", "classifier")]


def apply_lora(model: nn.Module, config: LoRAConfig, model_type: str) -> Any:
    """``model`` wrapped in a ``PeftModel`` with fresh adapters (B = 0: the wrapped model computes exactly
    what ``model`` did). Call before sharding."""
    peft = _require_peft()
    exclude = config.exclude_modules
    heads = _value_head_names(model) if model_type == VALUE_MODEL else []
    if heads:  # the scalar head is trained in full, never adapted
        if isinstance(exclude, str):  # a regex, matched by PEFT against whole module names
            exclude = f"(?:{exclude})|(?:{'|'.join(heads)})"
        else:
            exclude = heads + list(exclude or [])
    peft_config = peft.LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        target_modules=config.target_modules,
        exclude_modules=exclude,
        lora_dropout=0.0,
        bias="none",
    )
    try:
        wrapped = peft.get_peft_model(model, peft_config)
    except ValueError as exc:
        raise ValueError(
            f"LoRA: {exc}. target_modules={config.target_modules!r} must name modules of "
            f"{type(model).__name__} (or be 'all-linear')"
        ) from exc
    layers = lora_layers(wrapped)
    odd = [name for name, layer in layers.items() if not isinstance(layer, nn.Linear | peft.tuners.lora.Linear)]
    if odd:
        raise ValueError(f"LoRA on non-linear modules is not supported: {odd[:3]}; target linear layers only")
    for head in heads:
        for param in getattr(wrapped.get_base_model(), head).parameters():
            param.requires_grad_(True)
    return wrapped


def lora_layers(model: nn.Module) -> dict[str, Any]:
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def merged_weight_shapes(model: nn.Module) -> list[tuple[str, torch.Size]]:
    """(Hugging Face name, shape) in the order :func:`merged_full_weights` yields them."""
    return [(hf_name(name), tensor.shape) for name, tensor in named_weights(model) if not is_adapter_weight(name)]


def merged_full_weights(model: nn.Module, gather: Gather) -> Iterator[tuple[str, torch.Tensor]]:
    """The base model's weights under their Hugging Face names with every adapter merged in, one full
    tensor at a time (``gather`` turns a shard into the full tensor; every rank must iterate)."""
    layers = lora_layers(model)
    for name, tensor in named_weights(model):
        if is_adapter_weight(name):
            continue
        full = gather(tensor)
        owner = name.removesuffix(".base_layer.weight")
        if owner != name and owner in layers:
            full = _merge(full, layers[owner], gather)
        yield hf_name(name), full


def base_full_weights(model: nn.Module, gather: Gather) -> Iterator[tuple[str, torch.Tensor]]:
    """The frozen base weights under their Hugging Face names, nothing merged, one full tensor at a time."""
    for name, tensor in named_weights(model):
        if not is_adapter_weight(name):
            yield hf_name(name), gather(tensor)


def _merge(weight: torch.Tensor, layer: Any, gather: Gather) -> torch.Tensor:
    """PEFT's delta of a Linear LoRA layer (fan_in_fan_out off, no DoRA: what apply_lora builds)."""
    a = gather(layer.lora_A[_ADAPTER].weight).float()
    b = gather(layer.lora_B[_ADAPTER].weight).float()
    delta = (b @ a) * layer.scaling[_ADAPTER]
    return (weight.float() + delta).to(weight.dtype)


@contextlib.contextmanager
def adapter_disabled(model: nn.Module):
    """The base model's outputs inside (PEFT's ``disable_adapter``): the reference policy."""
    with model.disable_adapter():  # type: ignore[operator]
        yield


def adapter_full_state(model: nn.Module, gather: Gather) -> dict[str, torch.Tensor]:
    """The adapter's full tensors under PEFT's file keys (collective: every rank calls it)."""
    from peft import get_peft_model_state_dict

    full = {name: gather(p).detach().cpu() for name, p in model.named_parameters() if is_adapter_weight(name)}
    return get_peft_model_state_dict(model, state_dict=full, adapter_name=_ADAPTER)


def adapter_config(model: Any) -> dict[str, Any]:
    """The adapter's ``adapter_config.json`` contents (JSON types only: PEFT keeps module sets as sets)."""
    config = model.peft_config[_ADAPTER].to_dict()
    return {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}


def write_adapter_folder(path: str, model: Any, state: dict[str, torch.Tensor], base_model_path: str) -> None:
    """A PEFT adapter folder (``PeftModel.from_pretrained(base, path)`` loads it); rank 0 writes, every
    rank returns once it is in place."""
    from safetensors.torch import save_file

    rank = dist.get_rank() if dist.is_initialized() else 0
    path = os.path.abspath(path.rstrip("/"))
    if rank == 0:
        tmp = f"{path}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(tmp, ADAPTER_WEIGHTS_FILE))
        config = model.peft_config[_ADAPTER]
        config.base_model_name_or_path = base_model_path
        config.inference_mode = True
        config.save_pretrained(tmp)
        if os.path.exists(path):
            shutil.rmtree(path)
        os.replace(tmp, path)
    if dist.is_initialized():
        dist.barrier()


class AdapterDisabledReference:
    """The reference policy of a LoRA actor: the actor engine itself with its adapter switched off, so the
    base weights exist once (verl does the same). Offers what the workers call on a reference engine."""

    def __init__(self, actor):
        self.actor = actor

    @contextlib.contextmanager
    def eval_mode(self):
        with self.actor.eval_mode(), adapter_disabled(self.actor.module):
            yield

    def forward_only(self, batch, compute_entropy: bool = False) -> dict[str, torch.Tensor]:
        return self.actor.forward_only(batch, compute_entropy=compute_entropy)

    def __getattr__(self, name: str):  # dp_rank, dp_size, is_collect_rank, ...: the actor's
        return getattr(self.actor, name)
