"""A disk that fills up while a checkpoint is written: the run stops with a message that names the problem,
the folder and what to do; the partial checkpoint is removed (the space goes back to the logs); the last
complete checkpoint stays intact and a new run resumes from it.

The run folder lives on a small tmpfs, sized from the model so that the first checkpoint fits and the
second does not. Mounting needs root (or CAP_SYS_ADMIN); without it the test is skipped.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from verl.algos.run import checkpoint_layout as layout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_runs import launch, tail, tiny_overrides, write_reward  # noqa: E402
from small_disk import tmpfs  # noqa: E402

LAUNCH_TIMEOUT_S = 300


@pytest.fixture
def small_disk(untied_model_dir, tmp_path):
    """A tmpfs that holds the run's small files and one checkpoint, but not two."""
    weights = (Path(untied_model_dir) / "model.safetensors").stat().st_size
    checkpoint = 3 * weights  # fp32 weights and Adam's two moments, over the two ranks' shards
    size_kib = (int(1.5 * checkpoint) + 256 * 1024) // 1024
    with tmpfs(tmp_path / "disk", f"{size_kib}k") as disk:
        yield disk


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_full_disk_during_a_checkpoint_keeps_the_last_one(untied_model_dir, small_disk, tmp_path):
    reward = write_reward(tmp_path)
    run_dir = small_disk / "run"
    args = (untied_model_dir, run_dir, reward, 3, "trainer.save_freq=1", "trainer.test_freq=0")
    log = tmp_path / "full.log"
    proc = launch(tiny_overrides(*args), log)
    try:
        returncode = proc.wait(timeout=LAUNCH_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    assert returncode != 0, f"the run did not stop:\n{tail(log)}"
    first, second = layout.step_dir(run_dir, 1), layout.step_dir(run_dir, 2)
    assert layout.is_complete(first), f"the disk is too small for even one checkpoint:\n{tail(log)}"
    message = f"no space left on device while writing checkpoint {second}"
    assert message in output, tail(log)
    assert f"verl: CheckpointDiskFullError: {message}" in output  # the CLI's last word: the message alone
    assert f"the last complete checkpoint is {first}" in output
    assert "point trainer.default_local_dir elsewhere" in output
    # The partial checkpoint is gone, the last complete one intact and chosen by resume.
    assert not second.exists()
    layout.verify_checkpoint(first)
    assert layout.resolve_resume(run_dir, "auto", None) == first
    # The logs on that disk are kept, with the error: the removed partial folder gave the space back.
    assert message in (run_dir / "train.log").read_text()
    assert [r["step"] for r in read_records(run_dir / "metrics.jsonl") if "timing_s/step" in r] == [1]

    # As the message says: point the run elsewhere and resume from the kept checkpoint.
    elsewhere = tmp_path / "elsewhere"
    resume_log = tmp_path / "resume.log"
    proc = launch(tiny_overrides(*args[:1], elsewhere, *args[2:], f"trainer.resume_mode={first}"), resume_log)
    assert proc.wait(timeout=LAUNCH_TIMEOUT_S) == 0, tail(resume_log)
    assert f"resumed from {first} " in resume_log.read_text()
    assert layout.latest_complete(elsewhere) == layout.step_dir(elsewhere, 3)
    resumed = [r for r in read_records(elsewhere / "metrics.jsonl") if "timing_s/step" in r]
    assert [r["step"] for r in resumed] == [2, 3]
