"""Ulysses sequence parallelism: with SP=2 (and SP=2 x DP=2) the log-probs, entropies, values, losses,
and gradients equal one rank's without it, on real gloo process groups; plus the
settings it refuses."""

import pytest
import torch
from engine_helpers import VOCAB, WORDS, rl_batch, run_ranks
from rank_programs import token_mean_loss, value_loss
from test_shared_prompts import grouped_batch
from ulysses_programs import run_cases
from verl_test_models import word_tokenizer, write_causal_lm

from verl.core.parallel_dims import ParallelLayoutError
from verl.core.protocol import DataProto
from verl.engines.fsdp import FSDPEngine, FSDPEngineConfig, FSDPValueEngine
from verl.engines.fsdp.ulysses import UlyssesConfigError, check_heads

# fp32 on CPU; the sums run in another order (attention per head share, gradients summed over ranks)
TOLERANCE = {"atol": 2e-6, "rtol": 1e-5}


@pytest.fixture(scope="module")
def one_kv_head_model(tmp_path_factory) -> str:
    """GQA with fewer key/value heads (1) than sequence-parallel ranks (2): the head is repeated."""
    path = str(tmp_path_factory.mktemp("tiny_one_kv_head"))
    return write_causal_lm(
        path, word_tokenizer(WORDS, VOCAB), hidden_size=32, intermediate_size=64, num_heads=4, num_kv_heads=1,
        max_positions=256, seed=3, init_std=0.2,
    )  # fmt: skip


