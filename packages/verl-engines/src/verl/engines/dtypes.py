"""dtype names as they appear in configs ("fp32", "bf16", ...)."""

from __future__ import annotations

import torch

_DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


def parse_dtype(name: str, what: str) -> torch.dtype:
    """The torch dtype called ``name``; ``what`` names the config key in the error."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"{what}={name!r} is not a dtype; use one of {sorted(_DTYPES)}") from None
