"""Failures reach the driver as errors naming role, rank and node, never as a hang: a rank whose process
exits, an actor killed from outside, a call that never answers, a worker whose __init__ raises."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import ray
import torch
import torch.distributed as dist

from verl.core.controller import (
    Dispatch,
    ResourcePool,
    Worker,
    WorkerCallError,
    WorkerDiedError,
    WorkerGroup,
    WorkerTimeoutError,
    register,
)
from verl.core.controller.death_cause import process_gone


class Fragile(Worker):
    def __init__(self, fail_init_on_rank: int | None = None):
        if self.rank == fail_init_on_rank:
            raise RuntimeError(f"cannot build the model on rank {self.rank}")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def exit_on_rank_one(self) -> int:
        if self.rank == 1:
            os._exit(1)
        dist.all_reduce(torch.ones(1))  # rank 0 now waits for a peer that is gone
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def die_while_the_peer_fails(self, pids: list[int]) -> None:
        """Rank 1 is SIGKILLed; rank 0 raises as soon as rank 1's process is gone (as a collective with
        it would), racing Ray's report of the death."""
        if self.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        while not process_gone(pids[1]):
            time.sleep(0.01)
        raise RuntimeError("connection closed by peer")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def hang(self) -> None:
        time.sleep(600)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def rank_of(self) -> int:
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()


@contextlib.contextmanager
def group_of(world: int, **options):
    pool = ResourcePool(process_on_nodes=[world])
    group = WorkerGroup(pool, Fragile, **options)
    try:
        yield group
    finally:
        group.shutdown()
        pool.shutdown()


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_until_gone(pid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        assert time.monotonic() < deadline, f"process {pid} still alive {timeout_s} s after ray.kill"
        time.sleep(0.1)


def test_a_rank_that_exits_is_reported_dead_while_its_peer_hangs(ray_local):
    # The timeout is far away: a WorkerDiedError (not a timeout) shows the death was noticed by itself.
    with group_of(2, call_timeout_s=120) as group:
        with pytest.raises(WorkerDiedError) as info:
            group.exit_on_rank_one()
        assert info.value.rank == 1 and info.value.role == "Fragile"
        assert group.sites[1].node_ip in str(info.value)
        with pytest.raises(WorkerDiedError, match="rank 1"):
            group.check_health(timeout_s=5)


def test_an_actor_killed_from_outside_is_reported_dead(ray_local):
    with group_of(1, call_timeout_s=120) as group:
        assert group.rank_of() == [0]
        [pid] = group.pid()
        ray.kill(group.actors[0])
        # ray.kill only asks for the kill: a call sent before the process is gone may still be answered.
        wait_until_gone(pid, timeout_s=60)
        with pytest.raises(WorkerDiedError, match="rank 0"):
            group.rank_of()


def test_a_peer_failing_on_a_killed_rank_reports_the_killed_rank_as_the_cause(ray_local):
    # Whichever reaches the driver first (the peer's error or Ray's word on the death), the death is named.
    with group_of(2, call_timeout_s=120) as group:
        pids = group.pid()
        with pytest.raises(WorkerDiedError, match="rank 1") as info:
            group.die_while_the_peer_fails(pids)
        assert f"pid {pids[1]}) is dead: the process vanished" in str(info.value)


def test_process_gone_tells_running_from_ended_and_unreaped_processes():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not process_gone(child.pid) and not process_gone(os.getpid())
        child.kill()
        deadline = time.monotonic() + 30
        while not process_gone(child.pid):  # a zombie until reaped: ended all the same
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        child.kill()
        child.wait()
    assert process_gone(child.pid)


def test_a_call_that_never_answers_times_out(ray_local):
    with group_of(1, call_timeout_s=1.0) as group:
        with pytest.raises(WorkerTimeoutError, match="no answer within 1 s") as info:
            group.hang()
        assert [s.rank for s in info.value.sites] == [0]


def test_a_worker_init_that_raises_fails_the_group_and_frees_the_pool(ray_local):
    pool = ResourcePool(process_on_nodes=[2])
    try:
        with pytest.raises(WorkerCallError) as info:
            WorkerGroup(pool, Fragile, fail_init_on_rank=1)
        assert info.value.rank == 1 and info.value.method == "Fragile.__init__"
        assert "cannot build the model on rank 1" in info.value.remote_traceback
        assert pool.holders == []
    finally:
        pool.shutdown()
