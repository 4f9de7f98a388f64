"""Chunked log-probs/entropy against the textbook formula (naive float log_softmax) on random inputs."""

import pytest
import torch

from verl.engines.fsdp.logprob import logprobs_from_logits, sum_pi_squared_from_logits


def naive(logits, targets, temperature):
    logp_all = torch.log_softmax(logits.double() / temperature, dim=-1)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_values_match_reference(chunk_size, temperature):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(53, 211, generator=g) * 4
    targets = torch.randint(0, 211, (53,), generator=g)
    logp, entropy = logprobs_from_logits(
        logits, targets, temperature=temperature, chunk_size=chunk_size, compute_entropy=True
    )
    ref_logp, ref_entropy = naive(logits, targets, temperature)
    assert logp.dtype == torch.float32 and logp.shape == (53,)
    torch.testing.assert_close(logp.double(), ref_logp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy.double(), ref_entropy, atol=1e-5, rtol=1e-5)


def test_gradients_match_reference():
    g = torch.Generator().manual_seed(1)
    base = torch.randn(40, 97, generator=g) * 3
    targets = torch.randint(0, 97, (40,), generator=g)
    weights = torch.randn(40, generator=g)

    chunked = base.clone().requires_grad_(True)
    logp, entropy = logprobs_from_logits(chunked, targets, temperature=0.8, chunk_size=9, compute_entropy=True)
    ((logp * weights).sum() + 0.3 * entropy.sum()).backward()

    reference = base.clone().double().requires_grad_(True)
    ref_logp, ref_entropy = naive(reference, targets, 0.8)
    ((ref_logp * weights.double()).sum() + 0.3 * ref_entropy.sum()).backward()
    torch.testing.assert_close(chunked.grad.double(), reference.grad, atol=1e-5, rtol=1e-5)


def test_bf16_logits_are_upcast_per_chunk():
    g = torch.Generator().manual_seed(2)
    logits = (torch.randn(16, 50, generator=g) * 2).bfloat16()
    targets = torch.randint(0, 50, (16,), generator=g)
    logp, entropy = logprobs_from_logits(logits, targets, chunk_size=5)
    assert logp.dtype == torch.float32 and entropy is None
    torch.testing.assert_close(logp.double(), naive(logits.float(), targets, 1.0)[0], atol=1e-5, rtol=1e-5)


def test_empty_input_and_bad_arguments():
    logp, entropy = logprobs_from_logits(torch.zeros(0, 10), torch.zeros(0, dtype=torch.long), compute_entropy=True)
    assert logp.shape == (0,) and entropy.shape == (0,)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        logprobs_from_logits(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), temperature=0.0)
    with pytest.raises(ValueError, match="expected logits"):
        logprobs_from_logits(torch.zeros(2, 3), torch.zeros(3, dtype=torch.long))


@pytest.mark.parametrize("chunk_size", [1, 7, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_sum_pi_squared_matches_reference(chunk_size, temperature):
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(29, 53, generator=g) * 3
    squared = sum_pi_squared_from_logits(logits, temperature=temperature, chunk_size=chunk_size)
    ref = []
    for row in logits.double() / temperature:
        z = [float(x) for x in row]
        top = max(z)
        exps = [pow(2.718281828459045, x - top) for x in z]
        total = sum(exps)
        ref.append(sum((e / total) ** 2 for e in exps))
    assert squared.dtype == torch.float32 and squared.shape == (29,)
    torch.testing.assert_close(squared.double(), torch.tensor(ref, dtype=torch.float64), atol=1e-6, rtol=1e-5)
    assert sum_pi_squared_from_logits(logits[:0]).shape == (0,)
