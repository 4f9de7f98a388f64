"""The CPU KV cache is sized from the run's batch and lengths (``kv_cache``), explicit sizes win, and
verl's rollout keys reach vLLM where they mean something (``engine_args``)."""

import json
import logging

import pytest
from vllm_test_helpers import prompts_batch, vllm_config

from verl.core.engine import SamplingParams
from verl.engines.rollout.vllm import kv_cache
from verl.engines.rollout.vllm.engine_args import no_effect_on, vllm_args
from verl.engines.rollout.vllm.kv_cache import GenerationBatch

pytestmark = pytest.mark.vllm

TIB = 1 << 40
ENGINE_LOGGER = "verl.engines.rollout.vllm.engine"


def write_config(folder, **fields):
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(fields))
    return str(folder)


def test_bytes_per_token_are_layers_x_k_and_v_x_kv_heads_x_head_dim_x_dtype(tmp_path, qwen2_model):
    # Qwen2.5-0.5B's shape: 24 layers, 14 heads of 64 (hidden 896), 2 KV heads
    qwen = write_config(
        tmp_path / "qwen", num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, hidden_size=896
    )
    assert kv_cache.kv_cache_bytes_per_token(qwen, 4) == 24 * 2 * 2 * 64 * 4 == 24576
    assert kv_cache.kv_cache_bytes_per_token(qwen, 2) == 12288
    # an explicit head_dim wins over hidden/heads; no num_key_value_heads: every head has its own K and V
    mha = write_config(tmp_path / "mha", num_hidden_layers=2, num_attention_heads=4, hidden_size=64, head_dim=32)
    assert kv_cache.kv_cache_bytes_per_token(mha, 4) == 2 * 2 * 4 * 32 * 4
    # the test model: 2 layers, 1 KV head of 32, fp32
    assert kv_cache.kv_cache_bytes_per_token(qwen2_model, 4) == 512
    broken = write_config(tmp_path / "broken", num_hidden_layers=2)
    with pytest.raises(ValueError, match="lacks 'num_attention_heads'.*kv_cache_memory_bytes"):
        kv_cache.kv_cache_bytes_per_token(broken, 4)


def test_the_size_is_the_batchs_sequences_in_whole_blocks_with_the_margin():
    # 8 prompts x n=4 = 32 sequences of 512 + 1024 tokens = 12 blocks of 128 each;
    # 32 x 12 = 384 blocks, +10% = 422.4 -> 423, + 1 null block = 424 blocks of 128 tokens x 24576 B
    plan = kv_cache.plan_kv_cache(
        bytes_per_token=24576,
        max_model_len=1536,
        batches=[GenerationBatch("training", 8, 4), GenerationBatch("validation", 16, 1)],
        max_num_seqs=256,
        block_size=None,
        host_free_bytes=TIB,
    )
    assert plan.bytes == 424 * 128 * 24576 == 1_333_788_672
    assert plan.sequences == 32
    assert "32 sequences (training: 8 prompts x n=4)" in plan.how and "424 blocks x 24576 B/token" in plan.how
    # a length that is not a multiple of the block size rounds up per sequence: 72 tokens -> 1 block
    small = kv_cache.plan_kv_cache(
        bytes_per_token=512,
        max_model_len=72,
        batches=[GenerationBatch("training", 2, 4)],
        max_num_seqs=None,
        block_size=None,
        host_free_bytes=TIB,
    )
    assert small.bytes == (9 + 1) * 128 * 512  # ceil(8 x 1 x 1.1) = 9, + null block
    # an explicit block size is used for the rounding: 72 tokens = 5 blocks of 16
    blocks16 = kv_cache.plan_kv_cache(
        bytes_per_token=512,
        max_model_len=72,
        batches=[GenerationBatch("training", 2, 4)],
        max_num_seqs=None,
        block_size=16,
        host_free_bytes=TIB,
    )
    assert blocks16.bytes == (44 + 1) * 16 * 512  # 8 x 5 = 40, +10% = 44


