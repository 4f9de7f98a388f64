"""A real ``verl train`` killed with SIGKILL at random moments, many times over, always resumes from its last
complete checkpoint and ends with the metrics of a run never interrupted, bit for bit.

Each launch of the CLI is killed at a point drawn from a seeded RNG, aimed at one phase of the run: start-up
(Ray, workers, loading the checkpoint, the first validation), the rollout of a step, its actor update, or
the write of a checkpoint (the kill lands soon after the step folder appears: inside the engines' shard
write, the manifest, the marker, the latest file or the pruning). The kills watch the run's own files
(metrics lines, step folders), so no test hook is needed in the trainer. After every kill:

- every checkpoint with a ``COMPLETE`` marker passes its manifest check (nothing complete is damaged), the
  latest file names a complete checkpoint, and no checkpoint that was complete before the launch is lost;
- the next launch resumes from exactly the most recently completed checkpoint (its log says so), never
  from a folder without the marker.

The last launch runs to the end. Every metrics line any launch wrote (steps re-run after a kill included)
equals the uninterrupted run's line for that step, but for wall-clock timings; the validation a resumed
launch runs first equals the uninterrupted run's at that step where it has one; and the final weights and
optimizer state are the uninterrupted run's, byte for byte.

Ray: the first ``LOCAL_RAY_LAUNCHES`` launches start their own local Ray, as a plain ``verl train`` does;
every process a killed launch left (workers, raylet, GCS, Ray's agents) must exit by itself, and the next
launch starts beside any that linger. The other launches join one Ray started by this test with exactly
the CPUs one run needs, so a killed driver's workers or placement group that were not released would keep
the next launch from placing its workers; joining also spares a Ray start-up per launch. At the end no
worker of any launch is left.

``VERL_CRASH_TEST_KILLS`` (default 4: each phase once) sets the number of kills and ``VERL_CRASH_TEST_SEED`` the RNG seed,
for a longer soak by hand, e.g. ``VERL_CRASH_TEST_KILLS=40 pytest -s test_crash_safety.py`` (``-s`` prints
where each kill landed and how long the killed launches' processes lived on).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from verl.algos.run import checkpoint_layout as layout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_runs import (  # noqa: E402
    comparable,
    descendants,
    launch,
    session_processes,
    tail,
    tiny_overrides,
    write_reward,
)

#: 4: each phase once per CI run (a launch costs ~25 s on 2 cores); raise it for a soak.
KILLS = int(os.environ.get("VERL_CRASH_TEST_KILLS", "4"))
SEED = int(os.environ.get("VERL_CRASH_TEST_SEED", "2026"))
SAVE_FREQ = 2
TEST_FREQ = 3
KEEP = 2
#: A kill is aimed at most SAVE_FREQ + 1 steps past the checkpoint its launch resumed from, so a kill
#: advances the run by at most SAVE_FREQ steps: with this many steps every planned kill comes first.
STEPS = SAVE_FREQ * KILLS + 2 * SAVE_FREQ
LOCAL_RAY_LAUNCHES = 2
PHASES = ("startup", "rollout", "update", "checkpoint")
LAUNCH_TIMEOUT_S = 300
#: Ray's dashboard and runtime-env agents poll for their raylet and exit a minute or two after it died.
LEFTOVER_DEADLINE_S = 240
POLL_S = 0.002

pytestmark = pytest.mark.slow


@dataclass
class Kill:
    launch: int
    phase: str
    target_step: int | None
    resumed_from: int
    local_ray: bool
    pid: int = 0
    delay_s: float = 0.0
    landed: str = ""
    killed_at: float = 0.0
    #: pid -> command line of the launch's other processes when it was killed, and when each set was gone.
    leftovers: dict[int, str] = field(default_factory=dict)
    workers_gone_s: float | None = None
    all_gone_s: float | None = None
    alive_at_relaunch: int = 0


class LeftoverWatch:
    """Notes, every half second in a thread, when each killed launch's processes are all gone."""

    def __init__(self):
        self.kills: list[Kill] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def add(self, kill: Kill) -> None:
        with self.lock:
            self.kills.append(kill)

    def alive(self, kill: Kill) -> dict[int, str]:
        return {pid: cmd for pid, cmd in kill.leftovers.items() if _live(pid)}

    def _run(self) -> None:
        while not self.stop.wait(0.5):
            with self.lock:
                pending = [k for k in self.kills if k.all_gone_s is None]
            for kill in pending:
                alive = self.alive(kill)
                elapsed = time.monotonic() - kill.killed_at
                if kill.workers_gone_s is None and not any(c.startswith("ray::WorkerHost") for c in alive.values()):
                    kill.workers_gone_s = elapsed
                if not alive:
                    kill.all_gone_s = elapsed

    def wait_all_gone(self, deadline_s: float) -> dict[int, dict[int, str]]:
        """Wait until every killed launch's processes are gone (at most ``deadline_s`` after its kill);
        returns what is still alive, by launch."""
        for kill in self.kills:
            while kill.all_gone_s is None and time.monotonic() - kill.killed_at < deadline_s:
                time.sleep(0.5)
        self.stop.set()
        return {k.launch: self.alive(k) for k in self.kills if k.all_gone_s is None and self.alive(k)}


