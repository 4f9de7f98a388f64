"""The hf engine's decode paths against each other: the static path (left padding trimmed, each prompt
prefilled once, preallocated cache, finished rows dropped; eager or compiled) must give the plain
dynamic-cache loop's greedy outputs token for token, and every path's log-probs must be what a full
forward of the finished sequences gives."""

import pytest
import torch
from engine_helpers import count_native_layer_steps
from test_hf_rollout import prompts_from
from transformers import AutoModelForCausalLM

from verl.core.engine import SamplingParams
from verl.core.protocol import DataProto
from verl.engines.rollout.hf import HFRolloutConfig, HFRolloutEngine
from verl.engines.rollout.hf.gqa_attention import gqa_attention_name
from verl.engines.rollout.hf.packed_linear import packable_weight_bytes, reordered_copy_fits
from verl.engines.rollout.hf.static_decode import trim_left_padding

ROWS = 8  # prompts of left_padded_prompts()


def left_padded_prompts(model_path=None, lengths=(4, 9, 1, 6, 3, 7, 2, 5), seed=0) -> DataProto:
    """Prompts of random token ids (3..95) of the given lengths, left-padded with 0."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, width - length :] = torch.randint(3, 96, (length,), generator=g)
        mask[row, width - length :] = 1
    return DataProto.from_dict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}
    )


def padded_left(prompts: DataProto, extra: int, pad_id: int = 0) -> DataProto:
    """The same prompts with ``extra`` more padding columns on the left (as the trainer pads to
    data.max_prompt_length)."""
    b = prompts.batch

    def pad(t, value):
        return torch.cat([torch.full((t.shape[0], extra), value, dtype=t.dtype), t], dim=1)

    return DataProto.from_dict(
        {
            "input_ids": pad(b["input_ids"], pad_id),
            "attention_mask": pad(b["attention_mask"], 0),
            "position_ids": pad(b["position_ids"], 0),
        }
    )


def engine(model_path, **kw) -> HFRolloutEngine:
    return HFRolloutEngine(HFRolloutConfig(model_path=model_path, **kw))


def eos_ending_rows_early(model_path, prompts, width) -> list[int]:
    """Token ids that end the greedy responses of different rows at different steps (so the static path
    drops finished rows mid-decode)."""
    free = engine(model_path, eos_token_id=[10_000], cache_implementation="dynamic", packed_linear=False).generate(
        prompts, SamplingParams(do_sample=False, max_new_tokens=width)
    )
    responses = free.batch["responses"]
    return sorted({int(responses[0, 1]), int(responses[2, 4])})


@pytest.mark.parametrize(("micro_batch_size", "packed"), [(1, True), (3, True), (64, True), (64, False), (5, False)])
def test_static_greedy_equals_plain_token_for_token(tiny_model, micro_batch_size, packed):
    prompts = padded_left(left_padded_prompts(tiny_model), extra=7)
    eos = eos_ending_rows_early(tiny_model, prompts, 10)
    greedy = SamplingParams(n=2, do_sample=False, max_new_tokens=10, logprobs=True)
    plain = engine(
        tiny_model,
        cache_implementation="dynamic",
        packed_linear=False,
        micro_batch_size=micro_batch_size,
        eos_token_id=eos,
    )
    fast = engine(tiny_model, micro_batch_size=micro_batch_size, eos_token_id=eos, packed_linear=packed)
    a, b = plain.generate(prompts, greedy), fast.generate(prompts, greedy)
    assert fast.cache_implementation == "static" and fast.compiled_step is None  # the CPU default
    assert fast.packed_linear is packed
    assert ("timing_s/rollout_pack_weights" in b.meta_info["metrics"]) is packed
    assert all("forward" not in m.__dict__ for m in fast.model.modules())  # packed weights released
    assert torch.equal(a.batch["responses"], b.batch["responses"])
    assert torch.equal(a.batch["response_mask"], b.batch["response_mask"])
    assert len(set(a.batch["response_mask"].sum(-1).tolist())) > 1  # rows really ended at different steps
    torch.testing.assert_close(b.batch["rollout_log_probs"], a.batch["rollout_log_probs"], atol=1e-5, rtol=1e-5)
    metrics = b.meta_info["metrics"]
    if micro_batch_size == 64:  # one micro-batch: rows were dropped once a quarter had finished
        assert metrics["rollout/decode_rows_per_step"] < 2 * ROWS
    # Padding columns common to every prompt are not computed, and each prompt is prefilled once, not n times.
    width = int(prompts.batch["attention_mask"].sum(-1).max())
    if micro_batch_size == 64:
        assert metrics["rollout/prefill_tokens"] == ROWS * width
    assert a.meta_info["metrics"]["rollout/prefill_tokens"] == 2 * ROWS * prompts.batch["input_ids"].shape[1]


def full_forward_log_probs(model_path, out: DataProto, temperature: float) -> torch.Tensor:
    b = out.batch
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    with torch.no_grad():
        logits = model(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]
        ).logits
    width = b["responses"].shape[1]
    expected = torch.log_softmax(logits[:, -width - 1 : -1].float() / temperature, -1)
    return expected.gather(-1, b["responses"][..., None]).squeeze(-1) * b["response_mask"]


def test_grouped_query_attention_in_place_equals_transformers_sdpa(tiny_model):
    """The CPU rollout's attention (grouped KV heads passed to SDPA with the padding mask, no copies) gives
    transformers' sdpa logits on a left-padded batch, in prefill and in a cached decode step, within fp32
    rounding (the two sum the same products in another order)."""
    name = gqa_attention_name()
    assert name is not None
    models = {
        impl: AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation=impl).eval()
        for impl in ("sdpa", name)
    }
    assert models["sdpa"].config.num_key_value_heads < models["sdpa"].config.num_attention_heads
    b = padded_left(left_padded_prompts(tiny_model), extra=3).batch
    logits = {}
    with torch.no_grad():
        for impl, model in models.items():
            out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"])
            step = model(
                input_ids=out.logits[:, -1].argmax(-1, keepdim=True),
                attention_mask=torch.cat([b["attention_mask"], torch.ones(ROWS, 1, dtype=torch.long)], 1),
                position_ids=b["position_ids"][:, -1:] + 1,
                past_key_values=out.past_key_values,
            )
            logits[impl] = (out.logits, step.logits)
    real = b["attention_mask"].bool()  # padding positions attend to nothing real: their logits are noise
    torch.testing.assert_close(logits[name][0][real], logits["sdpa"][0][real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits[name][1], logits["sdpa"][1], atol=1e-5, rtol=1e-5)
    assert torch.equal(logits[name][1].argmax(-1), logits["sdpa"][1].argmax(-1))


@pytest.mark.parametrize(
    ("cache_implementation", "packed"), [("static", True), ("static", False), ("dynamic", True), ("dynamic", False)]
)
def test_sampled_log_probs_match_a_full_forward_on_every_path(tiny_model, cache_implementation, packed):
    prompts = padded_left(left_padded_prompts(tiny_model), extra=5)
    rollout = engine(tiny_model, cache_implementation=cache_implementation, micro_batch_size=7, packed_linear=packed)
    out = rollout.generate(
        prompts, SamplingParams(n=3, temperature=0.8, top_p=0.9, max_new_tokens=9, logprobs=True, seed=4)
    )
    assert out.batch["response_mask"].sum() > 0
    expected = full_forward_log_probs(tiny_model, out, 0.8)
    torch.testing.assert_close(out.batch["rollout_log_probs"], expected, atol=1e-5, rtol=1e-5)


def test_static_sampling_is_seeded_and_stop_strings_end_rows(tiny_model):
    prompts = prompts_from(tiny_model)
    fast = engine(tiny_model, micro_batch_size=5)
    sampling = SamplingParams(n=4, max_new_tokens=8, seed=11)
    a, b = fast.generate(prompts, sampling), fast.generate(prompts, sampling)
    assert torch.equal(a.batch["responses"], b.batch["responses"])
    free = engine(tiny_model, cache_implementation="dynamic").generate(
        prompts[:1], SamplingParams(do_sample=False, max_new_tokens=8)
    )
    word = fast.tokenizer.convert_ids_to_tokens(int(free.batch["responses"][0, 3]))
    stop = SamplingParams(do_sample=False, max_new_tokens=8, stop=[word])
    plain = engine(tiny_model, cache_implementation="dynamic", packed_linear=False).generate(prompts, stop)
    static = fast.generate(prompts, stop)
    assert torch.equal(plain.batch["response_mask"], static.batch["response_mask"])
    assert torch.equal(plain.batch["responses"], static.batch["responses"])


def test_the_reordered_copy_must_leave_half_the_free_memory():
    assert reordered_copy_fits(copy_bytes=100, free_bytes=200, total_bytes=1000)
    assert not reordered_copy_fits(copy_bytes=101, free_bytes=200, total_bytes=1000)
    assert reordered_copy_fits(copy_bytes=100, free_bytes=0, total_bytes=0)  # the platform cannot tell


def test_the_default_packs_the_linear_weights_on_cpu_and_reports_it(tiny_model):
    """packed_linear unset: every generate on the CPU in fp32 reorders the weights (this machine has the
    memory) and says so; the outputs are the plain path's; where oneDNN cannot run, the plain path."""
    prompts = padded_left(left_padded_prompts(tiny_model), extra=4)
    greedy = SamplingParams(n=2, do_sample=False, max_new_tokens=6, logprobs=True)
    rollout = engine(tiny_model)
    assert rollout.packed_linear is True
    assert packable_weight_bytes(rollout.model) == sum(
        m.weight.numel() * 4 for m in rollout.model.modules() if type(m) is torch.nn.Linear
    )
    plain = engine(tiny_model, cache_implementation="dynamic", packed_linear=False).generate(prompts, greedy)
    assert plain.meta_info["metrics"]["rollout/packed_linear"] == 0.0
    for out in (rollout.generate(prompts, greedy), rollout.generate(prompts, greedy)):
        metrics = out.meta_info["metrics"]
        assert metrics["rollout/packed_linear"] == 1.0 and metrics["timing_s/rollout_pack_weights"] > 0
        assert torch.equal(out.batch["responses"], plain.batch["responses"])
        torch.testing.assert_close(
            out.batch["rollout_log_probs"], plain.batch["rollout_log_probs"], atol=1e-5, rtol=1e-5
        )
    assert all("forward" not in m.__dict__ for m in rollout.model.modules())  # the copy released
    bf16 = engine(tiny_model, dtype="bf16")  # oneDNN's packed fp32 weights cannot serve: no error, no packing
    assert bf16.packed_linear is False
    assert bf16.generate(prompts, greedy).meta_info["metrics"]["rollout/packed_linear"] == 0.0


