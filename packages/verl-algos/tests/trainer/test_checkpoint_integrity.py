"""A real checkpoint, damaged after it was written, is refused with a message that names the file and says
how to go on, by resume, ``verl export`` and ``verl eval``; and a checkpoint file replaced by a malicious
pickle is never unpickled, even when its manifest is rewritten to match."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

from verl.algos.config import load_config
from verl.algos.run import checkpoint_layout as layout
from verl.algos.trainer.export import export_checkpoint
from verl.algos.trainer.main import evaluate, run

pytestmark = pytest.mark.usefixtures("ray_session")

SHARD = "actor/state/shard-00001-model-00001-of-00001.safetensors"
RNG = "actor/rng/rank_0.safetensors"
COMMON = [
    "trainer.n_gpus_per_node=2",
    "data.train_batch_size=2",
    "data.max_response_length=8",
    "data.val_max_samples=4",
    "actor_rollout_ref.rollout.n=2",
    "trainer.logger=[file]",
    "trainer.plot_curves=false",
]


def overrides(model: str, out: Path, steps: int) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={model}",
        f"trainer.default_local_dir={out}",
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=1",
        "trainer.test_freq=0",
        "trainer.val_before_train=false",
        *COMMON,
    ]


@pytest.fixture(scope="module")
def trained(untied_model_dir, tmp_path_factory) -> Path:
    """A run folder with complete checkpoints at steps 1 and 2 (never modified: tests damage copies)."""
    out = tmp_path_factory.mktemp("trained") / "run"
    run(load_config("grpo", overrides(untied_model_dir, out, 2)))
    assert layout.latest_complete(out) == layout.step_dir(out, 2)
    return out


@pytest.fixture
def copy(trained, tmp_path) -> Path:
    return Path(shutil.copytree(trained, tmp_path / "run"))


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DAMAGE = {
    "flipped byte": (flip_byte, "has changed since it was written (sha256 mismatch)"),
    "truncated": (truncate, "were written (truncated)"),
    "deleted": (Path.unlink, "is missing"),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damaged_weights_are_refused_naming_the_file(copy, kind):
    damage, phrase = DAMAGE[kind]
    damage(layout.step_dir(copy, 2) / SHARD)
    with pytest.raises(layout.CheckpointIntegrityError) as raised:
        layout.resolve_resume(copy, "auto", None)
    message = str(raised.value)
    assert f"{SHARD} " in message and phrase in message
    assert f"trainer.resume_mode={layout.step_dir(copy, 1)}" in message  # the earlier checkpoint to take
    assert f"delete {layout.step_dir(copy, 2)}" in message
    # the suggested way on works: the earlier checkpoint is intact
    assert layout.resolve_resume(copy, str(layout.step_dir(copy, 1)), None) == layout.step_dir(copy, 1)


def test_an_added_file_is_refused(copy):
    (layout.step_dir(copy, 2) / "actor" / "state" / "extra.safetensors").write_bytes(b"{}")
    with pytest.raises(layout.CheckpointIntegrityError, match="extra.safetensors is not part of the checkpoint"):
        layout.resolve_resume(copy, "auto", None)


def test_resume_export_and_eval_refuse_a_damaged_checkpoint(copy, untied_model_dir, tmp_path):
    flip_byte(layout.step_dir(copy, 2) / SHARD)
    metrics_before = (copy / "metrics.jsonl").read_bytes()
    with pytest.raises(layout.CheckpointIntegrityError, match=SHARD):
        run(load_config("grpo", overrides(untied_model_dir, copy, 3)))
    assert (copy / "metrics.jsonl").read_bytes() == metrics_before  # nothing trained from it
    with pytest.raises(layout.CheckpointIntegrityError, match=SHARD):
        export_checkpoint(str(layout.step_dir(copy, 2)), str(tmp_path / "hf"))
    assert not (tmp_path / "hf").exists()
    with pytest.raises(layout.CheckpointIntegrityError, match=SHARD):
        evaluate(str(layout.step_dir(copy, 2)), None, [f"trainer.default_local_dir={tmp_path / 'eval'}", *COMMON])


class _Payload:
    """Unpickling this runs code: it creates ``marker``."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').close()",))


def malicious_pickle(marker: Path) -> bytes:
    return pickle.dumps(_Payload(marker))


def forge_manifest(folder):
    """What an attacker does: write a manifest of the folder as it is now, by hand."""
    from verl.algos.run import checkpoint_manifest

    skip = frozenset({layout.COMPLETE_MARKER, layout.WRITER_FILE})
    manifest = checkpoint_manifest.build_manifest(folder, 2, skip=skip)
    manifest["sequence"] = 99
    (folder / layout.COMPLETE_MARKER).write_text(json.dumps(manifest))


def test_the_payload_really_runs_code_when_unpickled(tmp_path):
    """The check that the tests below are not vacuous."""
    marker = tmp_path / "pwned"
    pickle.loads(malicious_pickle(marker))
    assert marker.exists()


@pytest.mark.parametrize("target", [SHARD, RNG])
def test_a_pickle_in_place_of_a_checkpoint_file_is_never_unpickled(copy, tmp_path, target):
    marker = tmp_path / "pwned"
    folder = layout.step_dir(copy, 2)
    (folder / target).write_bytes(malicious_pickle(marker))
    with pytest.raises(layout.CheckpointIntegrityError, match=target):
        layout.resolve_resume(copy, "auto", None)
    # An attacker who rewrites the manifest too gets past the integrity check, but not the loader: it reads
    # only safetensors and JSON, and checks each safetensors file's structure before reading tensors. (verl's
    # own mark_complete would refuse: it reads every tensor first.)
    with pytest.raises(layout.CheckpointNonFiniteError, match="is not a readable safetensors file"):
        layout.mark_complete(copy, 2, layout.read_trainer_state(folder))
    forge_manifest(folder)
    layout.verify_checkpoint(folder)
    with pytest.raises(ValueError, match=f"{target.removeprefix('actor/')} is not a valid safetensors file"):
        export_checkpoint(str(folder), str(tmp_path / "hf"))
    assert not marker.exists()


def test_a_pickled_dcp_metadata_file_is_ignored(copy, tmp_path):
    """torch.distributed.checkpoint's default format keeps its metadata as a pickle (``.metadata``); verl's
    reader never opens it: the checkpoint loads, and the pickle never runs."""
    marker = tmp_path / "pwned"
    folder = layout.step_dir(copy, 2)
    (folder / "actor" / "state" / ".metadata").write_bytes(malicious_pickle(marker))
    layout.mark_complete(copy, 2, layout.read_trainer_state(folder))
    export_checkpoint(str(folder), str(tmp_path / "hf"))
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    assert not marker.exists()


def test_remote_code_is_off_unless_asked_for():
    """A model folder's own Python code runs only with trust_remote_code=true, which no default sets."""
    cfg = load_config("grpo", [])
    for key, model in (
        ("actor_rollout_ref.model", cfg.actor_rollout_ref.model),
        ("critic.model", cfg.critic.model),
        ("reward_model.model", cfg.reward_model.model),
    ):
        assert model.trust_remote_code is False, key
