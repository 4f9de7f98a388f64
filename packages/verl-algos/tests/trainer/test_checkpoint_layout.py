import pytest

from verl.algos.trainer.checkpoint_layout import (
    COMPLETE_MARKER,
    LATEST_FILE,
    latest_complete,
    mark_complete,
    prepare_step_dir,
    prune_old,
    read_trainer_state,
    resolve_resume,
    step_dir,
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
