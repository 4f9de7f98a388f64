"""Runs the adversarial table (``bad_inputs_table.py``): every case ends with a non-zero status, one line
saying why, no traceback, Ray never started, and every file that was there before intact.

The cases that need a real run on the tiny model follow the table (``slow``): two runs on one folder at once,
Ctrl-C mid-run, a reward that calls sys.exit(0) mid-run, weights that overflow to inf, a full disk while
writing the log. Each checks the exit status, the one-line message, and the files that must survive.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
from algos_test_helpers import closing_new_log_handlers
from bad_inputs_table import CASES, Case, Ctx, user_files
from cli_runs import launch, tail, tiny_overrides, write_reward
from small_disk import fill, tmpfs

from verl.algos import cli
from verl.algos.run import checkpoint_layout as layout
from verl.algos.tracking.file import read_metrics

#: Files that a refused command may still write: the lock file (taken before anything else, so it can refuse)
#: and the run's log (where the traceback goes).
MAY_WRITE = {".verl.lock", "train.log"}
LAUNCH_TIMEOUT_S = 300


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink() and p.name not in MAY_WRITE
    }


def listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.name not in MAY_WRITE} if root.exists() else set()


@pytest.fixture
def ctx(tiny_model_dir, tmp_path) -> Ctx:
    """A run folder (with a space in its path) that holds a complete checkpoint of an earlier run, its
    metrics, and the user's notes; documents beside it."""
    run = tmp_path / "my run"
    folder = layout.prepare_step_dir(run, 2, "earlier-run")
    (folder / "actor").mkdir()
    (folder / "actor" / "weights.bin").write_bytes(b"weights of step 2" * 64)
    layout.mark_complete(run, 2, {"global_step": 2, "batch_order": {"epoch": 0, "batch_in_epoch": 2}}, "earlier-run")
    (run / "metrics.jsonl").write_text('{"step": 1, "x": 1.0}\n{"step": 2, "x": 2.0}\n')
    context = Ctx(tiny_model_dir, tmp_path, run, folder)
    user_files(context)
    yield context
    for item in context.processes:
        if isinstance(item, subprocess.Popen):
            item.kill()
            item.wait()
        elif item[0] == "umount":
            subprocess.run(["umount", item[1]], check=False)
        elif item[0] == "unhide":
            if item[2] is None:
                sys.modules.pop(item[1], None)
            else:
                sys.modules[item[1]] = item[2]
    os.chmod(run, 0o755)


@pytest.fixture(autouse=True)
def close_run_logs():
    with closing_new_log_handlers():
        yield


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_careless_input_ends_nonzero_with_one_line_and_loses_nothing(case: Case, ctx: Ctx, capsys):
    argv = case.argv(ctx)  # sets the scene (plants files, locks the folder, ...)
    before, run_listing = snapshot(ctx.tmp), listing(ctx.run)
    status = cli.main(argv)
    after = snapshot(ctx.tmp)
    err = capsys.readouterr().err
    assert status != 0, f"{case.tried}: exit 0\n{err}"
    assert case.exit is None or status == case.exit, f"exit {status}, expected {case.exit}\n{err}"
    assert "Traceback (most recent call last)" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("verl:")]
    assert lines, f"no 'verl:' message on stderr:\n{err}"
    for phrase in case.message:
        assert ctx.fill(phrase) in lines[0], f"{ctx.fill(phrase)!r} not in the message:\n{lines[0]}"
    assert not ray.is_initialized(), "the case must be refused before Ray starts"
    lost = [path for path, data in before.items() if after.get(path) != data]
    assert not lost, f"changed or deleted: {lost}"
    if case.untouched:
        assert listing(ctx.run) == run_listing, f"written into the run folder: {listing(ctx.run) - run_listing}"
    if "damaged" not in case.id:
        layout.verify_checkpoint(ctx.checkpoint)


