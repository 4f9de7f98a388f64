"""Top-k / top-p truncation and token choice against direct reference implementations."""

import pytest
import torch

from verl.core.engine import SamplingParams
from verl.engines.rollout import sampling
from verl.engines.rollout.sampling import next_tokens, sample_rows, truncate_logits


def reference_top_p_keep(logits_row: torch.Tensor, top_p: float) -> set[int]:
    """The smallest set of most likely tokens whose probability reaches top_p."""
    probs = torch.softmax(logits_row.double(), -1)
    order = torch.argsort(probs, descending=True).tolist()
    kept, mass = set(), 0.0
    for token in order:
        kept.add(token)
        mass += probs[token].item()
        if mass >= top_p:
            break
    return kept


def test_top_k_keeps_exactly_the_k_largest():
    logits = torch.randn(5, 30, generator=torch.Generator().manual_seed(0))
    out = truncate_logits(logits, top_k=4)
    for row, orig in zip(out, logits):
        kept = set(torch.isfinite(row).nonzero().flatten().tolist())
        assert kept == set(torch.topk(orig, 4).indices.tolist())
        assert torch.equal(row[list(kept)], orig[list(kept)])


def test_top_p_keeps_the_smallest_nucleus():
    logits = torch.randn(6, 25, generator=torch.Generator().manual_seed(1)) * 2
    for top_p in (0.3, 0.75, 0.95):
        out = truncate_logits(logits, top_p=top_p)
        for row, orig in zip(out, logits):
            assert set(torch.isfinite(row).nonzero().flatten().tolist()) == reference_top_p_keep(orig, top_p)


def test_no_truncation_by_default_and_one_token_always_survives():
    logits = torch.randn(2, 10)
    assert torch.equal(truncate_logits(logits), logits)
    peaked = torch.tensor([[50.0, 0.0, 0.0]])
    assert torch.isfinite(truncate_logits(peaked, top_p=0.01)).sum() == 1


def test_sampled_tokens_and_their_log_probs():
    logits = torch.randn(4000, 12, generator=torch.Generator().manual_seed(2))
    params = SamplingParams(temperature=0.5, top_k=3)
    tokens, logprobs = next_tokens(logits, params, torch.Generator().manual_seed(3))
    top3 = torch.topk(logits, 3).indices
    assert (tokens[:, None] == top3).any(-1).all()  # only top-k tokens are drawn
    # the reported log-prob is under the temperature-scaled full distribution (not renormalised top-k)
    expected = torch.log_softmax(logits / 0.5, -1).gather(-1, tokens[:, None]).squeeze(-1)
    torch.testing.assert_close(logprobs, expected)
    greedy_tokens, greedy_lp = next_tokens(logits, SamplingParams(do_sample=False))
    assert torch.equal(greedy_tokens, logits.argmax(-1))
    torch.testing.assert_close(greedy_lp, torch.log_softmax(logits, -1).max(-1).values)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_log_probs_over_a_real_vocabulary_equal_log_softmax(temperature, top_p):
    """The drawn tokens' log-probs (taken from the sampling softmax) equal ``log_softmax`` of the scaled
    logits over a 49k vocabulary, where most tokens are far below the drawn ones."""
    logits = torch.randn(64, 49152, generator=torch.Generator().manual_seed(6)) * 4
    params = SamplingParams(temperature=temperature, top_p=top_p)
    tokens, logprobs = next_tokens(logits, params, torch.Generator().manual_seed(7))
    exact = torch.log_softmax(logits.double() / temperature, -1).gather(-1, tokens[:, None]).squeeze(-1)
    float32 = torch.log_softmax(logits / temperature, -1).gather(-1, tokens[:, None]).squeeze(-1).double()
    # As close to the float64 value as float32's own log_softmax (whose sum over 49k terms rounds ~1e-5).
    assert (logprobs.double() - exact).abs().max() <= (float32 - exact).abs().max() + 1e-6
    torch.testing.assert_close(logprobs.double(), float32, rtol=0, atol=2e-6)


def test_a_drawn_token_below_float32s_normal_range_gets_log_softmax(monkeypatch):
    """log(p) loses precision for a subnormal p (and is -inf for p = 0 after underflow); such a row's
    log-prob comes from log_softmax."""
    logits = torch.zeros(2, 5)
    logits[:, 0] = 100.0  # tokens 1-4 have p = e^-100 ~ 3.7e-44 (subnormal), and e^-110 -> 0 for token 4
    logits[:, 4] = -10.0
    monkeypatch.setattr(sampling, "sample_rows", lambda probs, generator=None: torch.tensor([3, 4]))
    tokens, logprobs = next_tokens(logits, SamplingParams(temperature=1.0))
    assert tokens.tolist() == [3, 4]
    expected = torch.log_softmax(logits.double(), -1)[[0, 1], [3, 4]]
    torch.testing.assert_close(logprobs.double(), expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("block", [256, 3, 2])  # one block for the vocabulary, several, a ragged last one
def test_inverse_cdf_draws_follow_the_distribution(block):
    """Frequencies of 200k draws per row match the probabilities (a chi-square bound far above chance
    failure), tokens of probability 0 never appear (also a whole block of them, and at a block's edge),
    and unnormalised rows are handled."""
    g = torch.Generator().manual_seed(4)
    probs = torch.softmax(torch.randn(3, 7, generator=g) * 1.5, -1)
    probs[1, 2] = 0.0  # a truncated token
    probs[1, 3:5] = 0.0  # with block 2: the whole second block, and the first entry of the third
    probs[2] *= 0.999  # a row whose sum is not exactly 1
    draws = 200_000
    tokens = sample_rows(probs.repeat_interleave(draws, 0), torch.Generator().manual_seed(5), block=block)
    tokens = tokens.view(3, draws)
    for row in range(3):
        counts = torch.bincount(tokens[row], minlength=7).double()
        expected = probs[row].double() / probs[row].double().sum() * draws
        support = expected > 0
        assert counts[~support].sum() == 0, "a token of probability 0 was drawn"
        chi2 = float(((counts[support] - expected[support]) ** 2 / expected[support]).sum())
        assert chi2 < 40.0, f"row {row}: chi-square {chi2:.1f} over {int(support.sum()) - 1} degrees of freedom"


def test_a_single_token_of_mass_is_always_drawn():
    probs = torch.zeros(5, 9)
    probs[torch.arange(5), torch.tensor([0, 3, 8, 8, 4])] = 1.0
    for block in (256, 4, 2):
        assert sample_rows(probs, torch.Generator().manual_seed(0), block=block).tolist() == [0, 3, 8, 8, 4]