def test_the_largest_call_wins_and_a_call_of_unknown_size_counts_as_max_num_seqs():
    def plan(*batches, max_num_seqs=64):
        return kv_cache.plan_kv_cache(
            bytes_per_token=512,
            max_model_len=100,
            batches=list(batches),
            max_num_seqs=max_num_seqs,
            block_size=None,
            host_free_bytes=TIB,
        )

    capped = plan(GenerationBatch("training", 100, 8))
    assert capped.sequences == 64 and capped.bytes == (71 + 1) * 128 * 512  # ceil(64 x 1.1) = 71
    assert "training: 100 prompts x n=8, capped at max_num_seqs=64" in capped.how
    validation = plan(GenerationBatch("training", 2, 4), GenerationBatch("validation", 10, 2))
    assert validation.sequences == 20 and "(validation: 10 prompts x n=2)" in validation.how
    whole_set = plan(GenerationBatch("training", 2, 4), GenerationBatch("validation", None))
    assert whole_set.sequences == 64 and "validation: size known only at run time" in whole_set.how
    nothing_known = plan(max_num_seqs=None)
    assert nothing_known.sequences == kv_cache.CPU_MAX_NUM_SEQS == 256


def test_the_cache_is_capped_by_free_host_memory_and_refused_below_one_sequence():
    # 1 GiB free, 2 engines on this host: each may take 25% / 2 = 128 MiB = 2048 blocks of 128 x 512 B
    plan = kv_cache.plan_kv_cache(
        bytes_per_token=512,
        max_model_len=1024,
        batches=[GenerationBatch("training", 1000, 8)],
        max_num_seqs=None,
        block_size=None,
        host_free_bytes=1 << 30,
        engines_on_host=2,
    )
    assert plan.bytes == 128 << 20
    assert plan.sequences == (2048 - 1) // 8 == 255
    assert "capped at 25% of free host memory / 2 engine(s)" in plan.how and "in waves" in plan.how
    with pytest.raises(ValueError, match=r"one sequence of max_model_len=100000 tokens.*max_response_length"):
        kv_cache.plan_kv_cache(
            bytes_per_token=24576,
            max_model_len=100_000,
            batches=[GenerationBatch("training", 1, 1)],
            max_num_seqs=None,
            block_size=None,
            host_free_bytes=1 << 30,
        )


def test_explicit_sizes_win(monkeypatch):
    monkeypatch.delenv(kv_cache.ENV_KEY, raising=False)
    assert kv_cache.explicit_kv_cache({}) is None
    assert (
        kv_cache.explicit_kv_cache({"kv_cache_memory_bytes": 1 << 20}) == "engine_kwargs.kv_cache_memory_bytes=1048576"
    )
    assert kv_cache.explicit_kv_cache({"num_gpu_blocks_override": 9}) == "engine_kwargs.num_gpu_blocks_override=9"
    monkeypatch.setenv(kv_cache.ENV_KEY, "2")
    assert kv_cache.explicit_kv_cache({}) == "VLLM_CPU_KVCACHE_SPACE=2 GiB"


def test_a_cache_that_holds_fewer_sequences_than_planned_is_reported():
    plan = kv_cache.KVCachePlan(bytes=0, how="", sequences=8, max_model_len=200)
    assert kv_cache.check_capacity(plan, num_blocks=17, block_size=128) is None  # 16 blocks / 2 a sequence
    warning = kv_cache.check_capacity(plan, num_blocks=9, block_size=128)
    assert "room for 4 sequences of 200 tokens instead of the 8 planned" in warning
    assert kv_cache.check_capacity(kv_cache.KVCachePlan(0, "given"), num_blocks=3, block_size=128) is None


