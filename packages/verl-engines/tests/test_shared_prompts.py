"""Prompt sharing: n responses to one prompt computed over the prompt once give the same log-probs,
entropies, values and gradients as the plain packed layout (the slow reference), on random inputs."""

import pytest
import torch
from engine_helpers import make_batch
from rank_programs import make_engine, train_step

from verl.core.protocol import DataProto
from verl.engines.fsdp import FSDPEngine, FSDPEngineConfig, FSDPValueEngine
from verl.engines.fsdp.packing import build_model_inputs, prompt_group_units, prompt_groups
from verl.engines.fsdp.varlen_attention import segments

pytestmark = pytest.mark.usefixtures("one_process_group")


def grouped_batch(prompts: int, n: int, prompt_len: int, response_len: int, seed: int) -> DataProto:
    """``prompts`` random prompts with ``n`` random responses each, rows shuffled (groups interleave)."""
    base = make_batch(prompts, prompt_len, response_len, seed=seed)
    rows = make_batch(prompts * n, prompt_len, response_len, seed=seed + 1)
    width = prompt_len
    for key in ("input_ids", "attention_mask"):
        rows[key][:, :width] = base[key].repeat_interleave(n, dim=0)[:, :width]
    rows["prompts"] = rows["input_ids"][:, :width]
    rows["position_ids"] = (rows["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    order = torch.randperm(prompts * n, generator=torch.Generator().manual_seed(seed))
    tensors = {k: v[order] for k, v in rows.items()}
    tensors["advantages"] = torch.randn(prompts * n, response_len, generator=torch.Generator().manual_seed(seed))
    return DataProto.from_dict(tensors, meta_info={"temperature": 0.7, "compute_entropy": True})


def forward(engine_cls, model_path, batch, share, **config):
    engine = engine_cls(FSDPEngineConfig(model_path=model_path, share_prompts=share, **config))
    engine.initialize()
    with engine.eval_mode():
        return engine.forward_only(batch, compute_entropy=engine_cls is FSDPEngine)


def test_the_shared_layout_holds_each_prompt_once():
    batch = grouped_batch(prompts=3, n=4, prompt_len=6, response_len=5, seed=0)
    t = batch.batch
    groups = prompt_groups(t["input_ids"], t["attention_mask"], 5)
    assert sorted(len(g) for g in groups) == [4, 4, 4]
    shared = build_model_inputs(
        t["input_ids"], t["attention_mask"], t["position_ids"], t["responses"], True, share_prompts=True
    )
    plain = build_model_inputs(t["input_ids"], t["attention_mask"], t["position_ids"], t["responses"], True)
    prompt_tokens = sum(int(t["attention_mask"][g[0], :6].sum()) for g in groups)
    assert shared.input_ids.shape[1] == prompt_tokens + int(t["response_mask"].sum())
    assert shared.input_ids.shape[1] < plain.input_ids.shape[1]
    assert torch.equal(shared.targets, plain.targets) and shared.keep.numel() == plain.keep.numel()
    # every kept position holds the token right before its target in the original sequence
    assert torch.equal(shared.input_ids[0, shared.keep], plain.input_ids[0, plain.keep])
    # 3 prompts, 12 responses: 3 segments start at 0, the other 9 continue a prompt
    found = segments(shared.position_ids[0])
    assert sum(1 for *_, q in found if q == 0) == 3 and sum(1 for *_, q in found if q > 0) == 9


@pytest.mark.parametrize("model_fixture", ["tiny_model", "tiny_tied_model"])
def test_shared_log_probs_and_entropy_match_the_plain_layout(model_fixture, request):
    path = request.getfixturevalue(model_fixture)
    batch = grouped_batch(prompts=3, n=4, prompt_len=7, response_len=6, seed=2)
    shared = forward(FSDPEngine, path, batch, True, ppo_micro_batch_size_per_gpu=12)
    plain = forward(FSDPEngine, path, batch, False, ppo_micro_batch_size_per_gpu=12)
    torch.testing.assert_close(shared["log_probs"], plain["log_probs"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared["entropy"], plain["entropy"], atol=1e-5, rtol=1e-5)


def test_shared_values_match_the_plain_layout(tiny_model):
    batch = grouped_batch(prompts=2, n=3, prompt_len=5, response_len=4, seed=3)
    shared = forward(FSDPValueEngine, tiny_model, batch, True)["values"]
    plain = forward(FSDPValueEngine, tiny_model, batch, False)["values"]
    assert shared.abs().sum() > 0
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dynamic", [False, True])
def test_shared_gradients_match_the_plain_layout(tiny_model, dynamic):
    batch = grouped_batch(prompts=3, n=3, prompt_len=6, response_len=5, seed=4)
    options = dict(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=20) if dynamic else {}
    plain = train_step(make_engine(tiny_model, share_prompts=False, **options), batch, 0, 1)
    shared = train_step(make_engine(tiny_model, share_prompts=True, **options), batch, 0, 1)
    assert shared["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-5)
    for name, grad in plain["grads"].items():
        torch.testing.assert_close(shared["grads"][name], grad, atol=1e-6, rtol=1e-4)


def test_token_budget_keeps_a_prompts_responses_together():
    batch = grouped_batch(prompts=3, n=4, prompt_len=6, response_len=5, seed=5)
    t = batch.batch
    seqlens = t["attention_mask"].sum(-1).tolist()
    units = prompt_group_units(batch, seqlens, max_tokens=1000)
    assert len(units) == 3  # one unit per prompt when the budget is large
    prompt_of = {tuple(t["prompts"][r].tolist()) for rows, _ in units for r in rows[:1]}
    assert len(prompt_of) == 3
    small = prompt_group_units(batch, seqlens, max_tokens=max(seqlens) + 2)
    assert all(tokens <= max(seqlens) + 2 for _, tokens in small)  # big groups are cut to fit the budget
    assert sorted(r for rows, _ in small for r in rows) == list(range(12))


def test_a_restart_past_its_prompt_is_refused():
    with pytest.raises(ValueError, match="must follow its prompt"):
        segments(torch.tensor([0, 1, 2, 7, 8]))
