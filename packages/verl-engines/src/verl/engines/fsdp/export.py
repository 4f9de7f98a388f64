"""Export a sharded model to a Hugging Face folder that ``from_pretrained`` loads.

Parameters are gathered one at a time (every rank takes part in each gather) and rank 0 writes them
into safetensors files of at most ``max_shard_bytes``; no rank ever holds the whole model. The folder
gets the model config (with ``dtype`` set to the exported dtype), the generation config and the
tokenizer, and appears under its final name only when complete (written to ``<path>.tmp`` first).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
from collections.abc import Iterator

import torch
import torch.distributed as dist
from safetensors.torch import save_file

logger = logging.getLogger(__name__)

SAFE_WEIGHTS_INDEX = "model.safetensors.index.json"


def _plan_files(sizes: list[tuple[str, int]], max_shard_bytes: int) -> list[list[str]]:
    files: list[list[str]] = [[]]
    current = 0
    for name, nbytes in sizes:
        if files[-1] and current + nbytes > max_shard_bytes:
            files.append([])
            current = 0
        files[-1].append(name)
        current += nbytes
    return files


def _file_name(index: int, count: int) -> str:
    return "model.safetensors" if count == 1 else f"model-{index + 1:05d}-of-{count:05d}.safetensors"


def export_hf_folder(
    path: str,
    named_shapes: list[tuple[str, torch.Size]],
    named_full_tensors: Iterator[tuple[str, torch.Tensor]],
    hf_config,
    *,
    source_path: str | None,
    dtype: torch.dtype = torch.float32,
    max_shard_bytes: int = 5 * 1024**3,
) -> None:
    """Collective. ``named_shapes`` lists, in iteration order, what ``named_full_tensors`` yields."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    path = os.path.abspath(path.rstrip("/"))
    tmp = f"{path}.tmp"
    element = torch.empty((), dtype=dtype).element_size()
    sizes = [(name, int(torch.Size(shape).numel()) * element) for name, shape in named_shapes]
    files = _plan_files(sizes, max_shard_bytes)
    file_of = {name: i for i, names in enumerate(files) for name in names}

    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    pending: dict[str, torch.Tensor] = {}
    current_file = 0
    for name, tensor in named_full_tensors:
        if rank != 0:
            continue  # the gather inside the iterator is the collective part
        if file_of[name] != current_file:
            save_file(pending, os.path.join(tmp, _file_name(current_file, len(files))), metadata={"format": "pt"})
            pending, current_file = {}, file_of[name]
        pending[name] = tensor.detach().to("cpu", dtype=dtype).contiguous()
    if rank == 0:
        save_file(pending, os.path.join(tmp, _file_name(current_file, len(files))), metadata={"format": "pt"})
        if len(files) > 1:
            index = {
                "metadata": {"total_size": sum(n for _, n in sizes)},
                "weight_map": {name: _file_name(i, len(files)) for name, i in file_of.items()},
            }
            with open(os.path.join(tmp, SAFE_WEIGHTS_INDEX), "w") as f:
                json.dump(index, f, indent=2)
        _write_configs(tmp, hf_config, source_path, dtype)
        if os.path.exists(path):
            shutil.rmtree(path)
        os.replace(tmp, path)
    if dist.is_initialized():
        dist.barrier()


def _write_configs(folder: str, hf_config, source_path: str | None, dtype: torch.dtype) -> None:
    from transformers import AutoTokenizer, GenerationConfig

    config = copy.deepcopy(hf_config)
    config.dtype = dtype
    config.save_pretrained(folder)
    try:
        generation = GenerationConfig.from_pretrained(source_path) if source_path else None
    except OSError:
        generation = None
    if generation is None:
        generation = GenerationConfig.from_model_config(hf_config)
    generation.save_pretrained(folder)
    if not source_path:
        logger.warning("export to %s: no tokenizer folder known, the export has no tokenizer", folder)
        return
    try:
        tokenizer = AutoTokenizer.from_pretrained(source_path)
    except (OSError, ValueError) as exc:
        logger.warning("export to %s: no tokenizer in %s (%s); the export has none", folder, source_path, exc)
        return
    tokenizer.save_pretrained(folder)
