"""Partial rollouts (``async_training.segments``): a batch generated a few tokens at a time on the real hf
rollout engine equals the one-call batch when the weights stay, and records which policy versions generated
each row, and each token, when they change between segments."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from verl.algos.async_training.segments import generate_in_segments
from verl.core.engine import SamplingParams
from verl.core.protocol import DataProto
from verl.engines.rollout.hf import HFRolloutConfig, HFRolloutEngine

TEXTS = ["What is 3 + 4?", "2 + 2 =", "Tell me about 17 + 25 and more", "9"]


def left_padded_prompts(model_path: str) -> DataProto:
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    rows = [tokenizer(text)["input_ids"] for text in TEXTS]
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id or 0, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        input_ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    return DataProto.from_dict(
        {"input_ids": input_ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)},
        non_tensors={"index": np.arange(len(rows))},
    )


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return HFRolloutEngine(HFRolloutConfig(model_path=tiny_model_dir, micro_batch_size=8))


def segmented(engine, prompts, sampling, segment_tokens, between=lambda: None, version=lambda: 0):
    return generate_in_segments(
        engine.generate,
        prompts,
        sampling,
        segment_tokens,
        list(engine.eos_token_ids),
        engine.pad_token_id,
        version,
        between,
    )


@pytest.mark.parametrize("segment_tokens", [1, 3, 16])
def test_greedy_segments_with_unchanged_weights_are_the_one_call_batch(engine, tiny_model_dir, segment_tokens):
    prompts = left_padded_prompts(tiny_model_dir)
    sampling = SamplingParams(n=2, do_sample=False, max_new_tokens=12, logprobs=True)
    whole = engine.generate(prompts, sampling)
    parts = segmented(engine, prompts, sampling, segment_tokens)
    for key in ("prompts", "responses", "response_mask", "attention_mask", "input_ids", "position_ids"):
        assert torch.equal(parts.batch[key], whole.batch[key]), key
    torch.testing.assert_close(parts.batch["rollout_log_probs"], whole.batch["rollout_log_probs"], atol=1e-4, rtol=0)
    assert list(parts.non_tensor_batch["index"]) == list(whole.non_tensor_batch["index"])
    assert (parts.non_tensor_batch["param_version_start"] == 0).all()
    versions = parts.batch["rollout_param_versions"]
    assert torch.equal(versions == 0, whole.batch["response_mask"].bool()) and (versions[versions != 0] == -1).all()


def test_a_push_between_segments_is_recorded_in_the_rows_that_spanned_it(engine, tiny_model_dir):
    prompts = left_padded_prompts(tiny_model_dir)
    sampling = SamplingParams(n=2, do_sample=True, temperature=1.0, max_new_tokens=10, logprobs=True, seed=3)
    versions = iter(range(100))
    current = {"v": next(versions)}

    def push():  # new weights between two segments (here: the same weights under a new version)
        current["v"] = next(versions)

    out = segmented(engine, prompts, sampling, 4, between=push, version=lambda: current["v"])
    start, end = out.non_tensor_batch["param_version_start"], out.non_tensor_batch["param_version_end"]
    lengths = out.batch["response_mask"].sum(-1)
    assert (start == 0).all()
    # a row longer than one segment (4 tokens) went on after a push, one longer than two after a second
    for i in range(len(out)):
        assert end[i] == (0 if lengths[i] <= 4 else 1 if lengths[i] <= 8 else 2), (i, int(lengths[i]), end[i])
    assert (end > 0).any(), "no row spanned a push: lengthen the responses"
    # which policy version generated each token: 4 tokens per segment, a new version per segment
    token_versions = out.batch["rollout_param_versions"]
    for i in range(len(out)):
        n = int(lengths[i])
        assert token_versions[i, :n].tolist() == [t // 4 for t in range(n)], i
        assert (token_versions[i, n:] == -1).all()
    assert out.batch["responses"].shape == (8, 10) and int(lengths.max()) <= 10
    assert ((out.batch["rollout_log_probs"] != 0) == out.batch["response_mask"].bool()).all()
