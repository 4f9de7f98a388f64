"""Why a rank's process died, in words: from what Ray reports, and from what the kernel counted.

Ray tells some deaths apart: its memory monitor killing a worker (``OutOfMemoryError``), a lost node
(``NodeDiedError``), ``ray.kill``, SIGTERM, an exit code. A process that vanishes without a word (SIGKILL,
which is how the kernel's OOM killer ends a process, or a crash such as SIGSEGV) reaches Ray only as a
closed connection, whatever killed it. For that case the kernel's own count of OOM kills on the rank's
node (``oom_kill`` in ``/proc/vmstat``, read when the group started and again after the death) says
whether the OOM killer struck in between.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

import ray
from ray.exceptions import NodeDiedError, OutOfMemoryError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

#: The kernel's node-wide counters; ``oom_kill`` counts processes the OOM killer ended since boot.
KERNEL_COUNTERS = "/proc/vmstat"

#: How long to wait for the count from a node other than the driver's before giving up on it.
REMOTE_COUNT_TIMEOUT_S = 10.0

_EXIT = re.compile(r"Worker exit type: (\w+) Worker exit detail: (.*?)(?:\s*Some common causes include|$)", re.S)
_EXIT_CODE = re.compile(r"exit code (-?\d+)")


def read_oom_kill_count() -> int | None:
    """This node's kernel OOM-kill count since boot, or None where the kernel does not expose it."""
    try:
        with open(KERNEL_COUNTERS, encoding="ascii") as fh:
            for line in fh:
                name, _, value = line.partition(" ")
                if name == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def oom_kill_count_on(node_id: str) -> int | None:
    """The kernel OOM-kill count of the Ray node ``node_id`` (read here when it is the driver's node)."""
    if node_id == ray.get_runtime_context().get_node_id():
        return read_oom_kill_count()
    probe = ray.remote(num_cpus=0, max_retries=0)(read_oom_kill_count)
    strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
    ref = probe.options(scheduling_strategy=strategy).remote()
    try:
        return ray.get(ref, timeout=REMOTE_COUNT_TIMEOUT_S)
    except (RayError, TimeoutError):  # the node is gone or too busy to answer: no evidence either way
        ray.cancel(ref, force=True)
        return None


def kernel_oom_evidence(node_id: str, count_at_start: int | None) -> str:
    """A sentence on whether the kernel's OOM killer struck on the node since ``count_at_start`` was read
    (empty when the count cannot be read there)."""
    if count_at_start is None or node_id == "?":
        return ""
    now = oom_kill_count_on(node_id)
    if now is None:
        return ""
    killed = now - count_at_start
    if killed > 0:
        return (
            f" The kernel's OOM killer ended {killed} process(es) on this node since the group started "
            f"(oom_kill in {KERNEL_COUNTERS}): this rank most likely ran out of host memory; lower its memory "
            "use (smaller micro-batches, offloading) or give it more memory."
        )
    return f" The kernel's OOM killer ended no process on this node since the group started ({KERNEL_COUNTERS})."


#: A process that ended without a word to Ray.
VANISHED = (
    "the process vanished without exiting through Python: killed by a signal (SIGKILL, which is how "
    "the kernel's OOM killer and `kill -9` end a process) or crashed (e.g. SIGSEGV)"
)


def process_gone(pid: int) -> bool:
    """Whether process ``pid`` of this node has ended (a zombie that its parent has not reaped yet counts
    as ended)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            state = fh.read().rsplit(")", 1)[-1].split()[0]
        return state in ("Z", "X")
    except FileNotFoundError:
        return True
    except (OSError, IndexError):  # no /proc (not Linux): ask the kernel whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False


class Death(NamedTuple):
    """What Ray says about a dead rank: one sentence plus Ray's own exit type and detail."""

    cause: str
    #: The process vanished without a word (SIGKILL or a crash): the kernel's OOM count is worth a look.
    silent: bool = False
    #: Whether Ray said how the process ended (False: Ray's error carries no exit detail).
    explained: bool = True


def describe_death(exc: RayError) -> Death:
    """The cause of a rank's death as far as Ray's error tells it."""
    text = str(exc)
    if isinstance(exc, OutOfMemoryError):
        return Death(
            f"out of memory: Ray's memory monitor killed it because its node ran low on memory [Ray: {_squash(text)}]"
        )
    if isinstance(exc, NodeDiedError):
        return Death(f"its node died or became unreachable [Ray: {_squash(text)}]")
    if "killed by `ray.kill`" in text:
        return Death("it was killed with ray.kill (from the driver or another process)")
    if "node has died" in text or "NODE_DIED" in text:
        return Death(f"its node died or became unreachable [Ray: {_squash(text.splitlines()[-1])}]")
    found = _EXIT.search(text)
    if found is None:
        return Death(f"{type(exc).__name__}: {_squash(text)}", silent=True, explained=False)
    exit_type, detail = found.group(1), _squash(found.group(2))
    code = _EXIT_CODE.search(detail)
    silent = False
    if exit_type == "NODE_OUT_OF_MEMORY" or "memory pressure" in detail or "low on memory" in detail:
        cause = "out of memory: Ray killed it because its node ran low on memory"
    elif "SIGTERM" in detail:
        cause = "it received SIGTERM (stopped from outside: a job scheduler, `ray stop`, a node shutdown)"
    elif "connection error" in detail or "End of file" in detail:
        silent = True
        cause = VANISHED
    elif code is not None:
        cause = f"its process exited with code {code.group(1)}"
    else:
        cause = "its process exited unexpectedly"
    return Death(f"{cause} [Ray: exit type {exit_type}; {detail}]", silent)


def _squash(text: str) -> str:
    return " ".join(text.split())
