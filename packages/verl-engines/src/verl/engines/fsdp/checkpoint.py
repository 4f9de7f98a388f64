"""Sharded, atomic checkpoints of an FSDP2 model, its optimizer, lr scheduler and RNG state.

Layout of a checkpoint directory::

    state/shard-0000<r>-model-00001-of-00001.safetensors   every rank's shards (torch.distributed.checkpoint)
    rng/rank_<r>.safetensors, rng/rank_<r>.json             torch/device RNG (tensors), python/numpy RNG
    engine_state.json                                       lr scheduler, optimizer hyper-parameters, world size

Tensors are written with torch.distributed.checkpoint's safetensors writer, each shard tagged with its
offsets, so a checkpoint saved on N ranks loads on M ranks (DCP reshards on read). Nothing on the load
path unpickles: shards and RNG tensors are safetensors, everything else is JSON (DCP's default format
pickles its metadata and non-tensor values, which is why it is not used).

Before anything is read, every safetensors file of the checkpoint is checked to be one (its header parses
and describes exactly the file's length): a truncated file, or anything else put in its place (a pickle, say),
is refused with an error naming it, before a tensor is touched.

Atomicity: everything goes to ``<path>.tmp``; rank 0 renames it to ``<path>`` after every rank has
finished, and ``engine_state.json`` is the last file written. A crash leaves at most a ``.tmp``
directory, which is never mistaken for a checkpoint.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

FORMAT_VERSION = 1
ENGINE_STATE_FILE = "engine_state.json"
STATE_DIR = "state"
RNG_DIR = "rng"

_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)
#: LoRA: only what trains (adapters, a value head) and its optimizer state; the frozen base is the model folder's.
_TRAINABLE_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True, ignore_frozen_params=True)


def _options(trainable_only: bool) -> StateDictOptions:
    return _TRAINABLE_OPTIONS if trainable_only else _OPTIONS


def _load_options(trainable_only: bool) -> StateDictOptions:
    # Not strict with trainable_only: the frozen weights are absent on purpose. Every key asked for was
    # read by dcp.load, which fails on one the checkpoint lacks, so nothing goes unloaded silently.
    return (
        StateDictOptions(flatten_optimizer_state_dict=True, ignore_frozen_params=True, strict=False)
        if trainable_only
        else _OPTIONS
    )


def _storage_key(tensor: torch.Tensor) -> tuple[int, tuple[int, ...]]:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.untyped_storage().data_ptr(), tuple(tensor.shape)


def _tensor_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, options: StateDictOptions = _OPTIONS
) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """(tensors to checkpoint, the optimizer's non-tensor entries, aliases) with flat, rank-independent keys.

    Tied weights (``lm_head.weight`` is ``embed_tokens.weight``, and their optimizer state) appear under
    several names sharing one storage; safetensors refuses to write shared storage, so each storage is
    kept under its first name and the others are recorded as ``alias -> kept name``."""
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    named: dict[str, torch.Tensor] = {}
    for key, value in model_sd.items():
        if not isinstance(value, torch.Tensor):  # FSDP2's model state is DTensors; anything else is a bug
            raise TypeError(f"model state {key!r} is a {type(value).__name__}, not a tensor")
        named[f"model.{key}"] = value
    other = {}
    for key, item in optim_sd.items():
        if isinstance(item, torch.Tensor):
            named[f"optim.{key}"] = item
        else:
            other[key] = item
    tensors: dict[str, Any] = {}
    aliases: dict[str, str] = {}
    owner: dict[tuple[int, tuple[int, ...]], str] = {}
    for key, value in named.items():
        storage = _storage_key(value)
        if storage in owner:
            aliases[key] = owner[storage]
        else:
            owner[storage] = key
            tensors[key] = value
    return tensors, other, aliases


def is_checkpoint(path: str) -> bool:
    return os.path.isfile(os.path.join(path, ENGINE_STATE_FILE))


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def publish(tmp: str, path: str, state: dict[str, Any]) -> None:
    """Complete a checkpoint written under ``tmp``: its ``engine_state.json`` last (what marks it complete),
    then ``tmp`` takes ``path``'s place; an earlier checkpoint at ``path`` is kept as ``path.old`` until the
    new one is in place. Rank 0 only, after every rank wrote its files."""
    with open(os.path.join(tmp, ENGINE_STATE_FILE), "w") as f:
        json.dump(state, f, indent=2)
    old = f"{path}.old"
    if os.path.exists(path):
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def save_checkpoint(
    path: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    lr_scheduler: torch.optim.lr_scheduler.LRScheduler,
    platform,
    extra: dict[str, Any] | None = None,
    trainable_only: bool = False,
) -> None:
    """Collective: every rank of the default group calls it with the same ``path``. ``trainable_only``:
    only parameters that require gradients (LoRA adapters) and their optimizer state."""
    path = os.path.abspath(path.rstrip("/"))
    tmp = f"{path}.tmp"
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # leftovers of a crashed save
        os.makedirs(os.path.join(tmp, RNG_DIR))
    _barrier()

    tensors, _, _ = _tensor_state(model, optimizer, _options(trainable_only))
    dcp.save(tensors, storage_writer=HuggingFaceStorageWriter(os.path.join(tmp, STATE_DIR), save_distributed=True))
    _save_rng(os.path.join(tmp, RNG_DIR), rank, platform)
    _barrier()

    if rank == 0:
        state = {
            "format_version": FORMAT_VERSION,
            "world_size": world,
            "lr_scheduler": lr_scheduler.state_dict(),
            "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups],
            "extra": extra or {},
        }
        publish(tmp, path, state)
    _barrier()


def load_checkpoint(
    path: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    lr_scheduler: torch.optim.lr_scheduler.LRScheduler,
    platform,
    trainable_only: bool = False,
    expect: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Restore what :func:`save_checkpoint` wrote (on any number of ranks); returns its ``extra``.
    ``expect``: values the checkpoint's ``extra`` must have (a missing key counts as 0), checked before
    any tensor is read."""
    path = os.path.abspath(path.rstrip("/"))
    if not is_checkpoint(path):
        hint = " (a save was interrupted: only a .tmp directory exists)" if os.path.isdir(f"{path}.tmp") else ""
        raise FileNotFoundError(f"{path!r} is not a complete checkpoint: {ENGINE_STATE_FILE} is missing{hint}")
    with open(os.path.join(path, ENGINE_STATE_FILE)) as f:
        state = json.load(f)
    if state.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"checkpoint {path!r} has format version {state.get('format_version')}, this verl reads {FORMAT_VERSION}"
        )

    saved_extra = state.get("extra", {})
    for key, value in (expect or {}).items():
        if saved_extra.get(key, 0) != value:
            raise ValueError(
                f"checkpoint {path!r} was saved with {key}={saved_extra.get(key, 0)}, this engine has {key}={value}: "
                "resume with the settings the checkpoint was written with"
            )
    for folder in (STATE_DIR, RNG_DIR):
        for name in sorted(os.listdir(os.path.join(path, folder))):
            if name.endswith(".safetensors"):
                _require_safetensors(path, os.path.join(folder, name))

    tensors, other, aliases = _tensor_state(model, optimizer, _options(trainable_only))
    dcp.load(tensors, storage_reader=HuggingFaceStorageReader(os.path.join(path, STATE_DIR)))
    tensors.update({alias: tensors[kept] for alias, kept in aliases.items()})
    model_sd = {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
    optim_sd = {k.removeprefix("optim."): v for k, v in tensors.items() if k.startswith("optim.")}
    optim_sd.update(other)
    set_state_dict(
        model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd, options=_load_options(trainable_only)
    )

    saved_groups = state["param_groups"]
    if len(saved_groups) != len(optimizer.param_groups):
        raise ValueError(
            f"checkpoint {path!r} has {len(saved_groups)} optimizer parameter groups, the engine has "
            f"{len(optimizer.param_groups)}"
        )
    for group, saved in zip(optimizer.param_groups, saved_groups):
        for key, value in saved.items():
            group[key] = tuple(value) if isinstance(group.get(key), tuple) else value
    lr_scheduler.load_state_dict(state["lr_scheduler"])

    rank = dist.get_rank() if dist.is_initialized() else 0
    # On more ranks than saved, the extra ranks take the RNG streams of rank % saved_world.
    _load_rng(os.path.join(path, RNG_DIR), rank % int(state["world_size"]), platform)
    return state.get("extra", {})


#: No real safetensors header is this large; a larger length field means the file is something else.
_MAX_HEADER_BYTES = 100 * 1024 * 1024


def _require_safetensors(path: str, name: str) -> None:
    """``<path>/<name>`` is a whole safetensors file, else a ValueError naming it (reads the header only)."""
    file = os.path.join(path, name)
    size = os.path.getsize(file)
    with open(file, "rb") as fh:
        length_field = fh.read(8)
        header_len = int.from_bytes(length_field, "little") if len(length_field) == 8 else -1
        problem = None
        if header_len < 2 or header_len > min(size - 8, _MAX_HEADER_BYTES):
            problem = "it does not start with a safetensors header"
        else:
            try:
                header = json.loads(fh.read(header_len))
                end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
            except (
                UnicodeDecodeError,
                json.JSONDecodeError,
                KeyError,
                TypeError,
                ValueError,
                IndexError,
                AttributeError,
            ):
                problem = "its safetensors header is corrupt"
            else:
                if size != 8 + header_len + end:
                    problem = f"it has {size} bytes, its header describes {8 + header_len + end}"
    if problem:
        raise ValueError(
            f"checkpoint {path!r}: {name} is not a valid safetensors file ({problem}): it is truncated, damaged or "
            "was replaced; nothing was loaded. Load an earlier checkpoint"
        )


def _save_rng(folder: str, rank: int, platform) -> None:
    tensors = {f"torch.{k}": v.contiguous().cpu() for k, v in platform.get_rng_state().items()}
    save_file(tensors, os.path.join(folder, f"rank_{rank}.safetensors"))
    np_state = np.random.get_state(legacy=True)
    if not isinstance(np_state, tuple):
        raise TypeError("numpy returned its RNG state as a dict although the legacy tuple was asked for")
    py_state = random.getstate()
    with open(os.path.join(folder, f"rank_{rank}.json"), "w") as f:
        json.dump(
            {
                "python": [py_state[0], list(py_state[1]), py_state[2]],
                "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
            },
            f,
        )


def _load_rng(folder: str, rank: int, platform) -> None:
    tensors = load_file(os.path.join(folder, f"rank_{rank}.safetensors"))
    platform.set_rng_state({k.removeprefix("torch."): v for k, v in tensors.items()})
    with open(os.path.join(folder, f"rank_{rank}.json")) as f:
        other = json.load(f)
    version, internal, gauss = other["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = other["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
