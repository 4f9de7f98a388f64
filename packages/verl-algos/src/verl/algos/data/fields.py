"""Field helpers for the DataProto batches the algorithms read."""

from __future__ import annotations

import torch

from verl.core.protocol import DataProto


def response_mask_of(data: DataProto) -> torch.Tensor:
    """``response_mask`` of the batch, else the response part of ``attention_mask`` (its last
    ``responses.shape[1]`` columns: verl's layout is [left-padded prompt | right-padded response])."""
    batch = data.batch
    if batch is None:
        raise ValueError("the batch holds no tensors; expected 'responses' and 'response_mask'")
    if "response_mask" in batch.keys():
        return batch["response_mask"]
    if "attention_mask" in batch.keys() and "responses" in batch.keys():
        return batch["attention_mask"][:, -batch["responses"].shape[1] :]
    raise ValueError(
        f"the batch has neither 'response_mask' nor 'attention_mask' + 'responses' (fields: {data.keys()})"
    )
