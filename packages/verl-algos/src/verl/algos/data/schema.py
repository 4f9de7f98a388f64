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
    if FORMATS[ext] == "parquet" and _parquet_rows(path) == 0:  # datasets fails on these with a cryptic error
        raise DatasetSchemaError(f"{path}: the file has no rows; it must hold at least one row")
    try:
        if cache_dir is not None:
            table = datasets.load_dataset(FORMATS[ext], data_files=path, split="train", cache_dir=cache_dir)
        else:
            with tempfile.TemporaryDirectory(prefix="verl-data-") as scratch:
                table = datasets.load_dataset(
                    FORMATS[ext], data_files=path, split="train", cache_dir=scratch, keep_in_memory=True
                )
    except Exception as e:  # datasets wraps parser errors in generic exceptions; say which file it was
        cause = _parser_error(e)
        raise DatasetSchemaError(
            f"{path}: could not be read as {FORMATS[ext]}: {type(cause).__name__}: {cause}. Is the file complete, "
            "and in verl's schema (one JSON object per line for jsonl)?"
        ) from e
    if len(table) == 0:
        raise DatasetSchemaError(f"{path}: the file has no rows; it must hold at least one row")
    return table


MESSAGES_EXAMPLE = "[{'role': 'user', 'content': '...'}]"


def _parquet_rows(path: str) -> int | None:
    """The row count in a parquet file's footer (None if the footer is unreadable: datasets reports it)."""
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except (pa.ArrowException, OSError):
        return None


def _parser_error(error: BaseException) -> BaseException:
    """The parser's own error under ``datasets``' generic wrappers (it names the line or row at fault)."""
    chain = error
    while chain is not None:
        if not type(chain).__module__.startswith("datasets"):
            return chain
        chain = chain.__cause__ or chain.__context__
    return error


def _is_messages_type(t: pa.DataType) -> bool:
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return False
    item = t.value_type
    if not pa.types.is_struct(item):
        return False
    names = {item.field(i).name for i in range(item.num_fields)}
    return {"role", "content"} <= names


def _is_mixed(t: pa.DataType) -> bool:
    """``datasets`` stores a jsonl column whose rows disagree on the type as JSON values: the row
    checks then find the row at fault."""
    return isinstance(t, pa.BaseExtensionType)


def _show(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def validate_columns(table, path: str, prompt_key: str = "prompt", nested_prompt: bool = False) -> None:
    """Columns present in the file and, where every row has the same type, of the right type (checked
    on the arrow schema; the message shows row 0's value). Per-row problems are :func:`validate_row`'s.
    ``nested_prompt``: the prompt lies inside the ``prompt_key`` column (verl's ``prompt_dict_keys``), so
    that column's own type is not checked here."""
    schema = table.data.schema
    names = set(schema.names)
    missing = [c for c in (prompt_key, *REQUIRED_COLUMNS) if c not in names]
    if missing:
        raise DatasetSchemaError(
            f"{path}, row 0: missing column(s) {missing} (no row has them); the file has {sorted(names)}. "
            f"verl's schema needs {[prompt_key, *REQUIRED_COLUMNS]} (and optionally 'ability', 'extra_info')"
            + ("; data.prompt_key names the prompt column" if prompt_key in missing else "")
        )

    def first(column: str) -> str:
        return _show(table[0][column])

    prompt_type = schema.field(prompt_key).type
    if not nested_prompt and not _is_mixed(prompt_type) and not _is_messages_type(prompt_type):
        raise DatasetSchemaError(
            f"{path}, row 0: column {prompt_key!r} has type {prompt_type} in every row (row 0: {first(prompt_key)}); "
            f"expected a list of chat messages {MESSAGES_EXAMPLE}"
        )
    source_type = schema.field("data_source").type
    if not (pa.types.is_string(source_type) or pa.types.is_large_string(source_type) or _is_mixed(source_type)):
        raise DatasetSchemaError(
            f"{path}, row 0: column 'data_source' has type {source_type} (row 0: {first('data_source')}); "
            "expected a string naming the task (it picks the reward function)"
        )
    reward_type = schema.field("reward_model").type
    if _is_mixed(reward_type):
        return
    if not pa.types.is_struct(reward_type) or reward_type.get_field_index("ground_truth") < 0:
        raise DatasetSchemaError(
            f"{path}, row 0: column 'reward_model' has type {reward_type} (row 0: {first('reward_model')}); expected "
            "a dict with a 'ground_truth' key (reward_model.ground_truth: the reference answer)"
        )
    if "extra_info" in names:
        extra_type = schema.field("extra_info").type
        if not (pa.types.is_struct(extra_type) or pa.types.is_null(extra_type) or _is_mixed(extra_type)):
            raise DatasetSchemaError(f"{path}, row 0: column 'extra_info' has type {extra_type}; expected a dict")


def _prompt_problem(messages: Any, prompt_key: str) -> str | None:
    if messages is None:
        return f"column {prompt_key!r} is missing (null); expected a list of chat messages {MESSAGES_EXAMPLE}"
    if isinstance(messages, str):
        return (
            f"column {prompt_key!r} is a string ({_show(messages)}), not a list of chat messages; write it as "
            f"[{{'role': 'user', 'content': <the text>}}]"
        )
    if isinstance(messages, dict):
        return (
            f"column {prompt_key!r} is a single dict ({_show(messages)}), not a list of chat messages; wrap it "
            "in a list"
        )
    if not isinstance(messages, list):
        return (
            f"column {prompt_key!r} is {_show(messages)} (type {type(messages).__name__}); expected a list of chat "
            f"messages {MESSAGES_EXAMPLE}"
        )
    if not messages:
        return f"column {prompt_key!r} is empty; expected at least one chat message"
    for j, message in enumerate(messages):
        if (
            not isinstance(message, dict)
            or not isinstance(message.get("role"), str)
            or not isinstance(message.get("content"), str)
        ):
            return f"column {prompt_key!r}, message {j} needs string 'role' and 'content', got {_show(message)}"
    return None


def validate_row(row: dict[str, Any], path: str, row_index: int, prompt_key: str = "prompt") -> None:
    """Value checks of one row (nulls, types that vary between jsonl rows, empty prompts, message fields).
    Every message starts with ``<file>, row <i>:`` and names the column."""
    where = f"{path}, row {row_index}"
    problem = _prompt_problem(row.get(prompt_key), prompt_key)
    if problem:
        raise DatasetSchemaError(f"{where}: {problem}")
    if not isinstance(row.get("data_source"), str) or not row["data_source"]:
        raise DatasetSchemaError(
            f"{where}: column 'data_source' is {_show(row.get('data_source'))}; expected a non-empty string"
        )
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, dict):
        raise DatasetSchemaError(
            f"{where}: column 'reward_model' is {_show(reward_model)}; expected a dict with a non-null 'ground_truth'"
        )
    if reward_model.get("ground_truth") is None:
        raise DatasetSchemaError(
            f"{where}: column 'reward_model' has no 'ground_truth' (reward_model.ground_truth is missing or null: "
            f"{_show(reward_model)}); every row needs the reference answer its responses are scored against"
        )
