"""Real ``verl train`` runs in a child process, for the tests that kill runs or fill their disk.

Imported by the crash-safety and full-disk tests (pytest's importlib mode does not put this folder on
sys.path; they add it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

#: A reward that varies between the responses of one prompt, so GRPO advantages and updates are non-zero.
VARIED_REWARD = (
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
    "    return float(sum(map(ord, solution_str)) % 3) / 2.0\n"
)

#: Metrics that measure wall-clock time; everything else a run logs is a deterministic function of the seed.
TIMING_PREFIXES = ("timing_s/", "perf/throughput", "perf/time_per_step", "perf/mfu")


def write_reward(folder: Path) -> Path:
    path = folder / "varied_reward.py"
    path.write_text(VARIED_REWARD)
    return path


def tiny_overrides(model: str, out: Path, reward: Path, steps: int, *extra: str) -> list[str]:
    """A GRPO run of ``steps`` steps on two CPU workers, each step well under a second."""
    return [
        f"actor_rollout_ref.model.path={model}",
        f"trainer.default_local_dir={out}",
        "trainer.n_gpus_per_node=2",
        f"trainer.total_training_steps={steps}",
        "trainer.logger=[file]",
        "trainer.plot_curves=false",
        "data.train_batch_size=2",
        "data.max_response_length=8",
        "data.val_max_samples=4",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        f"custom_reward_function.path={reward}",
        *extra,
    ]


def launch(overrides: list[str], log: Path, ray_address: str | None = None) -> subprocess.Popen:
    """``python -m verl.algos.cli train ...`` as the leader of a new session (so everything it starts can be
    found by session id), output to ``log``. ``ray_address``: join that cluster; None: start a local Ray,
    as a plain ``verl train`` does."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    if ray_address:
        overrides = [*overrides, f"trainer.ray_address={ray_address}"]
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "verl.algos.cli", "train", *overrides],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def tail(path: Path, chars: int = 4000) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return text[-chars:]


def comparable(record: dict) -> dict:
    """A metrics record without its wall-clock measurements."""
    return {k: v for k, v in record.items() if not k.startswith(TIMING_PREFIXES)}


def _processes() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, session id, command line) of every live process (zombies excluded)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # exited meanwhile
        state, ppid, _, session = stat[stat.rindex(")") + 2 :].split()[:4]  # fields after "pid (comm) "
        if state != "Z":
            found[int(entry)] = (int(ppid), int(session), cmdline.strip())
    return found


def session_processes(sid: int) -> dict[int, str]:
    """pid -> command line of every live process in session ``sid``."""
    return {pid: cmd for pid, (_, session, cmd) in _processes().items() if session == sid}


def descendants(pid: int) -> dict[int, str]:
    """pid -> command line of every live descendant of ``pid``."""
    table = _processes()
    found = {}
    for child, (_, _, cmd) in table.items():
        ancestor = table[child][0]
        while ancestor in table and ancestor != pid:
            ancestor = table[ancestor][0]
        if ancestor == pid:
            found[child] = cmd
    return found
