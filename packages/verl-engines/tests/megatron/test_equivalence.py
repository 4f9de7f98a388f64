"""megatron on real gloo processes: a GPTModel loaded from a tiny HF model gives the HF model's logits
(TP1, all three architectures), and TP=2, PP=2 and TP2 x PP2 give TP1's logits, log-probs and entropy.
Log-probs and entropy are computed vocab-parallel; they are checked against a full-vocabulary reference
on random logits, and against the FSDP engine's formula on the HF model's logits of the padded batch."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import make_batch, run_ranks
from megatron_helpers import ARCHS, VOCAB, write_model
from megatron_programs import logits_and_logprobs, vocab_parallel_on_slices

from verl.core.protocol import DataProto
from verl.engines.fsdp.logprob import logprobs_from_logits
from verl.engines.fsdp.packing import response_positions, scatter_to_responses

pytestmark = pytest.mark.megatron

#: fp32, logits up to ~7 in magnitude. Measured (2 cores, torch 2.13 CPU): TP1 vs HF <= 5.0e-6 (logits),
#: 3.4e-6 (log-probs), 2.4e-6 (entropy); TP2, TP2xPP2 vs TP1 <= 5.3e-6 / 2.4e-6 / 2.9e-6; PP2 vs TP1 0.0.
LOGIT_ATOL = 2e-5
LOGPROB_ATOL = 1e-5


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("megatron_models")
    return {arch: write_model(str(root / arch), arch, seed=ARCHS.index(arch)) for arch in ARCHS}


@pytest.fixture(scope="module")
def inputs():
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    batch = DataProto.from_dict(make_batch(5, 7, 6, seed=3, vocab=VOCAB))
    return ids, batch


def hf_reference(model_dir, ids, batch, temperature=0.8):
    """HF logits of ``ids``, and log-probs / entropy of the padded ``batch`` the way the FSDP engine
    computes them (padded rows, HF position ids and attention mask)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    t = batch.batch
    with torch.no_grad():
        logits = model(ids).logits
        out = model(input_ids=t["input_ids"], attention_mask=t["attention_mask"], position_ids=t["position_ids"]).logits
    keep, valid = response_positions(t["attention_mask"], t["responses"].shape[1])
    logp, entropy = logprobs_from_logits(
        out[keep], t["responses"][valid], temperature=temperature, compute_entropy=True
    )
    return logits, scatter_to_responses(logp, valid), scatter_to_responses(entropy, valid)


@pytest.fixture(scope="module")
def tp1(models, inputs, tmp_path_factory):
    ids, batch = inputs
    dirs = [models[a] for a in ARCHS]
    result = run_ranks(
        logits_and_logprobs, 1, dirs, 1, 1, ids, batch, 2, result_dir=str(tmp_path_factory.mktemp("tp1"))
    )
    return result[0]


@pytest.mark.parametrize("arch", ARCHS)
def test_tp1_matches_hugging_face(arch, models, inputs, tp1):
    ids, batch = inputs
    logits, logp, entropy = hf_reference(models[arch], ids, batch)
    got = tp1[models[arch]]
    assert got["logits"].shape == logits.shape == (2, 12, VOCAB)  # padding columns stripped
    torch.testing.assert_close(got["logits"], logits, atol=LOGIT_ATOL, rtol=1e-5)
    torch.testing.assert_close(got["log_probs"], logp, atol=LOGPROB_ATOL, rtol=1e-5)
    torch.testing.assert_close(got["entropy"], entropy, atol=LOGPROB_ATOL, rtol=1e-5)
    assert (got["log_probs"] != 0).sum() == batch.batch["response_mask"].sum()  # zeros off the responses


@pytest.mark.parametrize(
    ("arch", "tp", "pp"),
    [("qwen3", 2, 1), ("llama", 1, 2), ("qwen2", 2, 2)],
    ids=["tp2-qwen3", "pp2-llama", "tp2xpp2-qwen2-tied"],
)
def test_parallel_layouts_match_tp1(arch, tp, pp, models, inputs, tp1, tmp_path):
    ids, batch = inputs
    ranks = run_ranks(logits_and_logprobs, tp * pp, [models[arch]], tp, pp, ids, batch, 2, result_dir=str(tmp_path))
    ref = tp1[models[arch]]
    for rank in ranks:  # every rank returns the last stage's results
        got = rank[models[arch]]
        torch.testing.assert_close(got["logits"], ref["logits"], atol=LOGIT_ATOL, rtol=1e-5)
        torch.testing.assert_close(got["log_probs"], ref["log_probs"], atol=LOGPROB_ATOL, rtol=1e-5)
        torch.testing.assert_close(got["entropy"], ref["entropy"], atol=LOGPROB_ATOL, rtol=1e-5)


def test_vocab_parallel_logprobs_match_a_full_vocabulary_reference(tmp_path):
    g = torch.Generator().manual_seed(0)
    vocab, padded, temperature = 200, 256, 0.7
    logits = 5 * torch.randn(9, padded, generator=g)
    logits[:, vocab:] = 100.0  # padding columns: huge, and must still be ignored
    targets = torch.randint(0, vocab, (9,), generator=g)
    targets[0], targets[1] = 127, 128  # either side of the TP boundary
    # Slow reference from the formula, on the real columns only.
    z = (logits[:, :vocab].double() / temperature).requires_grad_(True)
    p = torch.softmax(z, -1)
    ref_logp = torch.log(p[torch.arange(9), targets])
    ref_entropy = -(p * torch.log(p)).sum(-1)
    (ref_logp.sum() + 0.5 * ref_entropy.sum()).backward()
    ref_grad = torch.zeros(9, padded, dtype=torch.float64)
    ref_grad[:, :vocab] = z.grad / temperature
    for world in (1, 2):
        ranks = run_ranks(
            vocab_parallel_on_slices, world, logits, targets, vocab, temperature, result_dir=str(tmp_path / str(world))
        )
        grad = torch.cat([r["grad"] for r in ranks], dim=1)
        for r in ranks:
            torch.testing.assert_close(r["log_probs"].double(), ref_logp.detach(), atol=1e-5, rtol=1e-6)
            torch.testing.assert_close(r["entropy"].double(), ref_entropy.detach(), atol=1e-5, rtol=1e-6)
        torch.testing.assert_close(grad.double(), ref_grad, atol=1e-5, rtol=1e-5)
