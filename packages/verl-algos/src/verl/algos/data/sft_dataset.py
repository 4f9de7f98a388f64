"""The SFT dataset: (prompt, response) pairs tokenized into the engines' layout.

Rows are read from parquet/jsonl through :class:`~verl.algos.data.RLHFDataset` (schema checks, chat
template, over-long filtering) and the response comes from ``response_key`` (dotted for nested fields,
as in verl's SFT examples: ``extra_info.answer``). An item is the layout the training engines read: the
prompt left-padded, the response (ending with eos) right-padded, ``response_mask`` over its tokens.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.algos.data.dataset import RLHFDataset
from verl.core.protocol import DataProto


def _lookup(row: dict[str, Any], dotted: str) -> Any:
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


class SFTDataset:
    def __init__(
        self,
        files: list[str],
        tokenizer: Any,
        *,
        prompt_key: str,
        response_key: str,
        max_prompt_length: int,
        max_response_length: int,
        max_samples: int | None = None,
        prompt_dict_keys: list[str] | None = None,
        response_dict_keys: list[str] | None = None,
        apply_chat_template_kwargs: dict[str, Any] | None = None,
    ):
        self.prompts = RLHFDataset(
            files,
            tokenizer,
            max_prompt_length=max_prompt_length,
            prompt_key=prompt_key,
            prompt_dict_keys=prompt_dict_keys or (),
            filter_overlong_prompts=True,
            max_samples=max_samples,
            apply_chat_template_kwargs=apply_chat_template_kwargs,
        )
        self.tokenizer = tokenizer
        # verl's response_dict_keys: row[response_key][k1][k2]..., the same as our dotted path
        self.response_key = ".".join([response_key, *(response_dict_keys or [])])
        self.max_response_length = max_response_length
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        item = self.prompts[index]
        row = self.prompts.raw_row(index)
        response = _lookup(row, self.response_key)
        if not isinstance(response, str) or not response:
            raise ValueError(
                f"SFT row {index}: data.response_key={self.response_key!r} holds {response!r}, not a non-empty "
                "string; point data.response_key at the target text (dotted for nested fields)"
            )
        ids = self.tokenizer(response, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        ids = ids[: self.max_response_length]
        response_ids = torch.full((self.max_response_length,), self.pad_id, dtype=torch.long)
        response_ids[: len(ids)] = torch.tensor(ids)
        response_mask = torch.zeros(self.max_response_length, dtype=torch.long)
        response_mask[: len(ids)] = 1
        attention = torch.cat([item["attention_mask"], response_mask])
        return {
            "input_ids": torch.cat([item["input_ids"], response_ids]),
            "attention_mask": attention,
            "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
            "responses": response_ids,
            "response_mask": response_mask,
        }


def sft_collate(items: list[dict[str, torch.Tensor]]) -> DataProto:
    return DataProto.from_dict({key: torch.stack([item[key] for item in items]) for key in items[0]})
