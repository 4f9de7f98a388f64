"""How much memory a sandboxed program uses as a whole: all of its processes together.

The address-space limit (``RLIMIT_AS``) holds each process; a program that forks could still use
``memory_mb`` in every one of them. The launcher therefore polls the processes of the run (every
``POLL_S``), sums their private memory, and ends the run once the sum passes the limit. This is
accounting, not a hard limit: between two polls the program may overshoot, by at most what its
processes can allocate in ``POLL_S``, and never past ``RLIMIT_AS`` in each process. A cgroup would
make it a hard limit, but needs a delegated cgroup v2 with the memory controller, which many
machines (containers, hybrid cgroup v1 hosts such as this project's CI) do not give.

The processes are found from the reaper (the PID namespace's init): every process of the run is a
descendant of it, since orphans, including those that called ``setsid``, are re-parented to it.
Each one counts its anonymous and shared-memory resident pages (``RssAnon + RssShmem`` in
``/proc/<pid>/status``). That sum counts pages that forked processes still share (copy-on-write)
once per process, so before a run is ended the sum is measured again with proportional set sizes
(``smaps_rollup``), which count each shared page once. Memory that no process maps (``memfd``,
System V shared memory) is refused by the seccomp filter; writes to ``/dev/shm`` by Landlock.

Only the standard library is imported: the launcher loads this file by path.
"""

from __future__ import annotations

import os

POLL_S = 0.05


def descendants(root: int) -> list[int]:
    """The processes below ``root`` (not ``root`` itself), from ``/proc/<pid>/task/<tid>/children``."""
    found: list[int] = []
    queue = [root]
    while queue:
        pid = queue.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # gone
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                    children = [int(c) for c in f.read().split()]
            except OSError:
                continue
            found.extend(children)
            queue.extend(children)
    return found


def _kib_fields(path: str, names: tuple[str, ...]) -> dict[str, int] | None:
    try:
        with open(path, "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in names:
            values[key] = int(rest.split()[0]) * 1024
    return values


def resident(pid: int) -> int:
    """Private resident bytes of ``pid`` (anonymous + shared memory), 0 once it is gone."""
    fields = _kib_fields(f"/proc/{pid}/status", ("RssAnon", "RssShmem"))
    return sum(fields.values()) if fields else 0


def proportional(pid: int) -> int:
    """Like :func:`resident`, but each page shared by n processes counts 1/n."""
    fields = _kib_fields(f"/proc/{pid}/smaps_rollup", ("Pss_Anon", "Pss_Shmem", "Pss"))
    if not fields:
        return resident(pid)
    if "Pss_Anon" in fields:
        return fields["Pss_Anon"] + fields.get("Pss_Shmem", 0)
    return fields.get("Pss", 0)


def tree_usage(reaper: int, limit: int) -> int:
    """Bytes used by the processes below ``reaper``: the fast sum, re-measured exactly when it is
    over ``limit`` (so that copy-on-write pages never end a run that is within it)."""
    pids = descendants(reaper)
    used = sum(resident(pid) for pid in pids)
    if used <= limit:
        return used
    return sum(proportional(pid) for pid in pids)
