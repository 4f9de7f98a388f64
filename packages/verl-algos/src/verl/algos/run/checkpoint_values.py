"""The values in a checkpoint: every floating-point tensor of its safetensors files must be finite.

A checkpoint full of NaN or inf (weights that diverged, an optimizer state that overflowed) must never be
marked complete: a resumed run or an export would silently carry the damage on. Tensors are read through
``safe_open`` (memory-mapped; the files were just written, so their pages are usually still cached) one at a
time, so a large checkpoint is never held in memory at once.
"""

from __future__ import annotations

import os
from pathlib import Path


def nonfinite_tensors(folder: str | Path) -> list[str]:
    """``"<file>: <tensor> (<n> of <size> values are NaN/inf)"`` for each tensor under ``folder`` with a
    non-finite value (and a phrase for each safetensors file that cannot be read); empty when every value is
    finite."""
    import torch
    from safetensors import safe_open

    folder = Path(folder)
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for name in sorted(filenames):
            if not name.endswith(".safetensors"):
                continue
            path = Path(dirpath, name)
            try:
                with safe_open(str(path), framework="pt") as handle:
                    for key in handle.keys():
                        tensor = handle.get_tensor(key)
                        if not tensor.is_floating_point() and not tensor.is_complex():
                            continue
                        bad = int((~torch.isfinite(tensor)).sum())
                        if bad:
                            found.append(
                                f"{path.relative_to(folder)}: {key} ({bad} of {tensor.numel()} values are NaN/inf)"
                            )
            except Exception as exc:  # safetensors raises its own error type for a torn or foreign file
                found.append(f"{path.relative_to(folder)} is not a readable safetensors file ({exc})")
    return found
