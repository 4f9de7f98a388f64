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


def response_tokens_mask(data: DataProto) -> torch.Tensor:
    """Every valid response token: the response part of ``attention_mask``, which unlike ``response_mask``
    covers the tool and user tokens an agent loop inserted between the model's turns (they are not trained
    on, but a reward reads the whole conversation, as verl's reward managers decode it). Without
    ``attention_mask``: ``response_mask``."""
    batch = data.batch
    if batch is not None and "attention_mask" in batch.keys() and "responses" in batch.keys():
        return batch["attention_mask"][:, -batch["responses"].shape[1] :]
    return response_mask_of(data)
