"""Collating dataset items into a DataProto."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from verl.algos.data.masked import object_array
from verl.core.protocol import DataProto


def collate_fn(items: list[dict[str, Any]]) -> DataProto:
    """Stack the tensor fields of ``items`` into ``batch`` and put every other field into
    ``non_tensor_batch`` as a numpy object array (one entry per item)."""
    if not items:
        raise ValueError("collate_fn: no items to collate")
    tensors: dict[str, torch.Tensor] = {}
    non_tensors: dict[str, np.ndarray] = {}
    for key in items[0]:
        values = [item[key] for item in items]
        if isinstance(values[0], torch.Tensor):
            tensors[key] = torch.stack(values)
        else:
            non_tensors[key] = object_array(values)
    return DataProto.from_dict(tensors, non_tensors)
