"""Data: the RL prompt dataset (verl's schema), collation into DataProto, GSM8K preprocessing, the
offline task generators and DAPO's dynamic sampling.

The names below load on first use, so the command-line tools (``python -m
verl.algos.data.generate``, ``...gsm8k_preprocess``) start without importing torch."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "RLHFDataset": "verl.algos.data.dataset",
    "DatasetSchemaError": "verl.algos.data.schema",
    "collate_fn": "verl.algos.data.collate",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'verl.algos.data' has no attribute {name!r}")
