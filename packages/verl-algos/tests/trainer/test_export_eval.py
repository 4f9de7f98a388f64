"""``verl export`` and ``verl eval`` on a real checkpoint: the exported folder loads in transformers, and
evaluating the checkpoint or the exported model reproduces the run's last validation accuracy."""

from __future__ import annotations

import pytest

from verl.algos.config import load_config
from verl.algos.run import checkpoint_layout as layout
from verl.algos.tracking import read_metrics
from verl.algos.trainer.export import export_checkpoint
from verl.algos.trainer.main import evaluate, run
from verl.core.config import ConfigError

pytestmark = pytest.mark.usefixtures("ray_session")

COMMON = [
    "trainer.n_gpus_per_node=2",
    "data.max_response_length=8",
    "data.val_max_samples=6",
    "trainer.logger=[file]",
]


def test_export_and_eval_reproduce_the_run(tiny_model_dir, tmp_path, capsys):
    """The tiny model ties lm_head to embed_tokens, as SmolLM2 does: the checkpoint stores them once."""
    out = tmp_path / "run"
    run(
        load_config(
            "grpo",
            [
                f"actor_rollout_ref.model.path={tiny_model_dir}",
                f"trainer.default_local_dir={out}",
                "trainer.total_training_steps=1",
                "trainer.save_freq=1",
                "trainer.test_freq=1",
                "data.train_batch_size=2",
                "actor_rollout_ref.rollout.n=2",
                "actor_rollout_ref.actor.optim.lr=5e-3",
                *COMMON,
            ],
        )
    )
    final_acc = read_metrics(str(out))[-1]["val/acc"]
    checkpoint = layout.latest_complete(out)
    assert checkpoint is not None

    exported = export_checkpoint(str(checkpoint), str(tmp_path / "hf"))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(exported)
    assert AutoTokenizer.from_pretrained(exported).chat_template
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    moved = [n for n, p in model.named_parameters() if not p.equal(base.get_parameter(n))]
    assert moved, "the exported weights are the base model's: the training step is missing"

    for target in (str(checkpoint), exported):
        capsys.readouterr()
        evaluate(target, None, [f"trainer.default_local_dir={tmp_path / 'eval'}", *COMMON])
        assert f"validation accuracy: {final_acc:.3f}" in capsys.readouterr().out


def test_export_refuses_an_incomplete_checkpoint(tmp_path):
    folder = layout.prepare_step_dir(tmp_path, 3)
    (folder / "actor").mkdir()
    with pytest.raises(ConfigError, match="not a complete checkpoint"):
        export_checkpoint(str(folder), str(tmp_path / "out"))
