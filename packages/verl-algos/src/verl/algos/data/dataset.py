"""The RL prompt dataset: verl's parquet/jsonl schema in, left-padded prompt tensors out."""

from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

from verl.algos.data.schema import DatasetSchemaError, load_table, validate_columns, validate_row

logger = logging.getLogger(__name__)

TRUNCATION_MODES = ("error", "left", "right", "middle")


class RLHFDataset(Dataset):
    """Prompts for RL rollouts (verl's ``RLHFDataset``).

    Each prompt's messages go through the tokenizer's chat template with
    ``add_generation_prompt=True``. Prompts longer than ``max_prompt_length`` tokens are dropped and
    counted (``filter_overlong_prompts=True``, the count in :attr:`num_filtered`), or else handled by
    ``truncation``: ``error`` (raised here, before training starts, naming the file and row),
    ``left`` (keep the end), ``right`` (keep the start) or ``middle`` (keep both ends).

    A tokenizer without a chat template is an error, unless ``plain_prompt_fallback=True``
    (``data.plain_prompt_fallback``): the message contents are then joined by blank lines into a
    plain-text prompt. Every row is validated here, before training, so a bad row late in a file fails
    the run before it starts; each error names the file, the row and the column.

    Items: ``input_ids``, ``attention_mask``, ``position_ids`` (LongTensors of ``max_prompt_length``,
    left-padded), ``raw_prompt_ids`` (the unpadded ids), ``data_source``, ``reward_model``,
    ``extra_info``, ``ability``, ``index`` (``extra_info.index`` when present, else the row number),
    ``raw_prompt`` (the messages) with ``return_raw_chat=True``, and ``agent_name`` where the row has one
    (verl's column naming the agent loop of a prompt). Use
    :func:`verl.algos.data.collate.collate_fn` to batch them into a DataProto.
    """

    def __init__(
        self,
        data_files: str | os.PathLike | Sequence[str | os.PathLike],
        tokenizer: Any,
        *,
        max_prompt_length: int = 1024,
        prompt_key: str = "prompt",
        prompt_dict_keys: Sequence[str] = (),
        filter_overlong_prompts: bool = True,
        truncation: str = "error",
        return_raw_chat: bool = False,
        plain_prompt_fallback: bool = False,
        apply_chat_template_kwargs: dict[str, Any] | None = None,
        max_samples: int | None = None,
        cache_dir: str | None = None,
    ):
        if truncation not in TRUNCATION_MODES:
            raise ValueError(f"data.truncation={truncation!r}; choose one of {list(TRUNCATION_MODES)}")
        if max_prompt_length <= 0:
            raise ValueError(f"data.max_prompt_length={max_prompt_length} must be positive")
        files = [data_files] if isinstance(data_files, (str, os.PathLike)) else list(data_files)
        if not files:
            raise ValueError("no data files given (data.train_files / data.val_files)")
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.prompt_key = prompt_key
        self.prompt_dict_keys = list(prompt_dict_keys)
        self.truncation = truncation
        self.return_raw_chat = return_raw_chat
        self.plain_prompt_fallback = plain_prompt_fallback
        self.chat_template_kwargs = dict(apply_chat_template_kwargs or {})
        self.pad_token_id = self._pad_token_id(tokenizer)
        self._check_chat_template()

        self._load_tables(files, cache_dir)
        kept = self._prompts_within_limit(filter_overlong_prompts)
        if max_samples is not None and max_samples >= 0:
            kept = kept[:max_samples]
        self.indices = kept

    def _load_tables(self, files: list, cache_dir: str | None) -> None:
        self.files = [os.fspath(f) for f in files]
        self.tables = []
        for path in self.files:
            table = load_table(path, cache_dir)
            validate_columns(table, path, self.prompt_key, nested_prompt=bool(self.prompt_dict_keys))
            self.tables.append(table)
        # Rows are addressed as (file number, row in file), so errors can always name the file.
        self.offsets = [0]
        for table in self.tables:
            self.offsets.append(self.offsets[-1] + len(table))

    def _prompts_within_limit(self, filter_overlong_prompts: bool) -> list[int]:
        """Tokenizes every prompt; the rows kept: all, or those within max_prompt_length when overlong
        ones are filtered. Overlong prompts with truncation=error, or nothing left, are errors."""
        max_prompt_length = self.max_prompt_length
        self._prompt_ids: list[list[int]] = []
        kept: list[int] = []
        overlong: list[int] = []
        for flat in range(self.offsets[-1]):
            ids = self._tokenize(self.prompt_messages(self._row(flat)))
            self._prompt_ids.append(ids)
            (overlong if len(ids) > max_prompt_length else kept).append(flat)
        self.num_filtered = 0
        if overlong and filter_overlong_prompts:
            self.num_filtered = len(overlong)
            logger.warning(
                "filtered %d of %d prompts longer than data.max_prompt_length=%d tokens",
                len(overlong),
                self.offsets[-1],
                max_prompt_length,
            )
        elif overlong and self.truncation == "error":
            path, local = self._locate(overlong[0])
            raise DatasetSchemaError(
                f"{path}, row {local}: the prompt has {len(self._prompt_ids[overlong[0]])} tokens, more than "
                f"data.max_prompt_length={max_prompt_length} ({len(overlong)} of {self.offsets[-1]} prompts are too long). Set "
                "data.filter_overlong_prompts=true to drop them, data.truncation=left|right|middle to cut them, "
                "or raise data.max_prompt_length."
            )
        else:
            kept = list(range(self.offsets[-1]))
        if not kept:
            shortest = min(len(ids) for ids in self._prompt_ids)
            raise DatasetSchemaError(
                f"{', '.join(self.files)}: empty after filtering: all {len(overlong)} prompts are longer than "
                f"data.max_prompt_length={max_prompt_length} tokens (the shortest has {shortest}). Raise "
                f"data.max_prompt_length to at least {shortest}, or keep the prompts and cut them with "
                "data.filter_overlong_prompts=false and data.truncation=left|right|middle"
            )
        return kept

    # -- setup helpers ------------------------------------------------------------------------------
    @staticmethod
    def _pad_token_id(tokenizer: Any) -> int:
        pad = getattr(tokenizer, "pad_token_id", None)
        if pad is None:
            pad = getattr(tokenizer, "eos_token_id", None)
        if pad is None:
            raise ValueError("the tokenizer has neither a pad token nor an eos token to pad prompts with")
        return int(pad)

    def _check_chat_template(self) -> None:
        if getattr(self.tokenizer, "chat_template", None) or self.plain_prompt_fallback:
            return
        raise ValueError(
            f"the tokenizer ({type(self.tokenizer).__name__}, {getattr(self.tokenizer, 'name_or_path', '')!r}) has no "
            "chat template, so the chat-formatted prompts of the data cannot be rendered. Set one with "
            "actor_rollout_ref.model.custom_chat_template=<a Jinja template or the path of a .jinja file>, use an "
            "instruct/chat model's tokenizer (actor_rollout_ref.model.tokenizer_path), or set "
            "data.plain_prompt_fallback=true to send the message contents as raw text prompts."
        )

    def _locate(self, flat: int) -> tuple[str, int]:
        file_no = bisect.bisect_right(self.offsets, flat) - 1
        return self.files[file_no], flat - self.offsets[file_no]

    def _row(self, flat: int) -> dict[str, Any]:
        file_no = bisect.bisect_right(self.offsets, flat) - 1
        local = flat - self.offsets[file_no]
        row = self.tables[file_no][local]
        checked = {**row, self.prompt_key: self.prompt_messages(row)} if self.prompt_dict_keys else row
        validate_row(checked, self.files[file_no], local, self.prompt_key)
        return row

    def prompt_messages(self, row: dict[str, Any]) -> Any:
        """The row's chat messages: ``row[prompt_key]``, or with verl's ``prompt_dict_keys``
        ``row[prompt_key][k1][k2]...``, where a plain string is the user's message."""
        value = row.get(self.prompt_key)
        for key in self.prompt_dict_keys:
            value = value.get(key) if isinstance(value, dict) else None
        if self.prompt_dict_keys and isinstance(value, str):
            value = [{"role": "user", "content": value}]
        return value

    def render_prompt(self, messages: list[dict[str, str]]) -> str:
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, **self.chat_template_kwargs
            )
        return "\n\n".join(m["content"] for m in messages)

    def _tokenize(self, messages: list[dict[str, str]]) -> list[int]:
        return list(self.tokenizer(self.render_prompt(messages), add_special_tokens=False)["input_ids"])

    def _fit(self, ids: list[int]) -> list[int]:
        limit = self.max_prompt_length
        if len(ids) <= limit:
            return ids
        if self.truncation == "left":
            return ids[-limit:]
        if self.truncation == "right":
            return ids[:limit]
        if self.truncation == "middle":
            head = limit // 2
            return ids[:head] + ids[len(ids) - (limit - head) :]
        raise AssertionError("overlong prompts are filtered or rejected at construction")

    # -- Dataset ------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.indices)

    def source_rows(self) -> Iterator[tuple[str, int, dict[str, Any]]]:
        """(file, row in file, validated row) of every kept prompt: for checks that must name the row."""
        for flat in self.indices:
            path, local = self._locate(flat)
            yield path, local, self._row(flat)

    def raw_row(self, item: int) -> dict[str, Any]:
        """The validated source row of item ``item`` (after filtering), with all its columns."""
        return self._row(self.indices[item])

    def __getitem__(self, item: int) -> dict[str, Any]:
        flat = self.indices[item]
        row = self._row(flat)
        ids = self._fit(self._prompt_ids[flat])
        pad = self.max_prompt_length - len(ids)
        input_ids = torch.tensor([self.pad_token_id] * pad + ids, dtype=torch.long)
        attention_mask = torch.tensor([0] * pad + [1] * len(ids), dtype=torch.long)
        position_ids = torch.clamp(attention_mask.cumsum(-1) - 1, min=0)
        extra_info = row.get("extra_info") or {}
        out = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "raw_prompt_ids": ids,
            "data_source": row["data_source"],
            "reward_model": row["reward_model"],
            "extra_info": extra_info,
            "ability": row.get("ability"),
            "index": extra_info.get("index", flat) if isinstance(extra_info, dict) else flat,
        }
        if self.return_raw_chat:
            out["raw_prompt"] = self.prompt_messages(row)
        if row.get("agent_name") is not None:  # verl's column: which agent loop rolls this prompt out
            out["agent_name"] = row["agent_name"]
        return out


def load_rl_dataset(config_key: str, data_files: Any, tokenizer: Any, **kwargs: Any) -> RLHFDataset:
    """:class:`RLHFDataset` whose data errors also name the config key the files came from
    (``data.train_files`` or ``data.val_files``), so an empty or broken validation file is told apart."""
    try:
        return RLHFDataset(data_files, tokenizer, **kwargs)
    except DatasetSchemaError as e:
        raise DatasetSchemaError(f"{config_key}: {e}") from None