def test_trim_left_padding_keeps_what_any_row_uses():
    mask = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]])
    ids = torch.arange(8).view(2, 4)
    t_ids, t_mask, t_pos = trim_left_padding(ids, mask, mask.cumsum(-1))
    assert torch.equal(t_mask, mask[:, 1:]) and torch.equal(t_ids, ids[:, 1:]) and t_pos.shape == (2, 3)


def test_decode_path_config_errors(tiny_model):
    with pytest.raises(ValueError, match="cache_implementation='paged' is unknown"):
        HFRolloutConfig(model_path="x", cache_implementation="paged")
    with pytest.raises(ValueError, match="compile_decode=true needs cache_implementation='static'"):
        HFRolloutConfig(model_path="x", cache_implementation="dynamic", compile_decode=True)
    with pytest.raises(ValueError, match="packed_linear=true and compile_decode=true exclude each other"):
        HFRolloutConfig(model_path="x", packed_linear=True, compile_decode=True)
    with pytest.raises(ValueError, match="packed_linear=true cannot be honoured: it is for fp32 weights"):
        engine(tiny_model, dtype="bf16", packed_linear=True)


@pytest.mark.slow
def test_compiled_step_greedy_equals_plain_and_reports_its_warm_up(tiny_model):
    prompts = padded_left(left_padded_prompts(tiny_model), extra=3)
    eos = eos_ending_rows_early(tiny_model, prompts, 10)
    greedy = SamplingParams(n=2, do_sample=False, max_new_tokens=10, logprobs=True)
    plain = engine(tiny_model, cache_implementation="dynamic", packed_linear=False, eos_token_id=eos).generate(
        prompts, greedy
    )
    compiled = engine(tiny_model, compile_decode=True, eos_token_id=eos)
    assert not compiled.packed_linear
    first, second = compiled.generate(prompts, greedy), compiled.generate(prompts, greedy)
    for out in (first, second):
        assert torch.equal(out.batch["responses"], plain.batch["responses"])
        torch.testing.assert_close(
            out.batch["rollout_log_probs"], plain.batch["rollout_log_probs"], atol=1e-5, rtol=1e-5
        )
    assert first.meta_info["metrics"]["timing_s/rollout_compile"] > 0  # the warm-up, paid once per shape
    assert second.meta_info["metrics"]["timing_s/rollout_compile"] == 0
    sampled = compiled.generate(prompts, SamplingParams(n=2, max_new_tokens=10, logprobs=True, seed=3))
    torch.testing.assert_close(
        sampled.batch["rollout_log_probs"], full_forward_log_probs(tiny_model, sampled, 1.0), atol=1e-5, rtol=1e-5
    )


