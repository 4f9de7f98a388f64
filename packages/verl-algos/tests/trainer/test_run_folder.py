"""The run folder belongs to one run at a time (an OS lock that names its holder and dies with it), and a
run never writes over another run's checkpoints unless told to start over (then they are moved, not
deleted). No Ray here: the end-to-end versions are in ``adversarial/test_bad_inputs_table.py``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from verl.algos.run import checkpoint_layout as layout
from verl.algos.run import folder_lock as run_folder_lock
from verl.algos.run.folder_lock import RunFolderBusyError
from verl.algos.run.start import plan_start
from verl.core.config import ConfigError

HOLDER = """
import sys, time
from verl.algos.run import folder_lock as run_folder_lock
lock = run_folder_lock.acquire(sys.argv[1])
print("locked", flush=True)
time.sleep(600)
"""


def start_holder(folder: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_lock_on_a_folder_is_refused_naming_the_holder(tmp_path):
    with run_folder_lock.acquire(tmp_path / "run") as lock:
        assert run_folder_lock.holds(tmp_path / "run")
        with pytest.raises(RunFolderBusyError) as raised:
            run_folder_lock.acquire(tmp_path / "run")  # the same process, another open: refused as well
        message = str(raised.value)
        assert f"run folder {tmp_path / 'run'} is in use by another run (host {socket.gethostname()}, " in message
        assert f"pid {os.getpid()}, started " in message and "command: " in message
        assert "give this run another trainer.default_local_dir" in message
        assert lock.fd >= 0
    assert not run_folder_lock.holds(tmp_path / "run")
    run_folder_lock.acquire(tmp_path / "run").release()  # free again


def test_a_killed_holder_does_not_leave_the_folder_stuck(tmp_path):
    folder = tmp_path / "run"
    holder = start_holder(folder)
    try:
        with pytest.raises(RunFolderBusyError, match=f"pid {holder.pid}, started "):
            run_folder_lock.acquire(folder)
        holder_info = json.loads((folder / run_folder_lock.LOCK_FILE).read_text())
        assert holder_info["pid"] == holder.pid and holder_info["host"] == socket.gethostname()
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    lock = run_folder_lock.acquire(folder)  # the kernel released the dead holder's lock
    assert json.loads((folder / run_folder_lock.LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()


def test_a_child_process_does_not_inherit_the_lock(tmp_path):
    """Processes a run starts (Ray's) may outlive it; they must not keep the folder locked."""
    folder = tmp_path / "run"
    lock = run_folder_lock.acquire(folder)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        lock.release()
        run_folder_lock.acquire(folder).release()  # the sleeping child holds nothing
    finally:
        child.kill()
        child.wait()


def test_a_folder_that_cannot_be_created_is_a_config_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        run_folder_lock.acquire(tmp_path / "file")
    with pytest.raises(ConfigError, match=r"cannot be created \(Not a directory\)"):
        run_folder_lock.acquire(tmp_path / "file" / "run")


# -- where a run starts -------------------------------------------------------------------------------------
def trainer_cfg(root: Path, resume_mode: str = "auto", resume_from_path=None, start_over=False):
    return SimpleNamespace(
        default_local_dir=str(root), resume_mode=resume_mode, resume_from_path=resume_from_path, start_over=start_over
    )


def save(root: Path, step: int, lineage: str | None) -> Path:
    folder = layout.prepare_step_dir(root, step, lineage)
    (folder / "actor").mkdir()
    (folder / "actor" / "weights.bin").write_bytes(b"w" * 32)
    layout.mark_complete(root, step, {"global_step": step}, lineage)
    return folder


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_fresh_run_into_a_folder_with_checkpoints_is_refused(tmp_path):
    for step in (2, 4):
        save(tmp_path, step, "earlier")
    (tmp_path / "metrics.jsonl").write_text('{"step": 2}\n')
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError) as raised:
        plan_start(trainer_cfg(tmp_path, "disable"))
    message = str(raised.value)
    assert "trainer.resume_mode=disable starts a new run" in message
    assert "holds checkpoints of an earlier run (global_step_2, global_step_4)" in message
    assert "trainer.start_over=true" in message and "nothing is deleted" in message
    assert snapshot(tmp_path) == before


