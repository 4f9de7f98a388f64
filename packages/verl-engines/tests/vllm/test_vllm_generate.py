"""The vllm rollout engine on CPU: the same output batch as the hf engine, sampling controls, log-probs,
eos and stop strings, and the honest no-op sleep."""

import pytest
import torch
from transformers import AutoModelForCausalLM
from vllm_test_helpers import TEXTS, prompts_batch, vllm_config

from verl.core.engine import SamplingParams
from verl.engines.rollout.hf import HFRolloutConfig, HFRolloutEngine

pytestmark = pytest.mark.vllm

LAYOUT_KEYS = ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask")


@pytest.fixture(scope="module")
def engine(qwen2_engine):
    return qwen2_engine


@pytest.fixture(scope="module")
def hf_engine(qwen2_model):
    return HFRolloutEngine(HFRolloutConfig(model_path=qwen2_model))


def greedy(max_new_tokens=10, **kw):
    return SamplingParams(do_sample=False, max_new_tokens=max_new_tokens, **kw)


def test_greedy_output_is_the_hf_engines_batch(engine, hf_engine, qwen2_model):
    prompts = prompts_batch(qwen2_model)
    ours = engine.generate(prompts, greedy(logprobs=True))
    theirs = hf_engine.generate(prompts, greedy(logprobs=True))
    for key in LAYOUT_KEYS:
        assert torch.equal(ours.batch[key], theirs.batch[key]), key
    torch.testing.assert_close(ours.batch["rollout_log_probs"], theirs.batch["rollout_log_probs"], atol=1e-4, rtol=0)
    assert list(ours.non_tensor_batch["text"]) == TEXTS and ours.meta_info["step"] == 3


def test_n_samples_are_interleaved_and_laid_out_like_hf(engine, qwen2_model):
    prompts = prompts_batch(qwen2_model)
    out = engine.generate(prompts, SamplingParams(n=3, temperature=0.9, max_new_tokens=8, logprobs=True, seed=0))
    b = out.batch
    assert len(out) == 12 and b["responses"].shape == (12, 8)
    assert torch.equal(b["prompts"], prompts.batch["input_ids"].repeat_interleave(3, 0))
    assert list(out.non_tensor_batch["text"]) == [t for t in TEXTS for _ in range(3)]
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], 1))
    assert torch.equal(b["attention_mask"][:, -8:], b["response_mask"])
    assert torch.equal(b["position_ids"][:, -8], prompts.batch["position_ids"][:, -1].repeat_interleave(3) + 1)
    assert (b["rollout_log_probs"][b["response_mask"] == 0] == 0).all()
    assert (b["rollout_log_probs"][b["response_mask"] == 1] < 0).all()
    # pads only after each response's end
    lengths = b["response_mask"].sum(-1)
    for row, length in enumerate(lengths.tolist()):
        assert (b["responses"][row, length:] == engine.pad_token_id).all()


def test_sampled_log_probs_are_the_models_tempered_log_probs(engine, qwen2_model):
    prompts = prompts_batch(qwen2_model)
    out = engine.generate(prompts, SamplingParams(n=2, temperature=0.7, max_new_tokens=8, logprobs=True, seed=2))
    b = out.batch
    model = AutoModelForCausalLM.from_pretrained(qwen2_model, dtype=torch.float32)
    with torch.no_grad():
        logits = model(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]
        ).logits
    width = b["responses"].shape[1]
    expected = torch.log_softmax(logits[:, -width - 1 : -1].float() / 0.7, -1)
    expected = expected.gather(-1, b["responses"][..., None]).squeeze(-1) * b["response_mask"]
    torch.testing.assert_close(b["rollout_log_probs"], expected, atol=1e-4, rtol=0)