def test_cpu_kernels_by_default_give_the_plain_paths_tokens_and_can_be_turned_off(tiny_model, monkeypatch, caplog):
    from verl.engines.rollout.hf import cpu_kernels
    from verl.engines.rollout.hf import engine as engine_module

    if cpu_kernels.compiler_missing_reason() is not None:
        pytest.skip(cpu_kernels.compiler_missing_reason())
    calls = []
    decode_attention = cpu_kernels._ops().decode_attention

    def counting_decode_attention(*args):
        calls.append(args[0].shape[0])
        return decode_attention(*args)

    # Every way to the kernel counts: gqa_attention's hook, the fused step's Python call, and its native step
    # (a shared-prefix cache's attention aside, the C++ LayerStep calls the kernel itself: a call counts).
    monkeypatch.setattr(cpu_kernels._ops(), "decode_attention", counting_decode_attention)
    count_native_layer_steps(monkeypatch, calls)
    prompts = padded_left(left_padded_prompts(tiny_model), extra=3)
    greedy = SamplingParams(n=2, do_sample=False, max_new_tokens=8, logprobs=True)
    plain = engine(tiny_model, cache_implementation="dynamic", packed_linear=False).generate(prompts, greedy)
    rollout = engine(tiny_model)
    assert rollout.cpu_kernels is True
    rollout.generate(prompts, greedy)  # the first probes the decoder layer class (its calls are not steps)
    calls.clear()
    first, second = rollout.generate(prompts, greedy), rollout.generate(prompts, greedy)
    # Every decode step's attention went through the kernel, in every layer.
    layers = rollout.model.config.num_hidden_layers
    steps = sum(out.meta_info["metrics"]["rollout/decode_steps"] for out in (first, second))
    assert steps > 0 and len(calls) == steps * layers
    for out in (first, second):
        assert out.meta_info["metrics"]["rollout/cpu_kernels"] == 1.0
        assert out.meta_info["metrics"]["rollout/fused_decoder_layers"] == layers
        assert torch.equal(out.batch["responses"], plain.batch["responses"])
        torch.testing.assert_close(
            out.batch["rollout_log_probs"], plain.batch["rollout_log_probs"], atol=1e-5, rtol=1e-5
        )
    # The one-time build (or load) at setup, in every generate's metrics (a run's first may be validation's).
    build = first.meta_info["metrics"]["timing_s/rollout_cpu_kernels_build"]
    assert build > 0 and second.meta_info["metrics"]["timing_s/rollout_cpu_kernels_build"] == build
    calls.clear()
    off = engine(tiny_model, cpu_kernels=False)
    out = off.generate(prompts, greedy)
    assert not calls and out.meta_info["metrics"]["rollout/cpu_kernels"] == 0.0
    assert out.meta_info["metrics"]["rollout/fused_decoder_layers"] == 0.0
    assert torch.equal(out.batch["responses"], plain.batch["responses"])
    # Without a compiler: the default decodes without them and says why; true refuses to start.
    monkeypatch.setattr(engine_module, "cpu_kernels_unavailable_reason", lambda: "no compiler found")
    with caplog.at_level("WARNING"):
        assert engine(tiny_model).cpu_kernels is False
    assert "decoding without verl's CPU kernels: no compiler found" in caplog.text
    with pytest.raises(ValueError, match="cpu_kernels=true cannot be honoured: no compiler found"):
        engine(tiny_model, cpu_kernels=True)
    with pytest.raises(ValueError, match="cpu_kernels=true needs cache_implementation='static'"):
        HFRolloutConfig(model_path="x", cache_implementation="dynamic", cpu_kernels=True)
    assert engine(tiny_model, dtype="bf16").cpu_kernels is False  # fp32 only: no error, no kernels