def assert_same_step(one: dict, sp: dict) -> None:
    assert one["outputs"].keys() == sp["outputs"].keys()
    for key in one["outputs"]:
        torch.testing.assert_close(
            sp["outputs"][key], one["outputs"][key], **TOLERANCE, msg=lambda m, k=key: f"{k}: {m}"
        )
    for key, values in one["metrics"].items():
        assert sp["metrics"][key] == pytest.approx(values, rel=1e-5, abs=1e-7), key
    assert one["grads"].keys() == sp["grads"].keys() and len(one["grads"]) > 10
    for name in one["grads"]:
        torch.testing.assert_close(
            sp["grads"][name], one["grads"][name], **TOLERANCE, msg=lambda m, n=name: f"{n}: {m}"
        )
    assert sp["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)


def cases(tiny_model, one_kv_head_model):
    """(engine, model, batch, loss, config) of each comparison; config without the SP size."""
    grouped = grouped_batch(prompts=3, n=4, prompt_len=7, response_len=6, seed=5)
    plain = rl_batch(8, 9, 7, seed=6)
    return [
        # GRPO-shaped batch in the shared-prompt layout (prompt once, responses after it), two micro-batches
        (FSDPEngine, tiny_model, grouped, token_mean_loss, {"ppo_micro_batch_size_per_gpu": 6}),
        # plain packing, token-budget micro-batches (the budget per rank is per 1/sp of the tokens)
        (
            FSDPEngine,
            tiny_model,
            plain,
            token_mean_loss,
            {"share_prompts": False, "use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 20},
        ),
        # the critic's value head
        (FSDPValueEngine, tiny_model, grouped, value_loss, {"ppo_micro_batch_size_per_gpu": 12}),
        # one key/value head for two ranks: repeated so each rank has one
        (FSDPEngine, one_kv_head_model, plain, token_mean_loss, {"ppo_micro_batch_size_per_gpu": 3}),
        # a 10-token prompt and a 2-token response per micro-batch: the first rank's half of the row predicts
        # nothing, yet it must join the backward's all-to-alls
        (FSDPEngine, tiny_model, long_prompts_short_responses(), token_mean_loss, {"ppo_micro_batch_size_per_gpu": 1}),
    ]


def long_prompts_short_responses() -> DataProto:
    g = torch.Generator().manual_seed(9)
    input_ids = torch.randint(3, VOCAB, (2, 12), generator=g)
    ones = torch.ones(2, 12, dtype=torch.long)
    tensors = {
        "prompts": input_ids[:, :10],
        "responses": input_ids[:, 10:],
        "input_ids": input_ids,
        "attention_mask": ones,
        "position_ids": ones.cumsum(-1) - 1,
        "response_mask": ones[:, 10:],
        "advantages": torch.randn(2, 2, generator=g),
    }
    return DataProto.from_dict(tensors, meta_info={"temperature": 1.0, "compute_entropy": True})


def reference(case_list) -> list[dict]:
    from ulysses_programs import one_engine_step

    results = [one_engine_step(cls, path, batch, loss, config) for cls, path, batch, loss, config in case_list]
    return [{k: v for k, v in r.items() if k != "engine"} for r in results]


def with_sp(case_list, sp: int, budget_scale: int = 1):
    out = []
    for cls, path, batch, loss, config in case_list:
        config = dict(config, ulysses_sequence_parallel_size=sp)
        if "ppo_max_token_len_per_gpu" in config:  # the same micro-batches as one rank
            config["ppo_max_token_len_per_gpu"] //= budget_scale
        out.append((cls, path, batch, loss, config))
    return out


def test_two_sequence_parallel_ranks_equal_one_rank(tiny_model, one_kv_head_model, tmp_path, one_process_group):
    case_list = cases(tiny_model, one_kv_head_model)
    ones = reference(case_list)
    ranks = run_ranks(run_cases, 2, with_sp(case_list, 2, budget_scale=2), result_dir=str(tmp_path))
    for index, one in enumerate(ones):
        for rank in range(2):
            sp = ranks[rank][index]
            assert sp["layout"] == (0, 1, rank == 0, 2)  # one data-parallel rank; its first rank collects
            assert_same_step(one, sp)
    # the dynamic case really ran the same micro-batches (budget 20 on one rank = 10 per rank at SP=2)
    assert len(ranks[0][1]["metrics"]["loss"]) == len(ones[1]["metrics"]["loss"]) > 1


def test_sequence_parallel_groups_are_data_parallel_ranks(tiny_model, tmp_path, one_process_group):
    """Four ranks, SP=2: two data-parallel ranks of two; each group takes half the batch."""
    batch = grouped_batch(prompts=4, n=2, prompt_len=6, response_len=5, seed=8)
    case = [(FSDPEngine, tiny_model, batch, token_mean_loss, {"ppo_micro_batch_size_per_gpu": 2})]
    one = reference(case)[0]
    ranks = run_ranks(run_cases, 4, with_sp(case, 2), result_dir=str(tmp_path))
    for rank in range(4):
        sp = ranks[rank][0]
        assert sp["layout"] == (rank // 2, 2, rank % 2 == 0, 2)
        for name in one["grads"]:
            torch.testing.assert_close(sp["grads"][name], one["grads"][name], **TOLERANCE)
        assert sp["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    outputs = torch.cat([ranks[0][0]["outputs"]["log_probs"], ranks[2][0]["outputs"]["log_probs"]])
    torch.testing.assert_close(outputs, one["outputs"]["log_probs"], **TOLERANCE)


def test_a_sequence_parallel_checkpoint_loads_on_one_rank(tiny_model, tmp_path, one_process_group):
    from ulysses_programs import step_and_save

    ckpt = str(tmp_path / "ckpt")
    saved = run_ranks(
        step_and_save, 2, tiny_model, rl_batch(4, 6, 5, seed=21), token_mean_loss, ckpt, result_dir=str(tmp_path / "r")
    )
    engine = FSDPEngine(FSDPEngineConfig(model_path=tiny_model, optim={"lr": 1e-2}))
    engine.initialize()
    engine.load_checkpoint(ckpt)
    engine.load_to_device(model=True, optimizer=False)
    loaded = dict(engine.named_full_parameters())
    assert loaded.keys() == saved[0]["params"].keys()
    for name, tensor in saved[0]["params"].items():
        assert torch.equal(loaded[name], tensor), name
        assert torch.equal(saved[1]["params"][name], tensor), name


def test_settings_sequence_parallelism_cannot_run_with_are_refused(tiny_model, one_process_group):
    with pytest.raises(UlyssesConfigError, match="needs use_remove_padding=true"):
        FSDPEngineConfig(model_path=tiny_model, ulysses_sequence_parallel_size=2, use_remove_padding=False)
    with pytest.raises(UlyssesConfigError, match="attn_implementation='eager' is not supported"):
        FSDPEngineConfig(model_path=tiny_model, ulysses_sequence_parallel_size=2, attn_implementation="eager")
    with pytest.raises(UlyssesConfigError, match="at least 1"):
        FSDPEngineConfig(model_path=tiny_model, ulysses_sequence_parallel_size=0)
    # one rank in this process: 2 does not divide it
    engine = FSDPEngine(FSDPEngineConfig(model_path=tiny_model, ulysses_sequence_parallel_size=2))
    with pytest.raises(ParallelLayoutError, match="must divide the 1 ranks"):
        engine.initialize()


def test_heads_that_cannot_be_split_are_refused():
    from transformers import Qwen2Config

    with pytest.raises(UlyssesConfigError, match="must divide the model's 6 attention heads"):
        check_heads(Qwen2Config(num_attention_heads=6, num_key_value_heads=2), 4)
    with pytest.raises(UlyssesConfigError, match="3 key/value heads"):
        check_heads(Qwen2Config(num_attention_heads=12, num_key_value_heads=3), 2)
    check_heads(Qwen2Config(num_attention_heads=8, num_key_value_heads=2), 4)  # kv repeated
    check_heads(Qwen2Config(num_attention_heads=8, num_key_value_heads=4), 2)  # kv split


def test_layout_rules_of_the_mesh():
    from verl.core.parallel_dims import ParallelDims

    dims = ParallelDims(world_size=8, dp_replicate=2, dp_shard=2, cp=2)
    assert dims.dp == 4 and dims.sizes() == {"dp_replicate": 2, "dp_shard": 2, "cp": 2}


@pytest.mark.parametrize("sp", [2, 3, 4])
@pytest.mark.parametrize("share", [True, False])
def test_the_slices_cover_the_row_and_every_prediction_once(sp, share):
    """Checked against the unsplit inputs: the ranks' slices laid end to end are the row (plus a padding
    sequence at positions 0..), and their predictions put back in order are the micro-batch's."""
    from verl.engines.fsdp.packing import build_model_inputs
    from verl.engines.fsdp.ulysses import split

    t = grouped_batch(prompts=3, n=3, prompt_len=7, response_len=5, seed=sp).batch
    inputs = build_model_inputs(
        t["input_ids"], t["attention_mask"], t["position_ids"], t["responses"], True, share_prompts=share
    )
    shards = [split(inputs, None, sp, rank) for rank in range(sp)]
    ids = torch.cat([s.local.input_ids for s in shards], dim=1)
    pos = torch.cat([s.local.position_ids for s in shards], dim=1)
    length = inputs.input_ids.shape[1]
    assert ids.shape[1] % sp == 0 and ids.shape[1] - length < sp
    assert torch.equal(ids[:, :length], inputs.input_ids) and torch.equal(pos[:, :length], inputs.position_ids)
    assert pos[0, length:].tolist() == list(range(ids.shape[1] - length))
    width = ids.shape[1] // sp
    # what each rank predicts, in rank order, then put back by the shard's inverse permutation
    keep = torch.cat([s.local.keep[: s.counts[r]] + r * width for r, s in enumerate(shards) if not s.anchored])
    targets = torch.cat([s.local.targets for s in shards if not s.anchored])
    inverse = shards[0].inverse
    assert torch.equal(keep[inverse], inputs.keep) and torch.equal(targets[inverse], inputs.targets)
    assert [s.counts for s in shards] == [shards[0].counts] * sp and sum(shards[0].counts) == inputs.keep.numel()


def test_fsdp_shard_and_sequence_parallel_group_sizes():
    """The layouts fsdp_size and Ulysses make: a group lies within one FSDP shard group, replicated over the
    rest (HSDP); verl's fsdp_size smaller than the group (its dapo_7b_math_fsdp2_4_12.sh: 2 and 4) shards
    over the group instead, the same numbers with less memory; sizes where neither divides the other are
    refused."""
    from verl.core.parallel_dims import ParallelDims
    from verl.engines.distributed import fsdp_parallel_dims

    assert fsdp_parallel_dims(-1, 2, world=8) == ParallelDims(world_size=8, dp_shard=4, cp=2)
    assert fsdp_parallel_dims(4, 2, world=8) == ParallelDims(world_size=8, dp_replicate=2, dp_shard=2, cp=2)
    assert fsdp_parallel_dims(2, 4, world=8) == ParallelDims(world_size=8, dp_replicate=2, dp_shard=1, cp=4)
    assert fsdp_parallel_dims(2, 4, world=4) == ParallelDims(world_size=4, dp_shard=1, cp=4)
    with pytest.raises(ParallelLayoutError, match="one must divide the other"):
        fsdp_parallel_dims(4, 6, world=12)
    with pytest.raises(ParallelLayoutError, match="must divide the 12 ranks"):
        fsdp_parallel_dims(5, 1, world=12)
