"""Worker faults in a real training run (tiny model, 2 Ray workers, FSDP2 on gloo): a worker process is
SIGKILLed, or SIGSTOPped, from outside as soon as the first checkpoint is complete.

- Without restarts the run stops with a message naming role, rank, node, pid and cause, and ``verl
  train`` exits with status 3; the checkpoint and the log stay.
- With ``trainer.max_restarts=1`` the run gets new workers, resumes from the checkpoint and ends with
  exactly the metrics of a run that was never interrupted.
- A worker that stops answering ends the run with ``WorkerTimeoutError`` naming it, after
  ``trainer.worker_timeout_s``.

A kernel OOM kill reaches Ray exactly like this SIGKILL (the OOM killer sends SIGKILL); the controller's
own test (``test_death_causes.py``) makes one for real with a memory-limited cgroup.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
import ray
from cli_runs import tiny_overrides

from verl.algos import cli
from verl.algos.config import load_config
from verl.algos.run import checkpoint_layout as layout
from verl.algos.tracking import read_metrics
from verl.algos.trainer.main import run
from verl.core.controller import WorkerTimeoutError

pytestmark = pytest.mark.usefixtures("ray_session")

STEPS = 3


def overrides(model: str, out: Path, reward: Path, *extra: str) -> list[str]:
    """A checkpoint every step, no validation, four prompts x four responses in mini-batches of two."""
    return tiny_overrides(
        model,
        out,
        reward,
        STEPS,
        "trainer.save_freq=1",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "data.train_batch_size=4",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        *extra,
    )


@pytest.fixture
def reward(tmp_path) -> Path:
    """A reward that varies between samples, so every step really updates the model."""
    path = tmp_path / "reward.py"
    path.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(len(solution_str) % 3) / 2.0\n"
    )
    return path


def live_worker_pids() -> list[int]:
    """The processes of the run's workers, from Ray's actor table (Ray's state API, ray.util.state, needs
    the dashboard, which verl keeps off)."""
    actors = ray._private.state.actors().values()
    return sorted(a["Pid"] for a in actors if a["ActorClassName"] == "WorkerHost" and a["State"] == "ALIVE")


class SignalAfterFirstCheckpoint(threading.Thread):
    """Sends ``signum`` to one worker process of the run as soon as its first checkpoint is complete,
    while the run goes on to its next step."""

    def __init__(self, out: Path, signum: int):
        super().__init__(daemon=True)
        self.out, self.signum = out, signum
        self.pid: int | None = None
        self.finished = threading.Event()

    def run(self) -> None:
        while not self.finished.is_set():
            if layout.latest_complete(self.out) is not None:
                self.pid = live_worker_pids()[-1]
                os.kill(self.pid, self.signum)
                return
            time.sleep(0.02)

    def __enter__(self) -> SignalAfterFirstCheckpoint:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.finished.set()
        self.join()


def comparable(record: dict) -> dict:
    """Everything but wall-clock measurements."""
    return {k: v for k, v in record.items() if not k.startswith(("timing_s/", "perf/"))}


def test_a_killed_worker_stops_the_run_naming_it_and_keeps_the_checkpoint(tiny_model_dir, tmp_path, reward, capsys):
    out = tmp_path / "run"
    with SignalAfterFirstCheckpoint(out, signal.SIGKILL) as killer:
        status = cli.main(["train", "-r", "grpo", *overrides(tiny_model_dir, out, reward)])
    assert killer.pid is not None, "the run ended before a worker could be killed"
    assert status == cli.EXIT_WORKER_FAULT
    error = capsys.readouterr().err
    assert re.search(r"role 'actor_rollout_ref' rank [01] \(node 127\.0\.0\.1, node id \w+, pid (\d+)\)", error)
    assert f"pid {killer.pid}) is dead: the process vanished" in error, error
    assert "killed by a signal (SIGKILL" in error, error
    kept = layout.latest_complete(out)
    assert kept is not None and layout.step_of(kept) < STEPS  # stopped mid-run, its last checkpoint intact
    assert f"the last complete checkpoint is {kept}" in error
    log = (out / "train.log").read_text()
    assert "the run stopped on an error" in log and f"pid {killer.pid}) is dead" in log


@pytest.mark.slow
def test_with_max_restarts_the_run_resumes_on_new_workers_and_matches_an_uninterrupted_run(
    tiny_model_dir, tmp_path, reward
):
    uninterrupted = tmp_path / "uninterrupted"
    run(load_config("grpo", overrides(tiny_model_dir, uninterrupted, reward)))

    restarted = tmp_path / "restarted"
    with SignalAfterFirstCheckpoint(restarted, signal.SIGKILL) as killer:
        summary = run(load_config("grpo", overrides(tiny_model_dir, restarted, reward, "trainer.max_restarts=1")))
    assert killer.pid is not None, "the run ended before a worker could be killed"
    assert summary["restarts"] == 1 and summary["steps"] == STEPS
    assert layout.latest_complete(restarted) == layout.step_dir(restarted, STEPS)
    log = (restarted / "train.log").read_text()
    assert f"pid {killer.pid}) is dead" in log and "restart 1 of 1 (trainer.max_restarts)" in log

    expected = {r["step"]: comparable(r) for r in read_metrics(str(uninterrupted))}
    got = {r["step"]: comparable(r) for r in read_metrics(str(restarted))}
    assert sorted(got) == sorted(expected) == list(range(1, STEPS + 1))
    for step in expected:
        assert got[step] == expected[step], f"step {step} differs after the restart"
    assert got[STEPS]["actor/grad_norm"] > 0  # the compared steps really trained


@pytest.mark.slow
def test_a_hung_worker_stops_the_run_after_the_worker_timeout(tiny_model_dir, tmp_path, reward):
    out = tmp_path / "run"
    cfg = load_config("grpo", overrides(tiny_model_dir, out, reward, "trainer.worker_timeout_s=30"))
    with SignalAfterFirstCheckpoint(out, signal.SIGSTOP) as stopper:
        try:
            with pytest.raises(WorkerTimeoutError) as info:
                run(cfg)
        finally:
            if stopper.pid is not None:  # the run's shutdown kills it; never leave a stopped process behind
                try:
                    os.kill(stopper.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    assert stopper.pid is not None, "the run ended before a worker could be stopped"
    assert "no answer within 30 s" in str(info.value)
    # The stopped rank is named; its peer too when the call had it waiting in a collective for it.
    assert stopper.pid in {s.pid for s in info.value.sites}
    assert {s.role for s in info.value.sites} == {"actor_rollout_ref"}
    assert re.search(
        rf"role 'actor_rollout_ref' rank [01] \(node 127\.0\.0\.1, node id \w+, pid {stopper.pid}\)", str(info.value)
    )
    assert layout.latest_complete(out) is not None
