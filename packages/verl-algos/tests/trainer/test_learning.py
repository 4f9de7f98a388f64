"""The learning test: GRPO really learns. A tiny model warm-started with SFT on a synthetic task reaches
a held-out validation accuracy clearly above its start after a few dozen GRPO steps.

Everything is the real thing: ``run_sft`` then ``run`` (the functions behind ``verl sft`` and ``verl
train``), 2 Ray workers, FSDP2 on gloo, the HF rollout of the hybrid engine, the numeric reward, greedy
validation on the generator's test split, whose problems never appear in training.

Task: the built-in ``arithmetic`` task, ``a + b`` with a and b in 0..49 (2,500 problems: 128 held out
for validation, the rest for training). The range is chosen so that the test measures learning of a
skill and not memorization. With a and b in 0..9 or 0..20 there are too few problems: a tiny model
memorizes the training ones, SFT leaves a wide train/validation gap (at 0..20: 75% vs 32% greedy
accuracy), and GRPO lifts the training reward while validation stalls near 46% (measured).
At 0..49 the training set is too large to memorize in the steps we run (GRPO sees each training
problem at most once), while every problem uses the same two small tables (the digit sum and the
carry), so what the model learns on training problems carries over to held-out ones: train and
validation accuracy move together.

Model: a random 2-layer Qwen2 (hidden 128, untied embeddings) with a byte-level BPE tokenizer that
keeps each digit a token (``build_tiny_model_folder``). SFT on the worked answers (``"12 + 30 = 42"``)
for 250 steps teaches the format and part of the addition: greedy validation accuracy is partial
(17-47% on seeds 0-3). GRPO then trains on the reward alone.

Settings, and why (tried on the 2 shared CPU cores of the development machine):
- rollout.n=8, 32 prompts per step: with a group of 8 per prompt, a ~40%-accurate model gets a mixed
  group (a learning signal) for most prompts.
- lr 2e-4 with 5 warmup steps and a cosine decay over the 40 steps. Without warmup the first steps of
  a fresh Adam (each parameter moves by about lr, whatever the gradient's size) dropped the training
  reward for a few steps; 5e-4 collapsed it. With a constant lr the validation accuracy swung by +-8
  points between evaluations; the decay settles the final model.
- 2 mini-batches per step and 2 PPO epochs over each batch: generation is the expensive part, and
  reusing its samples once more raised the smallest gain over seeds 0-2 from +16 to +21 points.
- max_response_length=16: the longest answer, ``"49 + 49 = 98"`` and the eos, is 12 tokens.
- Every seed is fixed: model init, data split and order, rollout sampling.

Measured with exactly this test's settings, held-out greedy accuracy before -> after GRPO:
seed 0 (the test's): 0.172 -> 0.680; seed 1: 0.438 -> 0.719; seed 2: 0.461 -> 0.703;
seed 3: 0.469 -> 0.781. The smallest gain is +24.2 points and x1.53; the thresholds (MIN_GAIN,
MIN_RATIO) are about half of that.

The test takes about 3 to 4 minutes on 2 busy CPU cores (Ray start, two worker groups, 250 SFT steps,
40 GRPO steps of 256 samples, 2 validations of 128 prompts).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from verl_test_models import bpe_tokenizer, write_causal_lm

from verl.algos.config import load_config
from verl.algos.config.sft_schema import SFTConfig
from verl.algos.data.arithmetic import generate_arithmetic
from verl.algos.trainer.main import run
from verl.algos.trainer.sft_main import run_sft
from verl.core.config import build_config

SEED = 0
#: Options of the built-in arithmetic task (``data.builtin.*``), besides the seed.
TASK = {"max_value": 49, "val_size": 128}
SFT_STEPS = 250
GRPO_STEPS = 40
#: Required gain of held-out accuracy, in absolute points and relative to the start.
MIN_GAIN = 0.12
MIN_RATIO = 1.25


def task_corpus(seed: int) -> list[str]:
    """The texts the tokenizer is trained on: the training split's questions and worked answers."""
    train = generate_arithmetic(seed=seed, **TASK)["train"]
    return [row["prompt"][0]["content"] for row in train] + [row["extra_info"]["solution"] for row in train]


def data_overrides(seed: int) -> list[str]:
    return [
        "data.train_files=[builtin:arithmetic]",
        "data.val_files=[builtin:arithmetic]",
        f"data.builtin.seed={seed}",
        *(f"data.builtin.{key}={value}" for key, value in TASK.items()),
        f"data.seed={seed}",
        "data.max_prompt_length=32",
        "data.max_response_length=16",
    ]


