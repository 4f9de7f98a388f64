"""Helpers shared by the verl-algos tests: a tiny real tokenizer (built locally with the
``tokenizers`` library, nothing downloaded) and builders of masks, rewards and uids.

Importable from the test files as ``algos_test_helpers`` (conftest.py puts this folder on sys.path;
pytest's importlib mode does not)."""

from __future__ import annotations

import contextlib
import logging
import textwrap

import numpy as np
import torch
from verl_test_models import bpe_tokenizer, write_causal_lm, write_sequence_classifier

CORPUS = [
    "What is 12+7? Answer with a number.",
    "12 + 7 = 19. The answer is 19.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "Let's think step by step and output the final answer after ####. #### 72",
    "The answer is \\boxed{\\frac{1}{2}} so x^2 + 1 = 0.5",
    "Tom has 5 apples. He buys 3 bags with 4 apples each. How many apples does Tom have now?",
]


def build_tiny_tokenizer(with_chat_template: bool = True):
    """A byte-level BPE tokenizer trained on a few sentences, with a ChatML chat template."""
    return bpe_tokenizer(CORPUS, vocab_size=400, chat_template=with_chat_template)


def write_tiny_model(path: str, tie_word_embeddings: bool = True, seed: int = 0) -> str:
    """A 2-layer Qwen2 (hidden 64) with a 400-token byte-level BPE tokenizer and a ChatML template."""
    return write_causal_lm(path, build_tiny_tokenizer(), hidden_size=64, tie=tie_word_embeddings, seed=seed)


def write_tiny_reward_model(path: str, seed: int = 1) -> str:
    """A 2-layer Qwen2 sequence classifier (one score) sharing :func:`write_tiny_model`'s tokenizer."""
    return write_sequence_classifier(path, build_tiny_tokenizer(), seed=seed)


def random_mask(
    batch: int, length: int, generator: torch.Generator, empty_rows=(), holes: bool = False
) -> torch.Tensor:
    """Right-padded response masks of random lengths (rows in ``empty_rows`` all zero); with
    ``holes``, some interior tokens masked too (multi-turn tool output)."""
    lengths = torch.randint(1, length + 1, (batch,), generator=generator)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    if holes:
        mask = mask * (torch.rand(batch, length, generator=generator) > 0.2).float()
    for row in empty_rows:
        mask[row] = 0
    return mask


def outcome_rewards(scores, mask: torch.Tensor) -> torch.Tensor:
    """Token-level rewards with each row's score on its last valid token (position 0 if empty)."""
    rewards = torch.zeros_like(mask)
    for i, score in enumerate(scores):
        valid = torch.nonzero(mask[i]).flatten()
        rewards[i, int(valid[-1]) if len(valid) else 0] = float(score)
    return rewards


def uids(*group_sizes: int) -> np.ndarray:
    out = []
    for g, size in enumerate(group_sizes):
        out += [f"prompt-{g}"] * size
    arr = np.empty(len(out), dtype=object)
    arr[:] = out
    return arr


def agg_reference(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, scale: float) -> torch.Tensor:
    """The mode's formula over the whole batch, by explicit loops (autograd flows through loss_mat)."""
    total = loss_mat.new_zeros(())
    tokens, seqs = 0, 0
    for i in range(loss_mat.shape[0]):
        n_i = int(sum(float(m) for m in mask[i]))
        row = loss_mat.new_zeros(())
        for t in range(loss_mat.shape[1]):
            if mask[i, t]:
                row = row + loss_mat[i, t]
        tokens += n_i
        if n_i == 0:
            continue
        seqs += 1
        if mode == "token-mean":
            total = total + row
        elif mode == "seq-mean-token-sum":
            total = total + row
        elif mode == "seq-mean-token-mean":
            total = total + row / n_i
        elif mode == "seq-mean-token-sum-norm":
            total = total + row / scale
    return total / (tokens if mode == "token-mean" else seqs)


#: A reward that varies between samples of a random model, so every group has a learning signal
#: (and DAPO's dynamic sampling keeps groups): it also exercises custom_reward_function loading.
VARIED_REWARD = textwrap.dedent(
    """
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": float(len(solution_str) % 3) / 2.0, "acc": float(len(solution_str) % 2)}
    """
)


@contextlib.contextmanager
def closing_new_log_handlers():
    """In-process ``verl train`` adds a train.log handler per run folder to the root logger: close the
    ones added inside this block."""
    before = set(logging.getLogger().handlers)
    yield
    for handler in set(logging.getLogger().handlers) - before:
        logging.getLogger().removeHandler(handler)
        handler.close()