def test_verl_keys_reach_vllm_where_they_mean_something(qwen2_model):
    config = vllm_config(
        qwen2_model,
        kv_cache_bytes=None,
        max_num_seqs=16,
        max_num_batched_tokens=2048,
        enable_chunked_prefill=False,
        enable_prefix_caching=False,
        cudagraph_capture_sizes=[1, 2],
        gpu_memory_utilization=0.7,
    )
    cpu = vllm_args(config, "cpu", "float32", sleep=False, kv_cache_bytes=1 << 20)
    assert {k: cpu[k] for k in ("max_num_seqs", "max_num_batched_tokens", "max_model_len")} == {
        "max_num_seqs": 16,
        "max_num_batched_tokens": 2048,
        "max_model_len": 64,
    }
    assert cpu["enable_chunked_prefill"] is False and cpu["enable_prefix_caching"] is False
    assert cpu["kv_cache_memory_bytes"] == 1 << 20 and cpu["enforce_eager"] is True
    assert "gpu_memory_utilization" not in cpu and "cudagraph_capture_sizes" not in cpu
    assert set(no_effect_on(config, "cpu")) == {
        "gpu_memory_utilization=0.7",
        "free_cache_engine=True",
        "cudagraph_capture_sizes=[1, 2]",
    }
    cuda = vllm_args(config, "cuda", "bfloat16", sleep=True, kv_cache_bytes=None)
    assert cuda["gpu_memory_utilization"] == 0.7 and cuda["cudagraph_capture_sizes"] == [1, 2]
    assert cuda["enable_sleep_mode"] is True and "kv_cache_memory_bytes" not in cuda
    assert no_effect_on(config, "cuda") == {}
    # verl's defaults reach vLLM; a scheduler key set to null is left to vLLM's own default; engine_kwargs
    # named like a field set the field
    verl_defaults = vllm_args(vllm_config(qwen2_model, kv_cache_bytes=None), "cpu", "float32", False, None)
    assert verl_defaults["enable_chunked_prefill"] is True and verl_defaults["max_num_batched_tokens"] == 8192
    default = vllm_args(
        vllm_config(qwen2_model, kv_cache_bytes=None, enable_chunked_prefill=None, engine_kwargs={"max_num_seqs": 3}),
        "cpu",
        "float32",
        sleep=False,
        kv_cache_bytes=None,
    )
    assert default["max_num_seqs"] == 3 and "enable_chunked_prefill" not in default


def test_a_real_rollout_runs_with_no_kv_cache_setting(qwen2_model, keep_alive, monkeypatch, caplog):
    from verl.engines.rollout.vllm import VLLMRolloutEngine

    monkeypatch.delenv(kv_cache.ENV_KEY, raising=False)
    batches = [{"name": "training", "prompts": 4, "n": 2}, {"name": "validation", "prompts": 4, "n": 1}]
    config = vllm_config(
        qwen2_model, kv_cache_bytes=None, load_format="hf", generation_batches=batches, max_num_seqs=32
    )
    assert "kv_cache_memory_bytes" not in config.engine_kwargs
    with caplog.at_level(logging.INFO, logger=ENGINE_LOGGER):
        engine = VLLMRolloutEngine(config)
    keep_alive(engine)
    # the larger call, 4 prompts x n=2 = 8 sequences of 64 tokens = 1 block each; ceil(8 x 1.1) = 9, + null block = 10
    assert engine.kv_plan.bytes == 10 * 128 * 512
    vllm_config_ = engine.llm.llm_engine.vllm_config
    assert vllm_config_.cache_config.num_gpu_blocks == 10 and vllm_config_.cache_config.block_size == 128
    assert vllm_config_.scheduler_config.max_num_seqs == 32  # verl's key reached vLLM
    assert "KV cache 0.6 MiB: 8 sequences (training: 4 prompts x n=2)" in caplog.text
    assert "settings with no effect on cpu: gpu_memory_utilization=0.5" in caplog.text
    assert "free_cache_engine=True (vLLM has no sleep mode on CPU" in caplog.text
    assert "room for" not in caplog.text  # vLLM's cache holds what was planned
    out = engine.generate(prompts_batch(qwen2_model), SamplingParams(n=2, max_new_tokens=8, seed=1))
    assert out.batch["responses"].shape == (8, 8)


def test_an_explicit_kv_cache_size_is_what_vllm_gets(qwen2_engine):
    # the shared engine is built with engine_kwargs.kv_cache_memory_bytes = 32 MiB: 512 blocks of 128 x 512 B
    assert qwen2_engine.kv_plan.how == f"set by engine_kwargs.kv_cache_memory_bytes={32 << 20}"
    assert qwen2_engine.llm.llm_engine.vllm_config.cache_config.num_gpu_blocks == 512


def test_the_actors_config_overrides_reach_vllm(qwen2_model):
    config = vllm_config(qwen2_model, kv_cache_bytes=None, override_config={"rms_norm_eps": 1e-3})
    assert vllm_args(config, "cpu", "float32", sleep=False, kv_cache_bytes=None)["hf_overrides"] == {
        "rms_norm_eps": 1e-3
    }
    plain = vllm_args(vllm_config(qwen2_model, kv_cache_bytes=None), "cpu", "float32", sleep=False, kv_cache_bytes=None)
    assert "hf_overrides" not in plain
