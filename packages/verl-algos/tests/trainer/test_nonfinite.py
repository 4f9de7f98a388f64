"""Numerical faults on real runs (2 Ray workers, tiny model): a reward of extreme scale makes the
advantages, or only the loss, non-finite at step 2. ``trainer.nonfinite=skip`` skips that step (the
weights do not move) and names the samples; ``stop`` stops the run naming the step and the samples,
with the checkpoint of step 1 kept."""

from __future__ import annotations

import textwrap

import pytest
import torch

from verl.algos.config import load_config
from verl.algos.run import checkpoint_layout as layout
from verl.algos.run.nonfinite import NonFiniteError, describe, nonfinite_rows, sample_ids
from verl.algos.tracking import read_metrics
from verl.algos.trainer.main import run
from verl.core.protocol import DataProto

pytestmark = pytest.mark.usefixtures("ray_session")

N = 4  # responses per prompt; 2 prompts per step: 8 reward calls per step (the manager scores in row order)

#: From the second step on: every response 3e38 (the group mean overflows: NaN advantages), or only
#: the first of each group (finite advantages without std scaling, but the loss sum overflows).
EXTREME_REWARD = textwrap.dedent(
    """
    calls = 0

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        global calls
        calls += 1
        if calls <= 8:
            return float(len(solution_str) % 3)
        if MODE == "all" or (calls - 1) % 4 == 0:
            return 3e38  # finite in float32; a sum of two overflows
        return 0.0
    """
)


def nonfinite_run(model: str, tmp_path, mode: str, policy: str, recipe: str = "grpo"):
    reward = tmp_path / "reward.py"
    reward.write_text(f"MODE = {mode!r}\n" + EXTREME_REWARD)
    out = tmp_path / "run"
    cfg = load_config(
        recipe,
        [
            f"actor_rollout_ref.model.path={model}",
            f"trainer.default_local_dir={out}",
            f"custom_reward_function.path={reward}",
            f"trainer.nonfinite={policy}",
            "trainer.n_gpus_per_node=2",
            "trainer.total_training_steps=3",
            "trainer.save_freq=1",
            "trainer.test_freq=0",
            "trainer.val_before_train=false",
            "trainer.logger=[file]",
            "trainer.plot_curves=false",
            "data.train_batch_size=2",
            "data.max_response_length=6",
            f"actor_rollout_ref.rollout.n={N}",
            "actor_rollout_ref.actor.optim.lr=1e-2",
        ],
    )
    return cfg, out


def model_weights(step_dir) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted((step_dir / "actor").rglob("*.safetensors"))
    assert files, f"no safetensors in {step_dir}"
    return {f"{f.name}:{k}": v for f in files for k, v in load_file(str(f)).items() if "optim" not in f.name}


def test_skip_leaves_the_weights_alone_and_names_the_samples(tiny_model_dir, tmp_path, caplog):
    cfg, out = nonfinite_run(tiny_model_dir, tmp_path, "all", "skip")
    with caplog.at_level("WARNING", logger="verl.train"):
        summary = run(cfg)
    assert summary["steps"] == 3
    records = {r["step"]: r for r in read_metrics(str(out))}
    assert [records[s]["training/nonfinite_skipped"] for s in (1, 2, 3)] == [0.0, 1.0, 1.0]
    assert "actor/grad_norm" in records[1] and "actor/grad_norm" not in records[2]
    warning = next(r.getMessage() for r in caplog.records if "non-finite" in r.getMessage())
    assert "step 2: non-finite rewards or advantages in 8 sample(s)" in warning
    assert "uid=2-0-0" in warning and "index=" in warning
    before, skipped = model_weights(out / "global_step_1"), model_weights(out / "global_step_2")
    assert before.keys() == skipped.keys()
    assert all(torch.equal(before[k], skipped[k]) for k in before)


def test_stop_names_step_and_samples_and_keeps_the_checkpoint(tiny_model_dir, tmp_path):
    cfg, out = nonfinite_run(tiny_model_dir, tmp_path, "all", "stop")
    with pytest.raises(NonFiniteError, match=r"step 2: non-finite rewards or advantages in 8 sample\(s\): uid=2-0-0"):
        run(cfg)
    assert layout.is_complete(out / "global_step_1")
    assert layout.resolve_resume(str(out), "auto", None).name == "global_step_1"


def test_a_loss_overflow_with_finite_advantages_is_caught_in_the_worker(tiny_model_dir, tmp_path):
    # Dr. GRPO does not divide by the std: advantages stay finite, the token sum of the loss overflows.
    cfg, _ = nonfinite_run(tiny_model_dir, tmp_path, "first", "stop", recipe="drgrpo")
    with pytest.raises(NonFiniteError, match=r"step 2: non-finite loss or gradients in \d+ sample\(s\): uid=2-0"):
        run(cfg)


def test_rows_and_ids_of_non_finite_values():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    values = torch.tensor([[0.0, 1.0, float("nan")], [float("inf"), 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert nonfinite_rows(mask, values) == [1]  # the NaN of row 0 sits on padding
    assert nonfinite_rows(mask, torch.tensor([0.0, float("nan"), 1.0])) == [1]
    batch = DataProto.from_dict(
        {"x": torch.zeros(3)},
        non_tensors={"uid": ["1-0-0", "1-0-0", "1-0-1"], "extra_info": [{"index": 5}, {"index": 5}, {}]},
    )
    assert sample_ids(batch, [0, 2]) == ["uid=1-0-0 index=5", "uid=1-0-1"]
    assert "not attributable" in describe(3, "gradients", [])
    long = describe(3, "loss", [f"s{i}" for i in range(20)])
    assert "s15, ... (20 in all)" in long and "s16" not in long
