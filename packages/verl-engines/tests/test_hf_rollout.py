"""The hf rollout engine: output layout, eos/stop handling, sampling controls, log-probs, weights, sleep."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl.core.engine import SamplingParams
from verl.core.protocol import DataProto
from verl.engines.rollout.hf import HFRolloutConfig, HFRolloutEngine

TEXTS = ["hello world the cat", "a dog ran", "1 + 2 =", "the mat"]


def prompts_from(model_path, texts=TEXTS) -> DataProto:
    tok = AutoTokenizer.from_pretrained(model_path)
    enc = tok(texts, return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    return DataProto.from_dict(
        {"input_ids": enc["input_ids"], "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)},
        non_tensors={"text": texts},
        meta_info={"step": 7},
    )


@pytest.fixture(scope="module")
def rollout(tiny_model):
    return HFRolloutEngine(HFRolloutConfig(model_path=tiny_model, micro_batch_size=3))


def greedy(max_new_tokens=6, **kw):
    return SamplingParams(do_sample=False, max_new_tokens=max_new_tokens, **kw)


def test_output_layout_n_samples_interleaved(rollout, tiny_model):
    prompts = prompts_from(tiny_model)
    out = rollout.generate(prompts, SamplingParams(n=3, max_new_tokens=5, logprobs=True, seed=0))
    b = out.batch
    assert len(out) == 12 and b["responses"].shape == (12, 5) and b["prompts"].shape == (12, 4)
    assert torch.equal(b["prompts"], prompts.batch["input_ids"].repeat_interleave(3, 0))
    assert list(out.non_tensor_batch["text"]) == [t for t in TEXTS for _ in range(3)]
    assert out.meta_info["step"] == 7
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], 1))
    assert torch.equal(b["attention_mask"][:, -5:], b["response_mask"])
    # positions continue from each prompt's last position
    assert torch.equal(b["position_ids"][:, -5], prompts.batch["position_ids"][:, -1].repeat_interleave(3) + 1)
    assert (b["rollout_log_probs"][b["response_mask"] == 0] == 0).all()
    assert (b["rollout_log_probs"][b["response_mask"] == 1] < 0).all()


def test_eos_ends_a_response_and_is_included(tiny_model):
    prompts = prompts_from(tiny_model)
    free = HFRolloutEngine(HFRolloutConfig(model_path=tiny_model)).generate(prompts, greedy(8))
    third = int(free.batch["responses"][0, 2])  # make row 0's third greedy token the eos
    engine = HFRolloutEngine(HFRolloutConfig(model_path=tiny_model, eos_token_id=[third, 1]))
    out = engine.generate(prompts, greedy(8)).batch
    for row in range(len(TEXTS)):
        tokens = free.batch["responses"][row]
        hits = (tokens == third).nonzero().flatten()
        length = int(hits[0]) + 1 if len(hits) else 8
        assert int(out["response_mask"][row].sum()) == length
        assert torch.equal(out["responses"][row, :length], tokens[:length])
        assert (out["responses"][row, length:] == engine.pad_token_id).all()
    assert int(out["response_mask"][0].sum()) == 3


def test_stop_string_ends_a_response(rollout, tiny_model):
    prompts = prompts_from(tiny_model, TEXTS[:1])
    free = rollout.generate(prompts, greedy(8)).batch["responses"][0]
    word = rollout.tokenizer.convert_ids_to_tokens(int(free[3]))
    first = int((free == free[3]).nonzero()[0])
    out = rollout.generate(prompts, greedy(8, stop=[word])).batch
    assert int(out["response_mask"][0].sum()) == first + 1
    assert torch.equal(out["responses"][0, : first + 1], free[: first + 1])


def test_greedy_is_deterministic_and_independent_of_micro_batching(tiny_model):
    prompts = prompts_from(tiny_model)
    one = HFRolloutEngine(HFRolloutConfig(model_path=tiny_model, micro_batch_size=1)).generate(prompts, greedy())
    all_ = HFRolloutEngine(HFRolloutConfig(model_path=tiny_model, micro_batch_size=8)).generate(prompts, greedy())
    assert torch.equal(one.batch["responses"], all_.batch["responses"])


def test_seeds_and_top_k_one(rollout, tiny_model):
    prompts = prompts_from(tiny_model)
    a = rollout.generate(prompts, SamplingParams(n=2, max_new_tokens=6, seed=5)).batch["responses"]
    b = rollout.generate(prompts, SamplingParams(n=2, max_new_tokens=6, seed=5)).batch["responses"]
    c = rollout.generate(prompts, SamplingParams(n=2, max_new_tokens=6, seed=6)).batch["responses"]
    assert torch.equal(a, b) and not torch.equal(a, c)
    top1 = rollout.generate(prompts, SamplingParams(max_new_tokens=6, top_k=1, seed=1)).batch["responses"]
    assert torch.equal(top1, rollout.generate(prompts, greedy()).batch["responses"])


def test_rollout_log_probs_match_a_full_forward(rollout, tiny_model):
    prompts = prompts_from(tiny_model)
    out = rollout.generate(prompts, SamplingParams(n=2, temperature=0.7, max_new_tokens=6, logprobs=True, seed=2))
    b = out.batch
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    with torch.no_grad():
        logits = model(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]
        ).logits
    width = b["responses"].shape[1]
    expected = torch.log_softmax(logits[:, -width - 1 : -1].float() / 0.7, -1)
    expected = expected.gather(-1, b["responses"][..., None]).squeeze(-1) * b["response_mask"]
    torch.testing.assert_close(b["rollout_log_probs"], expected, atol=1e-5, rtol=1e-5)


def test_prompts_must_be_left_padded(rollout, tiny_model):
    prompts = prompts_from(tiny_model)
    prompts.batch["attention_mask"] = prompts.batch["attention_mask"].flip(-1)
    with pytest.raises(ValueError, match="left-padded"):
        rollout.generate(prompts, greedy())


def test_update_weights_copies_or_aliases(tiny_model):
    prompts = prompts_from(tiny_model)
    source = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    with torch.no_grad():
        for p in source.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    copying = HFRolloutEngine(HFRolloutConfig(model_path=tiny_model, share_weight_storage=False))
    aliasing = HFRolloutEngine(HFRolloutConfig(model_path=tiny_model, load_format="dummy"))
    before = copying.generate(prompts, greedy()).batch["responses"]
    for engine in (copying, aliasing):
        engine.update_weights(source.named_parameters())
    w = source.model.embed_tokens.weight
    assert copying.model.model.embed_tokens.weight.data_ptr() != w.data_ptr()
    assert aliasing.model.model.embed_tokens.weight.data_ptr() == w.data_ptr()
    after = copying.generate(prompts, greedy()).batch["responses"]
    assert not torch.equal(before, after)
    assert torch.equal(after, aliasing.generate(prompts, greedy()).batch["responses"])
    with pytest.raises(KeyError, match="not a weight of the rollout model"):
        copying.update_weights([("model.nope.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match="has shape"):
        copying.update_weights([("lm_head.weight", torch.zeros(3, 3))])


def test_sleep_levels(tiny_model):
    prompts = prompts_from(tiny_model)
    level1 = HFRolloutEngine(HFRolloutConfig(model_path=tiny_model))
    assert not level1.supports_sleep and level1.sleep() is False and level1.wake_up() is False
    reference = level1.generate(prompts, greedy()).batch["responses"]

    level2 = HFRolloutEngine(HFRolloutConfig(model_path=tiny_model, sleep_level=2, share_weight_storage=False))
    assert level2.supports_sleep and level2.sleep() is True
    assert all(p.numel() == 0 for p in level2.model.parameters())  # the weights are really gone
    level2.wake_up()
    with pytest.raises(RuntimeError, match="asleep"):
        level2.generate(prompts, greedy())
    with pytest.raises(RuntimeError, match="must provide every weight"):
        level2.update_weights([("lm_head.weight", level1.model.lm_head.weight)])
    level2.update_weights(level1.model.named_parameters())
    assert torch.equal(level2.generate(prompts, greedy()).batch["responses"], reference)


def test_config_errors():
    with pytest.raises(ValueError, match="load_format='safetensors'"):
        HFRolloutConfig(model_path="x", load_format="safetensors")
    with pytest.raises(FileNotFoundError, match="not a local folder"):
        HFRolloutEngine(HFRolloutConfig(model_path="/no/such/model"))
