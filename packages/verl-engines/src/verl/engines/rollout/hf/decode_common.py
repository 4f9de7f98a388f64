"""What every decode path of the hf engine shares: its fixed inputs, its outputs and its measurements."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DecodeSettings:
    """The model-independent constants of a decode."""

    pad_token_id: int
    eos_token_ids: tuple[int, ...]
    device: torch.device
    #: Decode the n samples of a prompt against one copy of its keys and values (``shared_prefix``): True
    #: wherever a micro-batch allows it, None where its prompts are long enough to pay, False never.
    shared_prefix: bool | None = False


@dataclass
class DecodeStats:
    """Where one micro-batch's time went (summed over micro-batches into the rollout's metrics)."""

    prefill_s: float = 0.0
    decode_s: float = 0.0
    #: Time of compiling the decode step (the first call of each new shape; 0 when not compiled).
    compile_s: float = 0.0
    #: Forward calls after the prefill, and the rows they carried in total (rows drop as samples finish).
    steps: int = 0
    row_steps: int = 0
    #: Tokens the prefill computed (left padding trimmed, each prompt once) and the rows it served.
    prefill_tokens: int = 0
    #: Rows decoded against one copy of their prompt's keys and values (``shared_prefix``).
    shared_prefix_rows: int = 0

    def add(self, other: DecodeStats) -> None:
        for name in vars(self):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class DecodeOutput:
    """Per row of the micro-batch, on the host: response ids [rows, T] (pad after the end), lengths
    [rows] (eos/stop included) and the sampled tokens' log-probs [rows, T] (0 after the end)."""

    tokens: torch.Tensor
    lengths: torch.Tensor
    logprobs: torch.Tensor
    stats: DecodeStats
