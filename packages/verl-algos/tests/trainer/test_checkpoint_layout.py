import errno
import hashlib
import json
import logging
import os

import pytest
import torch
from safetensors.torch import save_file

from verl.algos.run.checkpoint_layout import (
    COMPLETE_MARKER,
    LATEST_FILE,
    WRITER_FILE,
    CheckpointDiskFullError,
    CheckpointIntegrityError,
    CheckpointNonFiniteError,
    CheckpointOwnershipError,
    checkpoint_write,
    latest_complete,
    mark_complete,
    prepare_step_dir,
    prune_old,
    read_trainer_state,
    resolve_resume,
    step_dir,
    verify_checkpoint,
)


def save(root, step):
    folder = prepare_step_dir(root, step)
    (folder / "actor").mkdir()
    mark_complete(root, step, {"global_step": step})
    return folder


def test_complete_checkpoint_is_found_and_latest_file_written(tmp_path):
    save(tmp_path, 2)
    save(tmp_path, 4)
    assert (tmp_path / LATEST_FILE).read_text().strip() == "4"
    assert latest_complete(tmp_path) == step_dir(tmp_path, 4)
    assert read_trainer_state(latest_complete(tmp_path)) == {"global_step": 4}


def test_partial_checkpoint_is_never_picked_up(tmp_path):
    save(tmp_path, 2)
    partial = prepare_step_dir(tmp_path, 4)  # killed before mark_complete
    (partial / "actor").mkdir()
    assert latest_complete(tmp_path) == step_dir(tmp_path, 2)
    # even if the latest file were (wrongly) ahead, the incomplete folder is skipped
    (tmp_path / LATEST_FILE).write_text("4\n")
    assert latest_complete(tmp_path) == step_dir(tmp_path, 2)
    (tmp_path / LATEST_FILE).write_text("garbage")
    assert latest_complete(tmp_path) == step_dir(tmp_path, 2)


def test_rewriting_a_step_invalidates_it_until_marked_again(tmp_path):
    save(tmp_path, 2)
    folder = prepare_step_dir(tmp_path, 2)
    assert not (folder / COMPLETE_MARKER).exists()
    assert latest_complete(tmp_path) is None


def test_resolve_resume_modes(tmp_path):
    assert resolve_resume(tmp_path, "auto", None) is None  # fresh run
    save(tmp_path, 3)
    assert resolve_resume(tmp_path, "auto", None) == step_dir(tmp_path, 3)
    assert resolve_resume(tmp_path, "disable", None) is None
    assert resolve_resume(tmp_path, str(step_dir(tmp_path, 3)), None) == step_dir(tmp_path, 3)
    assert resolve_resume(tmp_path, "auto", str(step_dir(tmp_path, 3))) == step_dir(tmp_path, 3)
    prepare_step_dir(tmp_path, 5)
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        resolve_resume(tmp_path, str(step_dir(tmp_path, 5)), None)
    with pytest.raises(ValueError, match="global_step_<N> folder"):
        resolve_resume(tmp_path, str(tmp_path), None)


