"""The eos ids and the pad id a rollout engine stops on and pads with, resolved the same way by every
engine so that their outputs have the same layout."""

from __future__ import annotations

from typing import Any


def resolve_special_tokens(
    model_path: str,
    *,
    eos_override: int | list[int] | None,
    pad_override: int | None,
    tokenizer: Any,
    model_eos: int | list[int] | None,
    model_pad: int | None,
) -> tuple[list[int], int]:
    """(eos ids, pad id). eos: the config's override, then the model's generation_config.json, the
    tokenizer, the model config. pad: the override, the tokenizer, generation_config.json, the model
    config, else the first eos id."""
    from transformers import GenerationConfig

    try:
        generation = GenerationConfig.from_pretrained(model_path)
    except OSError:
        generation = None
    candidates = [
        eos_override,
        getattr(generation, "eos_token_id", None),
        getattr(tokenizer, "eos_token_id", None),
        model_eos,
    ]
    eos = next((c for c in candidates if c is not None), None)
    if eos is None:
        raise ValueError(
            f"no eos token id known for {model_path!r}: set rollout eos_token_id, or add it to the "
            "model's generation_config.json / tokenizer"
        )
    eos_ids = [eos] if isinstance(eos, int) else list(eos)
    pads = [
        pad_override,
        getattr(tokenizer, "pad_token_id", None),
        getattr(generation, "pad_token_id", None),
        model_pad,
    ]
    pad = next((p for p in pads if p is not None), eos_ids[0])
    return eos_ids, int(pad)