def _seconds(value: float | None) -> str:
    return "(still alive)" if value is None else f"{value:.1f} s"


def _live(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


@pytest.fixture(scope="module")
def ray_cluster():
    """A Ray the launches join, with the 2 CPUs one run needs (a leaked placement group blocks the next)."""
    import ray

    # Ray's own defaults (the node's reachable address), so that other processes can join it.
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture
def launched():
    """The launches of a test; any still running when it ends (a failed test) is killed."""
    procs: list = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def read_lines(path: Path, offset: int = 0) -> tuple[list[dict], int]:
    """The complete JSON lines after byte ``offset``, and the offset after them."""
    if not path.exists():
        return [], offset
    data = path.read_bytes()[offset:]
    end = data.rfind(b"\n") + 1
    return [json.loads(line) for line in data[:end].splitlines() if line.strip()], offset + end


def training(record: dict) -> bool:
    return "timing_s/step" in record


def folder_stamp(folder: Path):
    try:
        st = folder.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_ctime_ns


def wait_for_line(proc, metrics: Path, offset: int, step: int) -> None:
    """Until this launch logs a line for ``step`` (the step after it has begun) or exits."""
    while proc.poll() is None and not any(r["step"] == step for r in read_lines(metrics, offset)[0]):
        time.sleep(POLL_S)


def wait_for_trigger(proc, kill: Kill, metrics: Path, offset: int, root: Path, reference: dict, rng) -> None:
    """Sleep until the run reaches the kill's target, then its aimed delay; returns early if the run exits."""
    start = time.monotonic()
    if kill.phase == "startup":
        kill.delay_s = rng.uniform(0.3, 1.0) * reference["startup_s"]
        while proc.poll() is None and time.monotonic() - start < kill.delay_s:
            if any(training(r) for r in read_lines(metrics, offset)[0]):
                return
            time.sleep(0.02)
        return
    # Step t begins once this launch has logged step t - 1 (its first validation, when t - 1 is where it
    # resumed; checkpoint kills aim at SAVE_FREQ steps after that, whose line comes from a training step).
    wait_for_line(proc, metrics, offset, kill.target_step - 1)
    if kill.phase == "checkpoint":
        folder = layout.step_dir(root, kill.target_step)
        before = folder_stamp(folder)  # a leftover partial folder of this step counts once it is touched
        while proc.poll() is None and folder_stamp(folder) == before:
            time.sleep(POLL_S)
        kill.delay_s = rng.uniform(0.0, 0.5) * reference["save_s"][kill.target_step]
    else:
        timings = reference["by_step"][kill.target_step]
        if kill.phase == "rollout":
            kill.delay_s = rng.uniform(0.0, 0.9) * timings["timing_s/gen"]
        else:
            before_update = timings["timing_s/gen"] + timings.get("timing_s/old_log_prob", 0.0)
            kill.delay_s = before_update + rng.uniform(0.1, 0.9) * timings["timing_s/update_actor"]
    time.sleep(kill.delay_s)


def check_disk_after_kill(root: Path) -> tuple[Path | None, list[Path]]:
    """Every complete checkpoint is intact and the latest file names one; returns (what resume would pick,
    the incomplete folders)."""
    folders = sorted(p for p in root.glob("global_step_*") if p.is_dir())
    complete = [p for p in folders if layout.is_complete(p)]
    partial = [p for p in folders if not layout.is_complete(p)]
    for folder in complete:
        layout.verify_checkpoint(folder)  # raises, naming the damaged file
    chosen = layout.latest_complete(root)
    assert chosen is None or chosen in complete
    latest_file = root / layout.LATEST_FILE
    if latest_file.exists():
        assert layout.step_dir(root, int(latest_file.read_text())) in complete, "latest file names no checkpoint"
    return chosen, partial


def landing(root: Path, kill: Kill, new_lines: list[dict]) -> str:
    """Where the kill landed, from what the launch left on disk."""
    if kill.target_step is not None:
        folder = layout.step_dir(root, kill.target_step)
        if folder.is_dir() and not layout.is_complete(folder):
            parts = sorted(p.name for p in folder.iterdir())
            return f"mid checkpoint write of step {kill.target_step} (the folder holds {parts})"
    steps = [r["step"] for r in new_lines if training(r)]
    step = max(steps, default=kill.resumed_from) + 1
    if kill.phase == "startup":
        if not steps:
            return f"in start-up, {kill.delay_s:.1f} s after launch (resuming from step {kill.resumed_from})"
        return f"as step {step} began (start-up took less than the {kill.delay_s:.1f} s aimed at)"
    return f"{kill.delay_s:.2f} s into step {step} (aimed at its {kill.phase})"


def schedule() -> list[str]:
    return [
        f"trainer.save_freq={SAVE_FREQ}",
        f"trainer.test_freq={TEST_FREQ}",
        f"trainer.max_actor_ckpt_to_keep={KEEP}",
    ]


def run_reference(model: str, out: Path, reward: Path, address: str, launched: list) -> dict:
    log = out.parent / f"{out.name}.log"
    start = time.monotonic()
    proc = launch(tiny_overrides(model, out, reward, STEPS, *schedule()), log, address)
    launched.append(proc)
    first_step_at = None
    while proc.poll() is None and time.monotonic() - start < LAUNCH_TIMEOUT_S:
        if first_step_at is None and any(training(r) for r in read_lines(out / "metrics.jsonl")[0]):
            first_step_at = time.monotonic() - start
        time.sleep(0.05)
    assert proc.poll() == 0, f"the uninterrupted run failed:\n{tail(log)}"
    records, _ = read_lines(out / "metrics.jsonl")
    by_step = {r["step"]: r for r in records if training(r)}
    assert sorted(by_step) == list(range(1, STEPS + 1))
    return {
        "records": records,
        "by_step": by_step,
        "save_s": {s: r.get("timing_s/save_checkpoint", 0.1) for s, r in by_step.items()},
        "startup_s": first_step_at or 10.0,
    }


def launch_processes(kill: Kill) -> dict[int, str]:
    """The killed launch's processes besides its driver: its whole session when it started its own Ray,
    else the workers of the shared Ray (only one launch runs at a time)."""
    if kill.local_ray:
        return {p: c for p, c in session_processes(kill.pid).items() if p != kill.pid}
    return shared_ray_workers()


def shared_ray_workers() -> dict[int, str]:
    """The verl workers running in the Ray this test started."""
    return {p: c for p, c in descendants(os.getpid()).items() if c.startswith("ray::WorkerHost")}


def assert_same_final_state(root: Path, reference: Path) -> None:
    """The last checkpoints hold the same weights and optimizer state, bit for bit. (Compared tensor by
    tensor: the order of tensors inside a shard file varies from one process to the next.)"""
    import torch
    from safetensors.torch import load_file

    shards = sorted((layout.step_dir(reference, STEPS) / "actor" / "state").glob("*.safetensors"))
    assert shards
    for shard in shards:
        expected = load_file(shard)
        got = load_file(layout.step_dir(root, STEPS) / "actor" / "state" / shard.name)
        assert sorted(got) == sorted(expected)
        different = [name for name in expected if not torch.equal(got[name], expected[name])]
        assert not different, f"{shard.name}: {different} differ from the uninterrupted run's"


def compare_with_reference(lines: list[dict], reference: dict) -> None:
    by_step = reference["by_step"]
    validations = {r["step"]: r for r in reference["records"] if "val/acc" in r}
    seen = set()
    for record in lines:
        step = record["step"]
        if training(record):
            seen.add(step)
            assert comparable(record) == comparable(by_step[step]), f"step {step} differs from the uninterrupted run"
        elif step in validations:  # the validation a (resumed) launch runs first
            vals = {k: v for k, v in record.items() if k.startswith("val/")}
            assert vals == {k: validations[step][k] for k in vals}, f"validation at step {step} differs"
    assert seen == set(by_step)


def test_sigkill_at_random_points_resumes_exactly(untied_model_dir, tmp_path, ray_cluster, launched):
    rng = random.Random(SEED)
    reward = write_reward(tmp_path)
    reference = run_reference(untied_model_dir, tmp_path / "uninterrupted", reward, ray_cluster, launched)

    root = tmp_path / "killed"
    metrics = root / "metrics.jsonl"
    phases = [PHASES[i % len(PHASES)] for i in range(KILLS)]
    rng.shuffle(phases)
    watch = LeftoverWatch()
    kills: list[Kill] = []
    offset = 0
    for i, phase in enumerate([*phases, "none"]):
        chosen = layout.latest_complete(root)
        resumed_from = layout.step_of(chosen) if chosen else 0
        targets = {"checkpoint": resumed_from + SAVE_FREQ, "startup": None, "none": None}
        target = targets.get(phase, resumed_from + rng.randint(1, SAVE_FREQ + 1))
        kill = Kill(i, phase, target, resumed_from, local_ray=i < LOCAL_RAY_LAUNCHES)
        if kills:
            kills[-1].alive_at_relaunch = len(watch.alive(kills[-1]))
        log = tmp_path / f"launch-{i}.log"
        proc = launch(
            tiny_overrides(untied_model_dir, root, reward, STEPS, *schedule()),
            log,
            None if kill.local_ray else ray_cluster,
        )
        launched.append(proc)
        kill.pid = proc.pid
        if phase == "none":  # the last launch runs to the end
            assert proc.wait(timeout=LAUNCH_TIMEOUT_S) == 0, f"the last launch failed:\n{tail(log)}"
        else:
            wait_for_trigger(proc, kill, metrics, offset, root, reference, rng)
            assert proc.poll() is None, f"launch {i} ended before its kill ({kill}):\n{tail(log)}"
            kill.leftovers = launch_processes(kill)
            os.kill(proc.pid, signal.SIGKILL)
            kill.killed_at = time.monotonic()
            assert proc.wait(timeout=30) == -signal.SIGKILL
            watch.add(kill)
            kills.append(kill)
        new_lines, offset = read_lines(metrics, offset)
        if phase != "none":
            kill.landed = landing(root, kill, new_lines)
            print(f"kill {i}: {kill.landed}; {'own' if kill.local_ray else 'shared'} Ray", flush=True)
        if chosen is not None and any(training(r) for r in new_lines):  # it trained, so it resumed first
            assert f"resumed from {chosen} " in log.read_text(), f"launch {i} did not resume from {chosen}"
        now_chosen, partial = check_disk_after_kill(root)
        if chosen is not None:
            assert now_chosen is not None and layout.step_of(now_chosen) >= resumed_from, "a checkpoint was lost"

    compare_with_reference(read_lines(metrics)[0], reference)
    assert_same_final_state(root, tmp_path / "uninterrupted")
    assert now_chosen == layout.step_dir(root, STEPS)
    assert partial == [], f"incomplete folders left behind: {partial}"
    assert len([p for p in root.glob("global_step_*") if layout.is_complete(p)]) == KEEP
    assert any(k.landed.startswith("mid checkpoint write") for k in kills), "no kill landed inside a checkpoint write"

    alive = watch.wait_all_gone(LEFTOVER_DEADLINE_S)
    for kill in kills:
        print(
            f"launch {kill.launch} ({'own' if kill.local_ray else 'shared'} Ray): {len(kill.leftovers)} other "
            f"processes at the kill, {kill.alive_at_relaunch} still alive at the relaunch; workers gone after "
            f"{_seconds(kill.workers_gone_s)}, all after {_seconds(kill.all_gone_s)}",
            flush=True,
        )
    assert not alive, f"processes of killed launches still alive {LEFTOVER_DEADLINE_S} s after the kill: {alive}"
    workers = shared_ray_workers()
    deadline = time.monotonic() + 60
    while workers and time.monotonic() < deadline:
        time.sleep(0.5)
        workers = shared_ray_workers()
    assert not workers, f"Ray workers left behind by the launches: {workers}"