def test_prune_keeps_the_newest(tmp_path):
    for step in (1, 2, 3, 4):
        save(tmp_path, step)
    removed = prune_old(tmp_path, keep=2)
    assert [p.name for p in removed] == ["global_step_1", "global_step_2"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["global_step_3", "global_step_4"]
    assert prune_old(tmp_path, keep=None) == []


def test_stale_latest_file_does_not_hide_a_newer_complete_checkpoint(tmp_path):
    """A stop between the marker and the latest file: resume still takes the checkpoint just completed."""
    save(tmp_path, 2)
    save(tmp_path, 4)
    (tmp_path / LATEST_FILE).write_text("2\n")  # as if killed right after COMPLETE of step 4
    assert latest_complete(tmp_path) == step_dir(tmp_path, 4)


def test_an_abandoned_continuation_is_not_resumed(tmp_path):
    """Resumed by hand from step 2 while steps 4 and 6 of the first attempt remain: the new step 4 is the
    most recently completed checkpoint, not the old step 6."""
    for step in (2, 4, 6):
        save(tmp_path, step)
    save(tmp_path, 4)  # the second attempt, resumed from step 2, saves step 4 again
    assert latest_complete(tmp_path) == step_dir(tmp_path, 4)
    save(tmp_path, 6)
    assert latest_complete(tmp_path) == step_dir(tmp_path, 6)


def test_prune_keeps_the_most_recently_completed_and_removes_leftovers(tmp_path):
    for step in (2, 4, 6):
        save(tmp_path, step)
    leftover = prepare_step_dir(tmp_path, 3)  # a write killed halfway
    (leftover / "actor.tmp").mkdir()
    husk = save(tmp_path, 1)  # a prune killed halfway: marker gone, files left (writer.json goes last)
    (husk / COMPLETE_MARKER).unlink()
    save(tmp_path, 4)  # resumed from 2: the new step 4 is the most recent; a step-number rule would prune it
    ahead = prepare_step_dir(tmp_path, 8)  # a partial folder ahead of the newest is kept for its own rewrite
    removed = prune_old(tmp_path, keep=1)
    assert [p.name for p in removed] == ["global_step_1", "global_step_2", "global_step_3", "global_step_6"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["global_step_4", "global_step_8"]
    assert ahead.is_dir() and latest_complete(tmp_path) == step_dir(tmp_path, 4)


def test_leftovers_are_removed_even_when_keeping_every_checkpoint(tmp_path):
    save(tmp_path, 2)
    prepare_step_dir(tmp_path, 3)
    save(tmp_path, 4)
    assert [p.name for p in prune_old(tmp_path, keep=None)] == ["global_step_3"]


def test_the_marker_is_a_manifest_of_every_file(tmp_path):
    folder = prepare_step_dir(tmp_path, 2)
    (folder / "actor" / "state").mkdir(parents=True)
    shard = folder / "actor" / "state" / "shard.safetensors"
    save_file({"w": torch.ones(250)}, shard)
    data = shard.read_bytes()
    mark_complete(tmp_path, 2, {"global_step": 2})
    manifest = json.loads((folder / COMPLETE_MARKER).read_text())
    assert sorted(manifest["files"]) == ["actor/state/shard.safetensors", "trainer_state.json"]
    assert manifest["files"]["actor/state/shard.safetensors"] == {
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    verify_checkpoint(folder)


def test_a_marker_of_an_older_verl_is_accepted_with_a_warning(tmp_path, caplog):
    folder = save(tmp_path, 2)
    (folder / COMPLETE_MARKER).write_text("2\n")
    with caplog.at_level(logging.WARNING):
        assert resolve_resume(tmp_path, "auto", None) == folder
    assert "no manifest" in caplog.text


def test_full_disk_removes_the_partial_folder_and_says_what_to_do(tmp_path):
    save(tmp_path, 2)
    with pytest.raises(CheckpointDiskFullError) as raised:
        with checkpoint_write(tmp_path, 4) as folder:
            (folder / "actor.tmp").mkdir()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder / "actor.tmp" / "x"))
    message = str(raised.value)
    assert "no space left on device while writing checkpoint" in message and str(step_dir(tmp_path, 4)) in message
    assert "trainer.default_local_dir" in message and f"trainer.resume_mode={step_dir(tmp_path, 2)}" in message
    assert raised.value.errno == errno.ENOSPC
    assert not step_dir(tmp_path, 4).exists()
    assert latest_complete(tmp_path) == step_dir(tmp_path, 2)


def test_other_write_errors_pass_through_and_leave_the_folder_incomplete(tmp_path):
    with pytest.raises(RuntimeError, match="worker died"):
        with checkpoint_write(tmp_path, 2):
            raise RuntimeError("worker died")
    assert step_dir(tmp_path, 2).is_dir() and latest_complete(tmp_path) is None


def test_a_damaged_marker_of_the_latest_checkpoint_is_refused_not_skipped(tmp_path):
    save(tmp_path, 2)
    folder = save(tmp_path, 4)
    (folder / COMPLETE_MARKER).write_text('{"kind": "verl-checkpoint-manifest", "files": {')  # torn
    assert latest_complete(tmp_path) == folder
    with pytest.raises(CheckpointIntegrityError, match="manifest is not valid JSON") as raised:
        resolve_resume(tmp_path, "auto", None)
    assert f"trainer.resume_mode={step_dir(tmp_path, 2)}" in str(raised.value)
    save(tmp_path, 6)  # a later save still numbers itself after the others
    assert latest_complete(tmp_path) == step_dir(tmp_path, 6)


# -- lineage: rotation and rewrites touch only the writing run's own folders -----------------------------------
def save_as(root, step, lineage, files=None):
    folder = prepare_step_dir(root, step, lineage)
    for name, data in (files or {"actor/model.bin": b"w" * 64}).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    mark_complete(root, step, {"global_step": step}, lineage)
    return folder


def plant_foreign_files(root):
    """What a user keeps in a run folder, and a folder named like a checkpoint that verl did not write."""
    (root / "notes.txt").write_text("my notes")
    mine = step_dir(root, 5)
    (mine / "actor").mkdir(parents=True)
    (mine / "actor" / "weights_i_saved.bin").write_bytes(b"precious")
    return {
        p: p.read_bytes() for p in root.rglob("*") if p.is_file() and "global_step_5" in str(p) or p.name == "notes.txt"
    }


def test_rotation_removes_only_checkpoints_of_its_own_lineage(tmp_path):
    earlier = [save_as(tmp_path, step, "earlier-run") for step in (1, 2)]
    foreign = plant_foreign_files(tmp_path)
    for step in (3, 4, 6):
        save_as(tmp_path, step, "this-run")
    removed = prune_old(tmp_path, keep=1, lineage="this-run")
    assert [p.name for p in removed] == ["global_step_3", "global_step_4"]
    assert all(folder.is_dir() and (folder / COMPLETE_MARKER).is_file() for folder in earlier)
    for folder in earlier:
        verify_checkpoint(folder)  # intact
    assert {p: p.read_bytes() for p in foreign} == foreign
    # the earlier run, resumed, rotates its own and leaves this run's alone
    save_as(tmp_path, 7, "earlier-run")
    assert [p.name for p in prune_old(tmp_path, keep=1, lineage="earlier-run")] == ["global_step_1", "global_step_2"]
    assert step_dir(tmp_path, 6).is_dir() and step_dir(tmp_path, 5).is_dir()


def test_a_partial_folder_of_another_lineage_or_of_no_run_is_not_removed(tmp_path):
    save_as(tmp_path, 2, "this-run")
    other = prepare_step_dir(tmp_path, 3, "other-run")  # another run's interrupted write
    (other / "actor.tmp").mkdir()
    foreign = plant_foreign_files(tmp_path)
    save_as(tmp_path, 6, "this-run")
    assert [p.name for p in prune_old(tmp_path, keep=None, lineage="this-run")] == []
    assert (other / "actor.tmp").is_dir() and {p: p.read_bytes() for p in foreign} == foreign


def test_rewriting_a_step_refuses_a_folder_of_another_lineage_or_of_no_run(tmp_path):
    theirs = save_as(tmp_path, 3, "other-run")
    with pytest.raises(CheckpointOwnershipError, match="was not written by this run"):
        prepare_step_dir(tmp_path, 3, "this-run")
    verify_checkpoint(theirs)
    foreign = plant_foreign_files(tmp_path)
    with pytest.raises(CheckpointOwnershipError, match="global_step_5 exists and was not written by this run"):
        prepare_step_dir(tmp_path, 5, "this-run")
    assert {p: p.read_bytes() for p in foreign} == foreign
    (tmp_path / "global_step_8").mkdir()  # an empty folder holds nothing to lose
    assert prepare_step_dir(tmp_path, 8, "this-run").is_dir()


def test_files_added_to_a_checkpoint_survive_its_rotation(tmp_path):
    first = save_as(tmp_path, 1, "this-run")
    (first / "my_eval_results.json").write_text("{}")
    save_as(tmp_path, 2, "this-run")
    prune_old(tmp_path, keep=1, lineage="this-run")
    assert sorted(p.name for p in first.iterdir()) == ["my_eval_results.json"]
    assert not (first / COMPLETE_MARKER).exists() and not (first / WRITER_FILE).exists()


def test_the_lineage_is_in_the_writer_file_and_the_manifest(tmp_path):
    folder = save_as(tmp_path, 2, "abc123")
    assert json.loads((folder / WRITER_FILE).read_text())["lineage"] == "abc123"
    assert json.loads((folder / COMPLETE_MARKER).read_text())["lineage"] == "abc123"
    verify_checkpoint(folder)


def test_a_checkpoint_with_non_finite_values_is_never_marked_complete(tmp_path):
    save_as(tmp_path, 1, "run")
    folder = prepare_step_dir(tmp_path, 2, "run")
    (folder / "actor").mkdir()
    save_file(
        {"w": torch.tensor([1.0, float("nan"), float("inf")]), "step": torch.tensor([3])},
        folder / "actor" / "s.safetensors",
    )
    with pytest.raises(CheckpointNonFiniteError) as raised:
        mark_complete(tmp_path, 2, {"global_step": 2}, "run")
    message = str(raised.value)
    assert "actor/s.safetensors: w (2 of 3 values are NaN/inf)" in message
    assert f"The last complete checkpoint is {step_dir(tmp_path, 1)}" in message
    assert not (folder / COMPLETE_MARKER).exists()
    assert latest_complete(tmp_path) == step_dir(tmp_path, 1)
