"""verl's RL dataset schema, loading of parquet/jsonl files through ``datasets``, and validation.

One row per prompt::

    data_source   str                      picks the reward function ("openai/gsm8k", "arithmetic", ...)
    prompt        list of {"role", "content"} chat messages (the column name is data.prompt_key)
    ability       str (optional)           e.g. "math"
    reward_model  {"ground_truth": ..., "style": "rule"}
    extra_info    dict (optional)          passed to the reward function; "index" identifies the row

Every error names the file, and the column (and row) at fault.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import pyarrow as pa

REQUIRED_COLUMNS = ("data_source", "reward_model")
FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}


class DatasetSchemaError(ValueError):
    """A data file that does not follow verl's schema."""


def load_table(path: str | os.PathLike, cache_dir: str | None = None):
    """A ``datasets.Dataset`` read from one local parquet or jsonl file (nothing is downloaded).

    With ``cache_dir`` the table is memory-mapped from an arrow cache there (for data larger than
    memory); without, it is read into memory through a throwaway cache, leaving nothing behind."""
    import datasets

    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise DatasetSchemaError(f"{path}: unsupported file type {ext!r}; use one of {sorted(FORMATS)}")
    if not os.path.isfile(path):
        raise DatasetSchemaError(f"{path}: no such data file")
    if os.path.getsize(path) == 0:
        raise DatasetSchemaError(f"{path}: the file is empty (0 bytes); it must hold at least one row")
    try:
        if cache_dir is not None:
            table = datasets.load_dataset(FORMATS[ext], data_files=path, split="train", cache_dir=cache_dir)
        else:
            with tempfile.TemporaryDirectory(prefix="verl-data-") as scratch:
                table = datasets.load_dataset(
                    FORMATS[ext], data_files=path, split="train", cache_dir=scratch, keep_in_memory=True
                )
    except Exception as e:  # datasets wraps parser errors in generic exceptions; say which file it was
        raise DatasetSchemaError(f"{path}: could not be read as {FORMATS[ext]}: {type(e).__name__}: {e}") from e
    if len(table) == 0:
        raise DatasetSchemaError(f"{path}: the file has no rows")
    return table


def _is_messages_type(t: pa.DataType) -> bool:
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return False
    item = t.value_type
    if not pa.types.is_struct(item):
        return False
    names = {item.field(i).name for i in range(item.num_fields)}
    return {"role", "content"} <= names


def validate_columns(table, path: str, prompt_key: str = "prompt") -> None:
    """Column presence and types, checked on the file's arrow schema."""
    schema = table.data.schema
    names = set(schema.names)
    missing = [c for c in (prompt_key, *REQUIRED_COLUMNS) if c not in names]
    if missing:
        raise DatasetSchemaError(
            f"{path}: missing column(s) {missing}; the file has {sorted(names)}. verl's schema needs "
            f"{[prompt_key, *REQUIRED_COLUMNS]} (and optionally 'ability', 'extra_info')"
        )
    prompt_type = schema.field(prompt_key).type
    if not _is_messages_type(prompt_type):
        raise DatasetSchemaError(
            f"{path}: column {prompt_key!r} has type {prompt_type}; expected a list of chat messages "
            "[{'role': 'user', 'content': '...'}]"
        )
    source_type = schema.field("data_source").type
    if not (pa.types.is_string(source_type) or pa.types.is_large_string(source_type)):
        raise DatasetSchemaError(f"{path}: column 'data_source' has type {source_type}; expected a string")
    reward_type = schema.field("reward_model").type
    if not pa.types.is_struct(reward_type) or reward_type.get_field_index("ground_truth") < 0:
        raise DatasetSchemaError(
            f"{path}: column 'reward_model' has type {reward_type}; expected a dict with a 'ground_truth' key"
        )
    if "extra_info" in names:
        extra_type = schema.field("extra_info").type
        if not (pa.types.is_struct(extra_type) or pa.types.is_null(extra_type)):
            raise DatasetSchemaError(f"{path}: column 'extra_info' has type {extra_type}; expected a dict")


def validate_row(row: dict[str, Any], path: str, row_index: int, prompt_key: str = "prompt") -> None:
    """Value checks arrow types cannot express (nulls, empty prompts, message fields)."""
    where = f"{path}, row {row_index}"
    messages = row.get(prompt_key)
    if not messages:
        raise DatasetSchemaError(f"{where}: column {prompt_key!r} is empty; expected at least one chat message")
    for j, message in enumerate(messages):
        if not isinstance(message.get("role"), str) or not isinstance(message.get("content"), str):
            raise DatasetSchemaError(
                f"{where}: column {prompt_key!r}, message {j} needs string 'role' and 'content', got {message!r}"
            )
    if not isinstance(row.get("data_source"), str):
        raise DatasetSchemaError(f"{where}: column 'data_source' is {row.get('data_source')!r}; expected a string")
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, dict) or reward_model.get("ground_truth") is None:
        raise DatasetSchemaError(
            f"{where}: column 'reward_model' is {reward_model!r}; expected a dict with a non-null 'ground_truth'"
        )
