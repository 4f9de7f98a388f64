"""``DataProto``: the batch that flows between the driver and worker groups.

Three parts share one batch dimension:
- ``batch``: a ``tensordict.TensorDict`` of tensors (ids, masks, log-probs, advantages...);
- ``non_tensor_batch``: a dict of 1-D numpy object arrays (raw prompts, ground truths, uids...);
- ``meta_info``: a plain dict that is not split (temperature, global token counts, ...).

All operations keep the three in step; it pickles cheaply (tensors go through torch's storage
pickling, which Ray's object store handles zero-copy for large buffers).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import tensordict
import torch
from tensordict import TensorDict


def _as_object_array(values: Any) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype == object and values.ndim == 1:
        return values
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = v
    return arr


@dataclass
class DataProto:
    batch: TensorDict | None = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.non_tensor_batch = {k: _as_object_array(v) for k, v in self.non_tensor_batch.items()}
        self.check_consistency()

    # -- construction ---------------------------------------------------------------------------------
    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict[str, Any] | None = None,
    ) -> DataProto:
        tensors = tensors or {}
        batch = None
        if tensors:
            sizes = {k: v.shape[0] for k, v in tensors.items()}
            if len(set(sizes.values())) != 1:
                raise ValueError(f"DataProto.from_dict: tensors disagree on the batch size: {sizes}")
            batch = TensorDict(dict(tensors), batch_size=[next(iter(sizes.values()))])
        return cls(batch=batch, non_tensor_batch=dict(non_tensors or {}), meta_info=dict(meta_info or {}))

    def check_consistency(self) -> None:
        n = None if self.batch is None else self.batch.batch_size[0]
        for key, arr in self.non_tensor_batch.items():
            if arr.ndim != 1:
                raise ValueError(f"DataProto: non-tensor field {key!r} must be 1-D, got shape {arr.shape}")
            if n is None:
                n = len(arr)
            elif len(arr) != n:
                raise ValueError(f"DataProto: non-tensor field {key!r} has {len(arr)} rows, the batch has {n}")

    # -- size and access ----------------------------------------------------------------------------------
    @property
    def tensors(self) -> TensorDict:
        """``batch`` for code that needs the tensors: an error naming the fields when there are none."""
        if self.batch is None:
            raise KeyError(f"DataProto has no tensors (fields: {self.keys()}); expected a tensor batch")
        return self.batch

    def __len__(self) -> int:
        if self.batch is not None:
            return int(self.batch.batch_size[0])
        if self.non_tensor_batch:
            return len(next(iter(self.non_tensor_batch.values())))
        return 0

    def __getitem__(self, item: int | slice | Sequence[int] | np.ndarray | torch.Tensor) -> DataProto:
        """Rows by int, slice, index list/array/tensor or boolean mask. Always returns a DataProto."""
        if isinstance(item, int):
            item = slice(item, item + 1) if item != -1 else slice(-1, None)
        if isinstance(item, slice):
            batch = None if self.batch is None else self.batch[item]
            non_tensor = {k: v[item] for k, v in self.non_tensor_batch.items()}
        else:
            idx = torch.as_tensor(np.asarray(item) if not isinstance(item, torch.Tensor) else item)
            if idx.dtype == torch.bool:
                idx = idx.nonzero().flatten()
            idx = idx.long()
            batch = None if self.batch is None else self.batch[idx]
            np_idx = idx.numpy()
            non_tensor = {k: v[np_idx] for k, v in self.non_tensor_batch.items()}
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    def keys(self) -> list[str]:
        # The batch is flat: its keys are strings (tensordict types them as possibly nested tuples).
        tensor_keys = [] if self.batch is None else cast(list[str], list(self.batch.keys()))
        return tensor_keys + list(self.non_tensor_batch)

    # -- selection ----------------------------------------------------------------------------------------
    def select(
        self,
        batch_keys: Iterable[str] | None = None,
        non_tensor_batch_keys: Iterable[str] | None = None,
        meta_info_keys: Iterable[str] | None = None,
        deepcopy: bool = False,
    ) -> DataProto:
        """A view with only the given keys (None keeps all of that part)."""
        batch = self.batch
        if batch_keys is not None and batch is not None:
            batch = batch.select(*batch_keys)
        non_tensor = dict(self.non_tensor_batch)
        if non_tensor_batch_keys is not None:
            non_tensor = {k: self.non_tensor_batch[k] for k in non_tensor_batch_keys}
        meta = dict(self.meta_info)
        if meta_info_keys is not None:
            meta = {k: self.meta_info[k] for k in meta_info_keys}
        out = DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)
        return copy.deepcopy(out) if deepcopy else out

    def pop(
        self,
        batch_keys: Iterable[str] = (),
        non_tensor_batch_keys: Iterable[str] = (),
        meta_info_keys: Iterable[str] = (),
    ) -> DataProto:
        """Remove the given keys from self and return them as a new DataProto."""
        batch_keys, non_tensor_batch_keys, meta_info_keys = (
            list(batch_keys),
            list(non_tensor_batch_keys),
            list(meta_info_keys),
        )
        batch = None
        if batch_keys:
            if self.batch is None:
                raise KeyError(f"DataProto.pop: no tensors to pop {batch_keys} from; fields: {self.keys()}")
            batch = TensorDict({k: self.batch.pop(k) for k in batch_keys}, batch_size=self.batch.batch_size)
        non_tensor = {k: self.non_tensor_batch.pop(k) for k in non_tensor_batch_keys}
        meta = {k: self.meta_info.pop(k) for k in meta_info_keys}
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def rename(self, old: str, new: str) -> DataProto:
        if self.batch is not None and old in self.batch.keys():
            self.batch.rename_key_(old, new)
        elif old in self.non_tensor_batch:
            self.non_tensor_batch[new] = self.non_tensor_batch.pop(old)
        else:
            raise KeyError(f"DataProto.rename: no field {old!r}; fields: {self.keys()}")
        return self

    def union(self, other: DataProto) -> DataProto:
        """Merge ``other``'s fields into self (same rows). A shared key must hold equal values."""
        if len(self) and len(other) and len(self) != len(other):
            raise ValueError(f"DataProto.union: batch sizes differ ({len(self)} vs {len(other)})")
        if other.batch is not None:
            if self.batch is None:
                self.batch = other.batch.clone(False)
            else:
                for key in other.batch.keys():
                    if key in self.batch.keys() and not torch.equal(self.batch[key], other.batch[key]):
                        raise ValueError(f"DataProto.union: tensor {key!r} differs between the two batches")
                    self.batch[key] = other.batch[key]
        for key, arr in other.non_tensor_batch.items():
            if key in self.non_tensor_batch and not _object_arrays_equal(self.non_tensor_batch[key], arr):
                raise ValueError(f"DataProto.union: non-tensor {key!r} differs between the two batches")
            self.non_tensor_batch[key] = arr
        for key, value in other.meta_info.items():
            if key in self.meta_info and not _values_equal(self.meta_info[key], value):
                raise ValueError(f"DataProto.union: meta_info {key!r} differs ({self.meta_info[key]!r} vs {value!r})")
            self.meta_info[key] = value
        self.check_consistency()
        return self

    # -- split and join -----------------------------------------------------------------------------------
    def split(self, split_size: int) -> list[DataProto]:
        """Consecutive pieces of ``split_size`` rows (the last may be shorter)."""
        if split_size <= 0:
            raise ValueError(f"DataProto.split: split_size must be positive, got {split_size}")
        return [self[i : i + split_size] for i in range(0, len(self), split_size)]

    def chunk(self, chunks: int) -> list[DataProto]:
        """``chunks`` equal pieces; the length must divide (pad first with :meth:`pad_to_divisor`)."""
        if chunks <= 0:
            raise ValueError(f"DataProto.chunk: chunks must be positive, got {chunks}")
        if len(self) % chunks:
            raise ValueError(
                f"DataProto.chunk: {len(self)} rows do not split into {chunks} equal chunks; "
                "pad with pad_to_divisor() first"
            )
        size = len(self) // chunks
        return [self[i * size : (i + 1) * size] for i in range(chunks)]

    @staticmethod
    def concat(parts: Sequence[DataProto]) -> DataProto:
        """Rows of all parts in order. meta_info comes from the first part, merged with the others'."""
        parts = list(parts)
        if not parts:
            raise ValueError("DataProto.concat: nothing to concatenate")
        batches = [p.batch for p in parts if p.batch is not None]
        if batches and len(batches) != len(parts):
            raise ValueError("DataProto.concat: some parts have tensors and some do not")
        batch = tensordict.cat(batches, dim=0) if batches else None
        non_tensor = {}
        for key in parts[0].non_tensor_batch:
            non_tensor[key] = np.concatenate([p.non_tensor_batch[key] for p in parts])
        meta: dict[str, Any] = {}
        for p in parts:
            for k, v in p.meta_info.items():
                meta.setdefault(k, v)
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def repeat(self, repeat_times: int, interleave: bool = True) -> DataProto:
        """Each row ``repeat_times`` times: ``aabb`` when interleaved (n samples per prompt), else ``abab``."""
        n = len(self)
        if interleave:
            idx = torch.arange(n).repeat_interleave(repeat_times)
        else:
            idx = torch.arange(n).repeat(repeat_times)
        return self[idx]

    def reorder(self, indices: torch.Tensor | Sequence[int]) -> DataProto:
        """Permute rows in place."""
        reordered = self[torch.as_tensor(indices)]
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch
        return self

    def pad_to_divisor(self, divisor: int) -> tuple[DataProto, int]:
        """Append copies of the first rows until ``len`` divides ``divisor``; returns (padded, pad_size).
        Padding rows repeat real rows (never garbage) so every rank computes on valid data."""
        if divisor <= 0:
            raise ValueError(f"DataProto.pad_to_divisor: divisor must be positive, got {divisor}")
        n = len(self)
        if n == 0:
            raise ValueError("DataProto.pad_to_divisor: cannot pad an empty batch")
        pad = (-n) % divisor
        if pad == 0:
            return self, 0
        idx = torch.cat([torch.arange(n), torch.arange(pad) % n])
        return self[idx], pad

    def unpad(self, pad_size: int) -> DataProto:
        return self if pad_size == 0 else self[: len(self) - pad_size]

    # -- misc ---------------------------------------------------------------------------------------------
    def to(self, device: str | torch.device) -> DataProto:
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    def clone(self) -> DataProto:
        return copy.deepcopy(self)

    def __repr__(self) -> str:
        tensors = {} if self.batch is None else {k: tuple(v.shape) for k, v in self.batch.items()}
        return (
            f"DataProto(len={len(self)}, batch={tensors}, non_tensor={list(self.non_tensor_batch)}, "
            f"meta_info={list(self.meta_info)})"
        )


def _object_arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return len(a) == len(b) and all(_values_equal(x, y) for x, y in zip(a, b))


def _values_equal(a: Any, b: Any) -> bool:
    try:
        result = a == b
        if isinstance(result, (bool, np.bool_)):
            return bool(result)
        return bool(np.all(result))
    except Exception:
        return a is b
