"""A rank that dies is reported with why, as far as Ray and the node's kernel can tell: killed by a signal,
killed by the kernel's OOM killer (a real memory limit, where this machine lets the test set one); a rank that stops answering (SIGSTOP) times out naming itself, and shutting the group
down ends it. Every process here is a real Ray worker hit by a real signal."""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from verl.core.controller import (
    Dispatch,
    ResourcePool,
    Worker,
    WorkerDiedError,
    WorkerGroup,
    WorkerTimeoutError,
    register,
)
from verl.core.controller.death_cause import read_oom_kill_count

pytestmark = pytest.mark.usefixtures("ray_local")


class Sleeper(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def nap(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def hold_memory(self, megabytes: int) -> int:
        held = b"\x01" * (megabytes << 20)  # written, so every page is really taken
        return len(held)


@contextlib.contextmanager
def group_of(world: int, **options):
    pool = ResourcePool(process_on_nodes=[world])
    group = WorkerGroup(pool, Sleeper, group_name="sleeper", **options)
    try:
        yield group
    finally:
        group.shutdown()
        pool.shutdown()


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_a_rank_killed_by_a_signal_is_named_with_role_rank_node_and_cause():
    with group_of(2, call_timeout_s=300) as group:
        site = group.sites[1]
        pending = group.nap.submit(300)
        os.kill(site.pid, signal.SIGKILL)
        with pytest.raises(WorkerDiedError) as info:
            pending.get()
    message = str(info.value)
    assert info.value.role == "sleeper" and info.value.rank == 1
    assert f"pid {site.pid}" in message and f"node {site.node_ip}" in message and site.node_id[:12] in message
    assert "killed by a signal (SIGKILL" in message
    assert "exit type SYSTEM_ERROR" in message  # Ray's own words are kept
    if read_oom_kill_count() is not None:  # the kernel's count was consulted, whatever it says
        assert "OOM killer ended" in message


def _memory_cgroup(limit_bytes: int) -> Path | None:
    """A new memory cgroup limited to ``limit_bytes`` (v1 or v2), or None where this user cannot make one."""
    name = f"verl-test-{uuid.uuid4().hex[:8]}"
    for parent, limit_file in (
        (Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes"),  # cgroup v1
        (Path("/sys/fs/cgroup"), "memory.max"),  # cgroup v2
    ):
        if not (parent / "cgroup.procs").exists():
            continue
        folder = parent / name
        try:
            folder.mkdir()
        except OSError:
            continue
        try:
            (folder / limit_file).write_text(str(limit_bytes))
            return folder
        except OSError:
            folder.rmdir()
    return None


def test_a_rank_killed_by_the_kernel_oom_killer_is_reported_out_of_memory():
    if read_oom_kill_count() is None:
        pytest.skip("this kernel does not count OOM kills in /proc/vmstat")
    cgroup = _memory_cgroup(256 << 20)
    if cgroup is None:
        pytest.skip("cannot create a memory-limited cgroup here (needs root and a writable cgroup memory controller)")
    try:
        with group_of(1, call_timeout_s=300) as group:
            # The rank's process, and only it, now lives under a 256 MiB limit: asking it to hold 1 GiB
            # makes the kernel's OOM killer end it with SIGKILL, as on a node out of memory.
            try:
                (cgroup / "cgroup.procs").write_text(str(group.sites[0].pid))
            except OSError as exc:
                pytest.skip(f"cannot move a worker into the memory-limited cgroup {cgroup}: {exc}")
            with pytest.raises(WorkerDiedError, match="rank 0") as info:
                group.hold_memory(1024)
    finally:
        for _ in range(100):  # the killed process leaves the cgroup once it is reaped
            try:
                cgroup.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    message = str(info.value)
    assert "killed by a signal (SIGKILL" in message
    assert "The kernel's OOM killer ended" in message and "most likely ran out of host memory" in message


def test_a_stopped_rank_times_out_naming_itself_and_shutdown_ends_it():
    with group_of(2, call_timeout_s=3) as group:
        stopped = group.sites[1]
        os.kill(stopped.pid, signal.SIGSTOP)  # alive to the kernel and to Ray, but never answers
        try:
            with pytest.raises(WorkerTimeoutError, match="no answer within 3 s") as info:
                group.nap(0)
            assert [(s.role, s.rank, s.pid) for s in info.value.sites] == [("sleeper", 1, stopped.pid)]
            assert f"node {stopped.node_ip}" in str(info.value)
        finally:
            group.shutdown()
    deadline = time.monotonic() + 60
    while process_exists(stopped.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    ended = not process_exists(stopped.pid)
    if not ended:  # leave nothing stopped behind, then fail
        os.kill(stopped.pid, signal.SIGKILL)
    assert ended, "shutting the group down did not end the stopped rank's process"