def sft_warm_start(model: str, out: Path, seed: int) -> str:
    """``verl sft`` for SFT_STEPS steps; returns the exported Hugging Face folder."""
    return sft(model, out, seed, SFT_STEPS, data_overrides(seed))


def sft(model: str, out: Path, seed: int, steps: int, data: list[str]) -> str:
    """``verl sft`` of ``model`` for ``steps`` steps at lr 1e-3 on the data that the ``data.*`` overrides
    ``data`` name (the learning tests' warm starts); returns the exported Hugging Face folder."""
    cfg = build_config(
        SFTConfig,
        overrides=[
            f"model.path={model}",
            *data,
            "data.train_batch_size=32",
            "data.micro_batch_size_per_gpu=16",
            "optim.lr=1e-3",
            "optim.lr_scheduler_type=constant",
            f"trainer.total_training_steps={steps}",
            "trainer.total_epochs=10",
            "trainer.n_gpus_per_node=2",
            f"trainer.seed={seed}",
            f"trainer.default_local_dir={out}",
            "trainer.logger=[file]",
        ],
    )
    return run_sft(cfg)


def grpo(model: str, out: Path, seed: int, extra: tuple[str, ...] = ()) -> dict:
    """``verl train`` (GRPO) for GRPO_STEPS steps; returns {"val_before", "val_after", "steps"}.
    ``extra``: more overrides (to try other settings)."""
    cfg = load_config(
        "grpo",
        [
            f"actor_rollout_ref.model.path={model}",
            *data_overrides(seed),
            "data.train_batch_size=32",
            "actor_rollout_ref.rollout.n=8",
            "actor_rollout_ref.rollout.temperature=1.0",
            "actor_rollout_ref.actor.ppo_mini_batch_size=16",
            "actor_rollout_ref.actor.ppo_epochs=2",
            "actor_rollout_ref.actor.optim.lr=2e-4",
            "actor_rollout_ref.actor.optim.lr_warmup_steps=5",
            "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine",
            f"trainer.total_training_steps={GRPO_STEPS}",
            f"trainer.test_freq={GRPO_STEPS}",
            "trainer.val_before_train=true",
            "trainer.save_freq=-1",
            "trainer.n_gpus_per_node=2",
            f"trainer.seed={seed}",
            f"trainer.default_local_dir={out}",
            "trainer.logger=[file]",
            "trainer.plot_curves=false",
            *extra,
        ],
    )
    return run(cfg)


def build_tiny_model_folder(
    path: str,
    corpus: list[str],
    *,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    seed: int,
    vocab_size: int = 128,
    max_positions: int = 256,
):
    """A random Qwen2 (untied) whose byte-level BPE tokenizer is trained on the task's texts with every digit
    its own token: prompt words merge into few tokens, numbers are spelled digit by digit, which is what
    lets a tiny transformer compute with them."""
    texts = [*corpus, "user", "assistant", "system", "\n"]
    tokenizer = bpe_tokenizer(texts, vocab_size=vocab_size, individual_digits=True, full_byte_alphabet=False)
    return write_causal_lm(
        path,
        tokenizer,
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_heads,
        max_positions=max_positions,
        seed=seed,
    )


_WARM_STARTS: dict[int, str] = {}


def warm_start(root: Path, seed: int) -> str:
    """The tiny model after its SFT warm start, built once per seed and test session (the LoRA learning test
    starts from the same one). Needs Ray with 2 free CPU slots on the first call."""
    if seed not in _WARM_STARTS:
        model = build_tiny_model_folder(
            str(root / f"init-{seed}"), task_corpus(seed), hidden_size=128, num_layers=2, num_heads=4, seed=seed
        )
        _WARM_STARTS[seed] = sft_warm_start(model, root / f"sft-{seed}", seed)
    return _WARM_STARTS[seed]


@pytest.mark.slow
def test_grpo_lifts_held_out_accuracy_of_an_sft_warm_start(ray_session, learning_dir, tmp_path):
    summary = grpo(warm_start(learning_dir, SEED), tmp_path / "grpo", SEED)
    before, after = summary["val_before"], summary["val_after"]
    assert summary["steps"] == GRPO_STEPS
    # The warm start knows the answer format but is often wrong: there is room to learn, and something
    # to learn from (the samples of most prompts are a mix of right and wrong answers).
    assert 0.05 <= before <= 0.75, f"the SFT warm start should be partially right, got {before:.3f}"
    assert after >= before + MIN_GAIN and after >= MIN_RATIO * before, (
        f"GRPO did not learn: held-out accuracy {before:.3f} -> {after:.3f} (needs +{MIN_GAIN:.2f} and x{MIN_RATIO})"
    )