def test_seeds_give_distinct_streams_per_prompt_and_sample(engine, qwen2_model):
    prompts = prompts_batch(qwen2_model, ["the cat", "the cat"])  # the same prompt twice
    sampling = SamplingParams(n=2, max_new_tokens=8, seed=5)
    a = engine.generate(prompts, sampling).batch["responses"]
    assert torch.equal(a, engine.generate(prompts, sampling).batch["responses"])
    assert not torch.equal(
        a, engine.generate(prompts, SamplingParams(n=2, max_new_tokens=8, seed=6)).batch["responses"]
    )
    # four rows of the same prompt: four different random streams
    assert len({tuple(row.tolist()) for row in a}) == 4


def test_top_k_one_is_greedy(engine, qwen2_model):
    prompts = prompts_batch(qwen2_model)
    top1 = engine.generate(prompts, SamplingParams(max_new_tokens=8, top_k=1, seed=1)).batch["responses"]
    assert torch.equal(top1, engine.generate(prompts, greedy(8)).batch["responses"])


def test_eos_ends_a_response_and_is_included(qwen2_model, hf_engine, keep_alive):
    from verl.engines.rollout.vllm import VLLMRolloutEngine

    prompts = prompts_batch(qwen2_model)
    free = hf_engine.generate(prompts, greedy(10)).batch["responses"]
    third = int(free[0, 2])  # row 0's third greedy token becomes an eos
    eos_engine = VLLMRolloutEngine(vllm_config(qwen2_model, load_format="hf", eos_token_id=[third]))
    keep_alive(eos_engine)
    out = eos_engine.generate(prompts, greedy(10)).batch
    for row in range(len(TEXTS)):
        hits = (free[row] == third).nonzero().flatten()
        length = int(hits[0]) + 1 if len(hits) else 10
        assert int(out["response_mask"][row].sum()) == length
        assert torch.equal(out["responses"][row, :length], free[row, :length])
    assert int(out["response_mask"][0].sum()) == 3


def test_stop_string_ends_a_response_at_the_completing_token(engine, hf_engine, qwen2_model):
    prompts = prompts_batch(qwen2_model)
    free = hf_engine.generate(prompts, greedy(10)).batch["responses"]
    word = hf_engine.tokenizer.decode([int(free[0, 4])])
    stop = greedy(10, stop=[word])
    ours, theirs = engine.generate(prompts, stop).batch, hf_engine.generate(prompts, stop).batch
    assert int(ours["response_mask"][0].sum()) <= 5
    assert torch.equal(ours["response_mask"], theirs["response_mask"])
    assert torch.equal(ours["responses"], theirs["responses"])


def test_prompts_must_be_left_padded(engine, qwen2_model):
    prompts = prompts_batch(qwen2_model)
    prompts.batch["attention_mask"] = prompts.batch["attention_mask"].flip(-1)
    with pytest.raises(ValueError, match="left-padded"):
        engine.generate(prompts, greedy())


def test_sleep_is_reported_unavailable_on_cpu(engine, qwen2_model, caplog):
    assert engine.supports_sleep is False
    with caplog.at_level("INFO", logger="verl.engines.rollout.vllm.engine"):
        assert engine.sleep() is False and engine.wake_up() is False and engine.sleep() is False
    assert sum("no-ops" in r.getMessage() for r in caplog.records) == 1  # logged once per engine
    # and the engine keeps working
    prompts = prompts_batch(qwen2_model)
    assert len(engine.generate(prompts, greedy(4))) == len(TEXTS)


def test_building_an_engine_leaves_the_process_state_alone(qwen2_model, keep_alive, monkeypatch):
    import os
    import random

    from verl.engines.rollout.vllm import VLLMRolloutEngine

    threads = torch.get_num_threads()
    set_num_threads = torch.set_num_threads
    torch.manual_seed(123)
    random.seed(123)
    expected_torch, expected_py = torch.rand(3), random.random()
    torch.manual_seed(123)
    random.seed(123)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")  # the controller's; vLLM sets it to its TP size on CPU
    keep_alive(VLLMRolloutEngine(vllm_config(qwen2_model, seed=7)))
    assert os.environ["LOCAL_WORLD_SIZE"] == "3"
    assert torch.equal(torch.rand(3), expected_torch) and random.random() == expected_py
    assert torch.set_num_threads is set_num_threads and torch.get_num_threads() == threads