def test_auto_resumes_and_continues_the_lineage(tmp_path):
    save(tmp_path, 2, "earlier")
    start = plan_start(trainer_cfg(tmp_path))
    assert start.resume_from == layout.step_dir(tmp_path, 2) and start.lineage == "earlier"
    assert plan_start(trainer_cfg(tmp_path / "empty")).resume_from is None  # a fresh folder: a new lineage


def test_resuming_another_runs_checkpoint_into_a_folder_with_checkpoints_is_refused(tmp_path):
    source = save(tmp_path / "a", 2, "run-a")
    save(tmp_path / "b", 3, "run-b")
    with pytest.raises(ConfigError, match="another run's checkpoint"):
        plan_start(trainer_cfg(tmp_path / "b", str(source)))
    start = plan_start(trainer_cfg(tmp_path / "c", str(source)))  # into an empty folder: fine
    assert start.resume_from == source and start.lineage == "run-a"


def test_start_over_moves_the_earlier_run_aside_and_deletes_nothing(tmp_path):
    for step in (2, 4):
        save(tmp_path, step, "earlier")
    (tmp_path / "metrics.jsonl").write_text('{"step": 2}\n')
    (tmp_path / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    start = plan_start(trainer_cfg(tmp_path, "disable", start_over=True))
    assert start.resume_from is None and start.lineage != "earlier"
    assert snapshot(tmp_path) == before, "planning writes nothing"
    lock = SimpleNamespace(lineage=None)
    start.apply(lock)
    assert lock.lineage == start.lineage
    (aside,) = tmp_path.glob("earlier_run_*")
    moved = {name.split("/", 1)[1]: data for name, data in snapshot(tmp_path).items() if name.startswith(aside.name)}
    assert moved == {k: v for k, v in before.items() if k != "notes.txt"}
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert layout.latest_complete(tmp_path) is None and layout.latest_complete(aside) == aside / "global_step_4"
    layout.verify_checkpoint(aside / "global_step_4")


def test_start_over_refuses_to_move_the_checkpoint_it_resumes_from(tmp_path):
    folder = save(tmp_path, 2, "earlier")
    save(tmp_path, 3, "other")
    with pytest.raises(ConfigError, match="would move the checkpoint this run resumes from"):
        plan_start(trainer_cfg(tmp_path, str(folder), start_over=True))


def test_a_run_killed_before_its_first_checkpoint_is_continued(tmp_path):
    """Only a partial folder of a run that never completed a checkpoint: the next run takes its lineage over,
    so that it may replace the partial folder (and nothing else)."""
    partial = layout.prepare_step_dir(tmp_path, 1, "crashed")
    (partial / "actor.tmp").mkdir()
    start = plan_start(trainer_cfg(tmp_path))
    assert start.resume_from is None and start.lineage == "crashed"
    assert layout.prepare_step_dir(tmp_path, 1, start.lineage).is_dir()


@pytest.mark.parametrize(
    "resume_mode, resume_from_path, phrase",
    [
        ("{root}/global_step_9", None, "trainer.resume_mode={root}/global_step_9: resume path"),
        ("resume_path", None, "trainer.resume_mode=resume_path needs trainer.resume_from_path"),
        ("resume_path", "{root}/nowhere/global_step_1", "does not exist"),
        ("auto", "{root}/global_step_9", "trainer.resume_from_path={root}/global_step_9: resume path"),
        ("{root}/global_step_1", None, "is not a complete checkpoint"),
    ],
)
def test_a_resume_path_that_is_missing_or_incomplete_is_a_config_error(tmp_path, resume_mode, resume_from_path, phrase):
    layout.prepare_step_dir(tmp_path, 1, "x")
    fill = lambda text: text and text.replace("{root}", str(tmp_path))  # noqa: E731
    with pytest.raises(ConfigError) as raised:
        plan_start(trainer_cfg(tmp_path, fill(resume_mode), fill(resume_from_path)))
    assert fill(phrase) in str(raised.value)


def test_checkpoints_written_under_a_lock_carry_its_lineage(tmp_path):
    with run_folder_lock.acquire(tmp_path) as lock:
        lock.lineage = "held-lineage"
        folder = layout.prepare_step_dir(tmp_path, 1)
        layout.mark_complete(tmp_path, 1, {"global_step": 1})
    assert layout.checkpoint_lineage(folder) == "held-lineage"
