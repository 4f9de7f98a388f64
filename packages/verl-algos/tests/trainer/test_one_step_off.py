"""The one-step-off-policy schedule (``async_training.mode=one_step_off``): its config rules, and a run on a
rollout pool of its own that samples what a hand-rolled reference of the same schedule samples and ends with
its weights (to fp32 rounding)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cli_runs import comparable, tiny_overrides, write_reward
from safetensors.torch import load_file

import verl.algos.trainer.ppo_trainer as ppo_trainer
from verl.algos.config import load_config
from verl.algos.config.consistency import check_consistency
from verl.algos.run import checkpoint_layout as layout
from verl.algos.tracking import read_metrics
from verl.algos.trainer import rollout_phase as rollout
from verl.algos.trainer.main import run
from verl.core.config import ConfigError

ONE_STEP_OFF = ["trainer.n_gpus_per_node=1", "rollout.n_gpus_per_node=1"]


def test_the_recipe_is_a_valid_one_step_off_run():
    cfg = load_config("grpo_one_step_off", [])
    check_consistency(cfg)
    assert cfg.async_training.mode == "one_step_off" and not cfg.actor_rollout_ref.hybrid_engine
    assert cfg.algorithm.rollout_correction.bypass_mode and cfg.actor_rollout_ref.rollout.calculate_log_probs


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["actor_rollout_ref.hybrid_engine=true"],
            r"needs the rollout on a pool of its own: set .*hybrid_engine=false",
        ),
        (["algorithm.filter_groups.enable=true"], r"filter_groups.enable=true \(dynamic sampling\)"),
        (["algorithm.adv_estimator=remax"], r"adv_estimator=remax generates a greedy baseline"),
    ],
)
def test_what_one_step_off_cannot_draw_ahead_is_refused_before_ray_starts(overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_consistency(load_config("grpo_one_step_off", overrides))


class SequentialOneStepOff(ppo_trainer.PPOTrainer):
    """The reference: the same schedule without overlap or a rollout pool. The hybrid engine generates step
    k+1's batch with the weights from before step k's update, and only then does step k train."""

    ahead: tuple[object, dict] | None = None

    def _scored(self, step: int) -> tuple[object, dict]:
        """Step ``step``'s scored batch, and the metrics of its rollout (logged at the step that trains it)."""
        metrics: dict = {}
        prompts = self._next_prompts(0, step)
        sampling = rollout.training_sampling(self.config, self.generation_seed(step))
        batch = rollout.generate(self.rollout_workers, prompts, sampling, metrics)
        return rollout.score(self.reward_fn, self.rm, batch, metrics), metrics

    def _generate_scored(self, metrics):
        step = self.global_step
        batch, rollout_metrics = self.ahead if self.ahead is not None else self._scored(step)
        self.ahead = self._scored(step + 1) if step < self.total_steps else None
        metrics.update(rollout_metrics)
        return batch


def actor_tensors(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    """The actor's weights (``...:model.*``) and optimizer state in a checkpoint (not its RNG state: the
    reference's process also samples, the one-step-off actor's does not)."""
    folder = layout.step_dir(run_dir, step) / "actor"
    tensors = {}
    for path in sorted(folder.rglob("*.safetensors")):
        if path.relative_to(folder).parts[0] == "rng":
            continue
        for name, tensor in load_file(str(path)).items():
            tensors[f"{path.relative_to(folder)}:{name}"] = tensor
    return tensors


def same_schedule(record: dict) -> dict:
    """What both runs log alike: not timings, nor how weights travelled, nor the lag only one run measures."""
    return {k: v for k, v in comparable(record).items() if not k.startswith(("weight_sync/", "async/"))}


#: metrics of the sampled tokens alone: equal only if both runs sampled the same responses
SAMPLED = ("response_length/", "prompt_length/", "critic/score/", "critic/rewards/")


def assert_same_run(record: dict, expected: dict) -> None:
    """The same samples exactly; everything computed from them equal to fp32 rounding. The reference's single
    process has 2 torch threads where each of the split run's 2 processes has 1 (they share the cores), and
    sums over a different number of threads round differently."""
    mine, theirs = same_schedule(record), same_schedule(expected)
    assert mine.keys() == theirs.keys()
    for key, value in mine.items():
        if key.startswith(SAMPLED):
            assert value == theirs[key], key
        else:
            assert value == pytest.approx(theirs[key], rel=1e-4, abs=1e-5), key


@pytest.mark.slow
def test_one_step_off_ends_with_the_weights_of_a_hand_rolled_reference_of_its_schedule(
    tiny_model_dir, tmp_path, ray_session, monkeypatch
):
    reward = write_reward(tmp_path)
    steps = 3
    common = ["trainer.save_freq=2", "trainer.test_freq=-1", "trainer.val_before_train=false"]
    overlapped = tmp_path / "one_step_off"
    run(
        load_config(
            "grpo_one_step_off", tiny_overrides(tiny_model_dir, overlapped, reward, steps, *common, *ONE_STEP_OFF)
        )
    )

    reference = tmp_path / "reference"
    monkeypatch.setattr(ppo_trainer, "PPOTrainer", SequentialOneStepOff)
    hybrid = ["async_training.mode=sync", "actor_rollout_ref.hybrid_engine=true", "trainer.n_gpus_per_node=1"]
    run(load_config("grpo_one_step_off", tiny_overrides(tiny_model_dir, reference, reward, steps, *common, *hybrid)))

    mine, theirs = read_metrics(str(overlapped)), read_metrics(str(reference))
    assert [r["step"] for r in mine] == [r["step"] for r in theirs] == list(range(1, steps + 1))
    for record, expected in zip(mine, theirs):
        assert_same_run(record, expected)
    # the first batch comes from the initial weights, every later one from the weights one update back
    assert [r["async/staleness"] for r in mine] == [0.0] + [1.0] * (steps - 1)
    # a push before every rollout: the first, and one per step that draws the next batch (all but the last)
    assert [("timing_s/weight_sync" in r) for r in mine] == [True] * (steps - 1) + [False]
    # step 2's checkpoint holds the data order's position after the 2 batches trained, not after the third
    # that was drawn ahead (a resumed run draws it again)
    assert layout.read_trainer_state(layout.step_dir(overlapped, 2))["batch_order"] == {"epoch": 0, "batch_in_epoch": 2}
    final, expected_final = actor_tensors(overlapped, steps), actor_tensors(reference, steps)
    assert final.keys() == expected_final.keys() and final
    weights = [name for name in final if ":model." in name]
    assert weights
    for name in weights:
        # Adam turns rounding-level gradient differences into update differences of up to ~1% of a step
        # (lr 1e-3) where a gradient is near zero: 1e-5 measured; a different batch moves weights by ~lr
        torch.testing.assert_close(final[name], expected_final[name], rtol=0, atol=1e-4)
