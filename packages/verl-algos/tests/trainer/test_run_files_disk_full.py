"""A disk that fills up while the metrics or the log are written: the run stops as it does when a checkpoint
fills the disk, with ``RunFolderDiskFullError`` naming the file, the last complete checkpoint and what to do.

The run folder lives on a small tmpfs that the test fills (as ``test_full_disk.py`` does); mounting needs root,
without it the tests are skipped. The end-to-end version (a resumed ``verl train`` on a full disk) is in
``adversarial/test_bad_inputs_table.py``.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
from small_disk import fill, tmpfs

from verl.algos.run import checkpoint_layout as layout
from verl.algos.run.checkpoint_layout import RunFolderDiskFullError
from verl.algos.run.log import log_to_run_folder
from verl.algos.tracking.base import RunInfo
from verl.algos.tracking.file import FileTracker, read_metrics


@pytest.fixture
def run_on_small_disk(tmp_path):
    """A run folder with a complete checkpoint on a 1 MiB tmpfs, and a function that fills the rest."""
    with tmpfs(tmp_path / "disk", "1m") as disk:
        run = disk / "run"
        folder = layout.prepare_step_dir(run, 3, None)
        (folder / "actor").mkdir()
        (folder / "actor" / "weights.bin").write_bytes(b"w" * 4096)
        layout.mark_complete(run, 3, {"global_step": 3}, None)
        yield run, lambda: fill(disk)


def test_a_full_disk_while_writing_metrics_stops_with_the_checkpoint_message(run_on_small_disk):
    run, fill = run_on_small_disk
    tracker = FileTracker(RunInfo("p", "e", str(run), {}, 10))
    tracker.log({"actor/pg_loss": 0.5}, 3)
    fill()
    with pytest.raises(RunFolderDiskFullError) as raised:
        tracker.log({"actor/pg_loss": 0.25, "padding": "x" * 8192}, 4)
    message = str(raised.value.strerror)
    assert f"no space left on device while writing the metrics {run}/metrics.jsonl" in message
    assert f"the last complete checkpoint is {layout.step_dir(run, 3)}" in message
    assert "point trainer.default_local_dir elsewhere" in message and "trainer.resume_mode=" in message
    tracker.finish()  # closing after the failure raises nothing
    assert [r["step"] for r in read_metrics(str(run))] == [3]  # the complete records are kept
    layout.verify_checkpoint(layout.step_dir(run, 3))


def test_a_full_disk_while_writing_the_log_stops_once_on_the_main_thread(run_on_small_disk, capsys):
    run, fill = run_on_small_disk
    handler = log_to_run_folder(str(run))
    log = logging.getLogger("verl.test_disk_full")
    log.setLevel(logging.INFO)
    try:
        log.info("before the disk fills")
        fill()
        background = []
        thread = threading.Thread(target=lambda: background.append(log.info("from a thread %s", "x" * 8192)))
        thread.start()
        thread.join()
        assert background == [None], "a thread's record is dropped, not raised in the thread"
        with pytest.raises(RunFolderDiskFullError) as raised:
            log.info("a record the disk cannot take %s", "x" * 8192)
        assert f"no space left on device while writing the run's log {run}/train.log" in raised.value.strerror
        assert f"the last complete checkpoint is {layout.step_dir(run, 3)}" in raised.value.strerror
        log.error("after the disk filled: the console still gets this")  # no second raise
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    assert "Logging error" not in capsys.readouterr().err
    assert "before the disk fills" in Path(run / "train.log").read_text()
    layout.verify_checkpoint(layout.step_dir(run, 3))
