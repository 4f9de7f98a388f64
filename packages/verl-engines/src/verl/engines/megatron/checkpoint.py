"""Atomic, layout-independent checkpoints of the megatron engine: weights, Adam state, lr schedule, RNG.

Layout of a checkpoint directory::

    tensors/model-<i>.safetensors        full weights under their Hugging Face names (fp32 master weights)
    tensors/exp_avg-<i>.safetensors      Adam's first moments, same names and shapes as the weights
    tensors/exp_avg_sq-<i>.safetensors   Adam's second moments
    rng/rank_<r>.safetensors, .json      torch/device RNG (tensors), python/numpy RNG (the FSDP engine's files)
    rng/megatron_rank_<r>.safetensors    megatron's RNG tracker streams (per TP rank)
    engine_state.json                    format, layout, Adam step count, lr schedule, extra

Every tensor is stored *unsharded and under its HF name*: the same gather that ``named_full_parameters``
does, applied to the weights and to each Adam moment, and on load the same converter that loads a HF
folder cuts them for the loading rank. So a checkpoint saved on one TP x PP x DP layout loads on any other
(the moments of a fused megatron tensor split exactly as its weight does, elementwise state being
elementwise). The price: rank 0 writes everything (streamed, at most ``MAX_FILE_BYTES`` held at once), and
every rank reads the whole files on load, as :meth:`MegatronEngine.initialize` reads a HF folder. Vocabulary
padding rows are dropped (their weights and moments stay zero: padded logits are masked out).

Nothing on the load path unpickles: tensors are safetensors, each file checked to be whole before any
tensor is read (``verl.engines.fsdp.checkpoint._require_safetensors``), everything else JSON. Atomicity as
for FSDP: written to ``<path>.tmp``, renamed by rank 0 after every rank finished, ``engine_state.json`` last.

With megatron's distributed optimizer the moments and fp32 masters are gathered from the data-parallel
slices and cut back into them on load (:mod:`~verl.engines.megatron.adam_state`), so a checkpoint also
moves between the distributed and the plain optimizer.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from verl.engines.fsdp.checkpoint import (
    ENGINE_STATE_FILE,
    _barrier,
    _load_rng,
    _require_safetensors,
    _save_rng,
    is_checkpoint,
    publish,
)
from verl.engines.megatron.adam_state import MOMENTS, AdamState
from verl.engines.megatron.build import Layout, gather_hf_weights, scatter_hf_tensors

FORMAT_VERSION = 1
BACKEND = "megatron"
TENSOR_DIR = "tensors"
RNG_DIR = "rng"
#: rank 0 writes a file whenever this much is pending (bounds its host memory during a save).
MAX_FILE_BYTES = 2 * 1024**3


def _layout(layout: Layout) -> dict[str, int | None]:
    return {"tp": layout.tp, "pp": layout.pp, "vpp": layout.vpp}


def _write_stream(folder: str, kind: str, tensors: Iterator[tuple[str, torch.Tensor]], write: bool) -> None:
    """Consume ``tensors`` (a collective gather: every rank iterates); rank 0 (``write``) saves them in
    files of about ``MAX_FILE_BYTES``."""
    pending: dict[str, torch.Tensor] = {}
    size, index = 0, 0
    for name, tensor in tensors:
        if not write:
            continue
        pending[name] = tensor.detach().to("cpu", torch.float32).contiguous()
        size += pending[name].numel() * 4
        if size >= MAX_FILE_BYTES:
            save_file(pending, os.path.join(folder, f"{kind}-{index:05d}.safetensors"))
            pending, size, index = {}, 0, index + 1
    if write and (pending or index == 0):
        save_file(pending, os.path.join(folder, f"{kind}-{index:05d}.safetensors"))


def save_checkpoint(path: str, engine, extra: dict[str, Any] | None = None) -> None:
    """Collective: every rank of the default group calls it with the same ``path``."""
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    path = os.path.abspath(path.rstrip("/"))
    tmp = f"{path}.tmp"
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # leftovers of a crashed save
        os.makedirs(os.path.join(tmp, TENSOR_DIR))
        os.makedirs(os.path.join(tmp, RNG_DIR))
    _barrier()

    adam = AdamState(engine.optimizer)
    # The same on every rank (a distributed-optimizer rank may hold no state): the gathers are collective.
    step_count = torch.tensor([adam.step()], dtype=torch.int64, device=engine.platform.device())
    dist.all_reduce(step_count, op=dist.ReduceOp.MAX)
    step = int(step_count.item())
    for kind in ("model", *(MOMENTS if step > 0 else ())):
        gathered = gather_hf_weights(
            engine.chunks,
            engine.shape,
            engine.layout,
            engine.spec,
            device=engine.platform.device(),
            tensor_of=functools.partial(adam.full, kind=kind),
        )
        _write_stream(os.path.join(tmp, TENSOR_DIR), kind, gathered, write=rank == 0)
    _save_rng(os.path.join(tmp, RNG_DIR), rank, engine.platform)
    tracker = {k: v.cpu().contiguous() for k, v in get_cuda_rng_tracker().get_states().items()}
    save_file(tracker, os.path.join(tmp, RNG_DIR, f"megatron_rank_{rank}.safetensors"))
    _barrier()

    if rank == 0:
        state = {
            "format_version": FORMAT_VERSION,
            "backend": BACKEND,
            "world_size": world,
            "layout": _layout(engine.layout),
            "adam_step": step,
            "lr_scheduler": engine.lr_scheduler.state_dict(),
            "extra": extra or {},
        }
        publish(tmp, path, state)
    _barrier()


def read_engine_state(path: str) -> dict[str, Any]:
    """``engine_state.json`` of a complete megatron checkpoint, after every safetensors file in it has been
    checked to be whole; nothing is loaded otherwise."""
    path = os.path.abspath(path.rstrip("/"))
    if not is_checkpoint(path):
        hint = " (a save was interrupted: only a .tmp directory exists)" if os.path.isdir(f"{path}.tmp") else ""
        raise FileNotFoundError(f"{path!r} is not a complete checkpoint: {ENGINE_STATE_FILE} is missing{hint}")
    with open(os.path.join(path, ENGINE_STATE_FILE)) as f:
        state = json.load(f)
    if state.get("backend") != BACKEND:
        raise ValueError(
            f"checkpoint {path!r} was written by the {state.get('backend', 'fsdp')!r} engine; the megatron engine "
            "reads its own checkpoints only (export to a HF folder to move weights between engines)"
        )
    if state.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"checkpoint {path!r} has format version {state.get('format_version')}, this verl reads {FORMAT_VERSION}"
        )
    for folder in (TENSOR_DIR, RNG_DIR):
        for name in sorted(os.listdir(os.path.join(path, folder))):
            if name.endswith(".safetensors"):
                _require_safetensors(path, os.path.join(folder, name))
    return state


def _read_kind(folder: str, kind: str) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for name in sorted(os.listdir(folder)):
        if name.startswith(f"{kind}-") and name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(folder, name)))
    return tensors


def load_checkpoint(path: str, engine) -> dict[str, Any]:
    """Restore what :func:`save_checkpoint` wrote, on any layout; returns its ``extra``."""
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    state = read_engine_state(path)
    path = os.path.abspath(path.rstrip("/"))
    folder = os.path.join(path, TENSOR_DIR)
    adam = AdamState(engine.optimizer)

    def scatter(tensors: dict[str, torch.Tensor], assign) -> None:
        scatter_hf_tensors(
            engine.chunks, tensors, engine.shape, engine.layout, engine.padded_vocab, assign, engine.spec
        )

    step = int(state["adam_step"])
    for kind in ("model", *(MOMENTS if step > 0 else ())):
        scatter(_read_kind(folder, kind), functools.partial(adam.load, kind=kind, step=step))
    engine.lr_scheduler.load_state_dict(state["lr_scheduler"])

    rank = dist.get_rank()
    # On more ranks than saved, the extra ranks take the RNG streams of rank % saved_world.
    _load_rng(os.path.join(path, RNG_DIR), rank % int(state["world_size"]), engine.platform)
    if state["world_size"] == dist.get_world_size() and state["layout"] == _layout(engine.layout):
        # megatron's streams are per TP rank: they carry over only onto the same layout.
        tracker = load_file(os.path.join(path, RNG_DIR, f"megatron_rank_{rank}.safetensors"))
        get_cuda_rng_tracker().set_states(tracker)
    return state.get("extra", {})