# ------------------------------------------------------------------------------------------ real runs
def run_cli(args: list[str], timeout: int = LAUNCH_TIMEOUT_S) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.run(
        [sys.executable, "-m", "verl.algos.cli", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def message_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("verl:")]
    assert lines, stderr[-3000:]
    return lines[0]


def wait_for(predicate, proc: subprocess.Popen, log: Path, timeout: float = LAUNCH_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"the run ended early ({proc.returncode}):\n{tail(log)}"
        assert time.monotonic() < deadline, f"timed out:\n{tail(log)}"
        time.sleep(0.2)


@pytest.mark.slow
def test_two_runs_on_one_folder_the_second_is_refused_and_the_first_is_untouched(tiny_model_dir, tmp_path):
    """Two ``verl train`` on one output folder at once: the second refuses naming the first (host, pid,
    start time) and exits non-zero; the first finishes with every step logged once, its checkpoints complete
    (rotated by max_actor_ckpt_to_keep=1) and the user's files in the folder intact."""
    out = tmp_path / "shared run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "analysis").mkdir()
    (out / "analysis" / "plot.py").write_text("print('mine')")
    release = tmp_path / "release"
    reward = tmp_path / "held_reward.py"
    # The first run's rewards after its first checkpoint wait for the test's word, so it is surely still
    # running when the second run (a fresh interpreter, slow to start on a busy machine) reaches the folder.
    reward.write_text(
        "import glob, os, time\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        f"    while glob.glob({str(out / 'global_step_*')!r}) and not os.path.exists({str(release)!r}):\n"
        "        time.sleep(0.05)\n"
        "    return float(sum(map(ord, solution_str)) % 3) / 2.0\n"
    )
    steps = 3
    args = tiny_overrides(
        tiny_model_dir,
        out,
        reward,
        steps,
        "trainer.save_freq=1",
        "trainer.test_freq=-1",
        "trainer.max_actor_ckpt_to_keep=1",
    )
    log = tmp_path / "first.log"
    first = launch(args, log)
    try:
        wait_for(lambda: layout.latest_complete(out) is not None, first, log)
        second = run_cli(["train", *args])
        assert first.poll() is None, tail(log)  # held by its reward
        release.touch()
        assert second.returncode == 1, second.stderr[-3000:]
        assert "Traceback" not in second.stderr
        line = message_line(second.stderr)
        assert f"verl: RunFolderBusyError: run folder {out} is in use by another run (host " in line
        assert f"pid {first.pid}, started " in line
        assert first.wait(timeout=LAUNCH_TIMEOUT_S) == 0, tail(log)
    finally:
        if first.poll() is None:
            first.kill()
    logged = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [s for s in logged if s > 0] == list(range(1, steps + 1)), logged  # each step once, in order
    assert [p.name for _, p in layout.step_folders(out)] == [f"global_step_{steps}"]  # rotated by its own run
    layout.verify_checkpoint(layout.step_dir(out, steps))
    assert (out / "notes.txt").read_text() == "mine" and (out / "analysis" / "plot.py").is_file()


@pytest.mark.slow
def test_ctrl_c_mid_run_keeps_the_last_checkpoint_and_exits_130(tiny_model_dir, tmp_path):
    """Ctrl-C (SIGINT to the run's process group) after the first checkpoint: status 130, "interrupted",
    the checkpoint complete and intact; the same command resumes from it."""
    out = tmp_path / "run with spaces"
    reward = write_reward(tmp_path)
    args = tiny_overrides(tiny_model_dir, out, reward, 30, "trainer.save_freq=1", "trainer.test_freq=-1")
    log = tmp_path / "run.log"
    proc = launch(args, log)
    try:
        wait_for(lambda: layout.latest_complete(out) is not None, proc, log)
        os.killpg(proc.pid, signal.SIGINT)
        status = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    output = log.read_text()
    assert status == 130, tail(log)
    assert "verl: interrupted; the last complete checkpoint and the logs are kept" in output
    kept = layout.latest_complete(out)
    layout.verify_checkpoint(kept)
    assert "KeyboardInterrupt" in (out / "train.log").read_text()
    more = f"trainer.total_training_steps={layout.step_of(kept) + 1}"
    resumed = run_cli(["train", *[more if a.startswith("trainer.total_training_steps=") else a for a in args]])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {kept} " in resumed.stderr


@pytest.mark.slow
def test_a_reward_that_calls_sys_exit_0_mid_run_ends_nonzero(tiny_model_dir, tmp_path):
    """A reward function that calls sys.exit(0) at step 2 (after the checkpoint of step 1): status 1, one
    line naming the file and line, the checkpoint of step 1 kept, the traceback in train.log."""
    out = tmp_path / "run"
    reward = tmp_path / "exiting_reward.py"
    reward.write_text(
        "import sys\ncalls = 0\n\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    global calls\n    calls += 1\n    if calls > 4:\n        sys.exit(0)\n    return float(len(solution_str) % 2)\n"
    )
    args = tiny_overrides(
        tiny_model_dir, out, reward, 3, "trainer.save_freq=1", "trainer.test_freq=-1", "trainer.val_before_train=false"
    )
    result = run_cli(["train", *args])
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    line = message_line(result.stderr)
    assert f"verl: stopped: {reward}:8 called sys.exit(0) in the middle of `verl train`, which did not finish" in line
    assert layout.latest_complete(out) == layout.step_dir(out, 1)
    layout.verify_checkpoint(layout.step_dir(out, 1))
    assert "SystemExit" in (out / "train.log").read_text()


@pytest.mark.slow
def test_weights_that_overflow_never_make_a_complete_checkpoint(tiny_model_dir, tmp_path):
    """A finite but absurd learning rate (1e39, beyond float32) turns the weights to inf in one update: the
    checkpoint of that step is never marked complete and the run ends non-zero saying so."""
    out = tmp_path / "run"
    reward = write_reward(tmp_path)
    args = tiny_overrides(tiny_model_dir, out, reward, 2, "trainer.save_freq=1", "trainer.val_before_train=false")
    args = [a for a in args if not a.startswith("actor_rollout_ref.actor.optim.lr=")]
    result = run_cli(["train", *args, "actor_rollout_ref.actor.optim.lr=1e39"])
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    line = message_line(result.stderr)
    assert f"verl: CheckpointNonFiniteError: checkpoint {layout.step_dir(out, 1)} holds non-finite" in line
    assert "values are NaN/inf" in line and "not marked complete" in line
    assert layout.latest_complete(out) is None
    assert not layout.is_complete(layout.step_dir(out, 1))


@pytest.fixture
def small_disk(tmp_path):
    with tmpfs(tmp_path / "disk", "64m") as disk:
        yield disk


@pytest.mark.slow
def test_a_full_disk_while_writing_the_log_keeps_the_checkpoint_and_says_what_to_do(
    tiny_model_dir, tmp_path, small_disk
):
    """The disk fills up between two runs; the resumed run cannot write train.log: it stops (status 1) with
    the full-disk message naming the file and the kept checkpoint, which is intact and resumable."""
    out = small_disk / "run"
    reward = write_reward(tmp_path)
    args = tiny_overrides(tiny_model_dir, out, reward, 2, "trainer.save_freq=1", "trainer.max_actor_ckpt_to_keep=1")
    first = run_cli(["train", *args])
    assert first.returncode == 0, first.stderr[-3000:]
    kept = layout.step_dir(out, 2)
    log = out / "train.log"
    with open(log, "a") as fh:  # end the log on a block boundary: its next record needs a block of its own
        fh.write("#" * (-(log.stat().st_size + 1) % 4096) + "\n")
    fill(small_disk)
    resumed = run_cli(["train", *[a.replace("total_training_steps=2", "total_training_steps=3") for a in args]])
    assert resumed.returncode == 1, resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr and "Logging error" not in resumed.stderr
    line = message_line(resumed.stderr)
    assert f"verl: RunFolderDiskFullError: no space left on device while writing the run's log {out}/train.log" in line
    assert f"the last complete checkpoint is {kept}" in line and "point trainer.default_local_dir elsewhere" in line
    layout.verify_checkpoint(kept)
    assert layout.latest_complete(out) == kept
    assert [r["step"] for r in read_metrics(str(out)) if "timing_s/step" in r] == [1, 2]
