"""Checking a Hugging Face model folder on disk before any worker tries to load it.

A missing or half-copied folder otherwise surfaces minutes later, inside a Ray worker, as a
transformers or safetensors traceback. These checks read only ``config.json``, the index files and the
first bytes of each weight file (never the tensors), so they are cheap enough to run before Ray starts,
and each error names the folder, the file at fault and what to do.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

#: The weight files ``from_pretrained`` looks for (no variants), in its order of preference.
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_BIN = "pytorch_model.bin"
TORCH_BIN_INDEX = "pytorch_model.bin.index.json"
WEIGHT_FILES = (SAFETENSORS, SAFETENSORS_INDEX, TORCH_BIN, TORCH_BIN_INDEX)

#: Any of these makes a folder loadable by ``AutoTokenizer`` (fast, sentencepiece or BPE vocab files).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")

#: No real safetensors header is this large; a larger length field means the file is not safetensors.
_MAX_HEADER_BYTES = 100 * 1024 * 1024

_RECOPY = "copy the model folder again (or re-export it with save_pretrained)"


class ModelFolderError(ValueError):
    """A model folder that cannot be loaded: missing, incomplete or corrupt files."""


def check_model_files(path: str | Path) -> None:
    """``path`` is a folder with a readable ``config.json`` and whole weight files; else
    :class:`ModelFolderError` naming the folder and the file."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ModelFolderError(f"model folder {str(folder)!r} does not exist (or is not a folder)")
    _check_config(folder)
    for weights in _weight_files(folder):
        if weights.suffix == ".safetensors":
            _check_safetensors(weights)
        else:
            _check_torch_file(weights)


def check_tokenizer_files(path: str | Path, hint: str = "") -> None:
    """``path`` holds tokenizer files. Without them ``AutoTokenizer`` quietly builds an empty
    tokenizer that turns every prompt into zero tokens, so this is an error."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ModelFolderError(f"tokenizer folder {str(folder)!r} does not exist (or is not a folder)")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelFolderError(
            f"{folder} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}); copy the tokenizer's files "
            f"into it{hint}"
        )


def _check_config(folder: Path) -> None:
    config_file = folder / "config.json"
    if not config_file.is_file():
        present = sorted(p.name for p in folder.iterdir())[:10]
        raise ModelFolderError(
            f"{folder} has no config.json, so it is not a Hugging Face model folder (it holds: "
            f"{', '.join(present) or 'nothing'}); give the folder that save_pretrained wrote"
        )
    try:
        config = json.loads(config_file.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFolderError(f"{config_file} is not valid JSON ({e}); the file is corrupt: {_RECOPY}") from None
    if not isinstance(config, dict):
        raise ModelFolderError(
            f"{config_file} holds a JSON {type(config).__name__}, not an object of model settings; {_RECOPY}"
        )


def _weight_files(folder: Path) -> list[Path]:
    """The weight files ``from_pretrained`` would read: the single file, or every shard of the index."""
    for index_name, single_name in ((SAFETENSORS_INDEX, SAFETENSORS), (TORCH_BIN_INDEX, TORCH_BIN)):
        if (folder / single_name).is_file():
            return [folder / single_name]
        if (folder / index_name).is_file():
            return _shards(folder / index_name)
    raise ModelFolderError(
        f"{folder} has config.json but no weights (none of {', '.join(WEIGHT_FILES)}); the folder is incomplete: "
        f"{_RECOPY}"
    )


def _shards(index_file: Path) -> list[Path]:
    try:
        weight_map = json.loads(index_file.read_bytes())["weight_map"]
        names = sorted(set(weight_map.values()))
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise ModelFolderError(
            f"{index_file} is not a valid weight index (a JSON object with a 'weight_map'): "
            f"{type(e).__name__}: {e}; {_RECOPY}"
        ) from None
    missing = [name for name in names if not (index_file.parent / name).is_file()]
    if missing:
        raise ModelFolderError(
            f"{index_file.parent}: {index_file.name} lists weight shard(s) that are missing: {', '.join(missing)}; "
            f"the folder is incomplete: {_RECOPY}"
        )
    return [index_file.parent / name for name in names]


def _check_safetensors(file: Path) -> None:
    """The header parses and the tensors it describes end exactly where the file does."""
    size = file.stat().st_size
    with open(file, "rb") as fh:
        length_field = fh.read(8)
        header_len = int.from_bytes(length_field, "little") if len(length_field) == 8 else -1
        if header_len < 2 or header_len > min(size - 8, _MAX_HEADER_BYTES):
            raise ModelFolderError(
                f"{file} is not a valid safetensors file (its {size} bytes do not start with a header length "
                f"that fits the file): the file is truncated or corrupt; {_RECOPY}"
            )
        try:
            header = json.loads(fh.read(header_len))
            ends = [int(entry["data_offsets"][1]) for key, entry in header.items() if key != "__metadata__"]
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError, IndexError, AttributeError):
            raise ModelFolderError(
                f"{file} has a corrupt safetensors header (not the JSON table of tensors it should be); {_RECOPY}"
            ) from None
    expected = 8 + header_len + max(ends, default=0)
    if size != expected:
        what = "truncated" if size < expected else "longer than its header says (corrupt)"
        raise ModelFolderError(f"{file} is {what}: it has {size} bytes but its header describes {expected}; {_RECOPY}")


def _check_torch_file(file: Path) -> None:
    """``torch.save`` writes a zip archive (its directory is at the end, so a truncated one fails
    ``is_zipfile``); a legacy file is a pickle, whose first byte is the protocol marker 0x80."""
    if zipfile.is_zipfile(file):
        return
    with open(file, "rb") as fh:
        first = fh.read(1)
    if first != b"\x80":
        raise ModelFolderError(
            f"{file} is not a PyTorch checkpoint (neither a zip archive nor a pickle): the file is truncated or "
            f"corrupt; {_RECOPY}"
        )
