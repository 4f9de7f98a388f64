"""The trainer's prompt data: ``builtin:<task>`` files, the datasets, and a resumable batch order.

``data.train_files`` / ``data.val_files`` name parquet or jsonl files in verl's schema, or
``builtin:<task>`` (``builtin:arithmetic``, ``builtin:word_problems``): the offline generator writes the
task once into ``<trainer.default_local_dir>/data/<task>-<options hash>/`` and the train or test split of
it is used. The generator's splits never overlap, so validation is held out.

Batches come from :class:`ResumableBatchOrder`: a seeded permutation per epoch whose position is two
integers, saved in every checkpoint, so a resumed run sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

import torch

BUILTIN_PREFIX = "builtin:"


def resolve_files(files: list[str], split: str, builtin_options: dict[str, Any], cache_root: str) -> list[str]:
    """Local file paths for ``files``, generating ``builtin:<task>`` ones (``split``: "train" or "test")."""
    resolved = []
    for name in files:
        if name.startswith(BUILTIN_PREFIX):
            resolved.append(_builtin_split(name[len(BUILTIN_PREFIX) :], split, builtin_options, cache_root))
        else:
            path = os.path.expanduser(name)
            if not os.path.isfile(path):
                raise FileNotFoundError(
                    f"data file {name!r} does not exist; give parquet/jsonl files in verl's schema, or "
                    f"builtin:arithmetic / builtin:word_problems for an offline task"
                )
            resolved.append(path)
    return resolved


def _builtin_split(task: str, split: str, options: dict[str, Any], cache_root: str) -> str:
    from verl.algos.data.generate import TASK_GENERATORS, write_task

    if task not in TASK_GENERATORS:
        raise ValueError(
            f"unknown built-in task {task!r}; built-in tasks: {', '.join(sorted(TASK_GENERATORS.names()))}"
        )
    digest = hashlib.sha256(json.dumps(options, sort_keys=True, default=str).encode()).hexdigest()[:10]
    folder = os.path.join(cache_root, f"{task}-{digest}")
    path = os.path.join(folder, f"{split}.parquet")
    if not os.path.isfile(path):
        staging = f"{folder}.tmp-{os.getpid()}"
        write_task(task, staging, **options)
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        try:
            os.replace(staging, folder)
        except OSError:  # another process wrote it first
            import shutil

            shutil.rmtree(staging, ignore_errors=True)
    return path


@dataclass
class ResumableBatchOrder:
    """Batches of dataset indices: a fresh seeded permutation each epoch, incomplete last batch dropped."""

    dataset_size: int
    batch_size: int
    shuffle: bool = True
    seed: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0

    def __post_init__(self) -> None:
        if self.dataset_size < self.batch_size:
            raise ValueError(
                f"the training set has {self.dataset_size} prompts, fewer than data.train_batch_size="
                f"{self.batch_size}; lower the batch size or add data"
            )

    @property
    def batches_per_epoch(self) -> int:
        return self.dataset_size // self.batch_size

    def _order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.dataset_size))
        generator = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        return torch.randperm(self.dataset_size, generator=generator).tolist()

    def next_batch(self) -> list[int]:
        """The next batch, advancing the position (and the epoch when one is used up)."""
        if self.batch_in_epoch >= self.batches_per_epoch:
            self.epoch += 1
            self.batch_in_epoch = 0
        order = self._order(self.epoch)
        start = self.batch_in_epoch * self.batch_size
        self.batch_in_epoch += 1
        return order[start : start + self.batch_size]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.batch_in_epoch = int(state["epoch"]), int(state["batch_in_epoch"])
