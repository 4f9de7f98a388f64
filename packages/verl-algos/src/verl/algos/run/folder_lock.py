"""One run at a time per run folder: an OS lock on ``<trainer.default_local_dir>/.verl.lock``.

``verl train``, ``verl sft`` and ``verl eval`` take it before they write anything into the folder; a second
run on the same folder is refused with a message naming the holder (host, pid, start time, command).
The lock is ``flock`` on the file: the kernel releases it when the holding process ends, however it ends
(SIGKILL included), so a crashed run never leaves the folder stuck. The file's content only describes the
holder; whether the folder is held is decided by the lock alone, never by the content.

The lock is not inherited by the processes a run starts (the descriptor is close-on-exec), so Ray processes
that outlive a killed driver do not keep it. On network filesystems ``flock`` is as good as the server's
lock support (NFSv4 supports it; some FUSE filesystems do not).

The lock also carries the run's *lineage* (see ``run_start``): the identity stamped into every checkpoint
this run writes, so that rotation removes only checkpoints of this run's lineage.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from verl.core.config import ConfigError

LOCK_FILE = ".verl.lock"

#: The locks this process holds: resolved run folder -> lock (what ``lineage_of`` reads).
_HELD: dict[Path, RunFolderLock] = {}


class RunFolderBusyError(RuntimeError):
    """Another live process holds the run folder."""


class RunFolderLock:
    def __init__(self, folder: Path, fd: int, lineage: str | None = None):
        self.folder = folder
        self.fd = fd
        #: The lineage stamped into this run's checkpoints (set once the run knows where it starts from).
        self.lineage = lineage

    def release(self) -> None:
        if self.fd < 0:
            return
        _HELD.pop(self.folder, None)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> RunFolderLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _key(folder: str | Path) -> Path:
    return Path(folder).expanduser().resolve()


def create_run_folder(folder: str | Path, key: str = "trainer.default_local_dir") -> Path:
    """Create ``folder`` (and its parents); a path that cannot be a folder is a ConfigError naming ``key``."""
    path = Path(folder).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{key}={folder} is a file, not a folder; give a folder for the run's checkpoints and logs")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"{key}={folder}: the folder cannot be created ({exc.strerror or exc}); give a writable location"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}={folder} is not writable by this user; give a writable location")
    return path


def acquire(folder: str | Path, key: str = "trainer.default_local_dir") -> RunFolderLock:
    """Create ``folder`` if needed and lock it for this process, or raise RunFolderBusyError naming the
    holder. Nothing else is written into the folder before the lock is held."""
    path = create_run_folder(folder, key)
    lock_path = path / LOCK_FILE
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise ConfigError(f"{key}={folder}: cannot create its lock file {lock_path} ({exc.strerror or exc})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = _read_holder(fd)
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN):
            raise
        raise RunFolderBusyError(
            f"run folder {path} is in use by another run ({holder}); two runs in one folder would mix their "
            f"metrics and remove each other's checkpoints. Wait for it to finish or stop it, or give this run "
            f"another {key}"
        ) from None
    _write_holder(fd)
    lock = RunFolderLock(_key(path), fd)
    _HELD[lock.folder] = lock
    return lock


def lineage_of(folder: str | Path) -> str | None:
    """The lineage of the run this process is running in ``folder`` (None: this process holds no lock on it)."""
    lock = _HELD.get(_key(folder))
    return lock.lineage if lock is not None else None


def holds(folder: str | Path) -> bool:
    return _key(folder) in _HELD


def _write_holder(fd: int) -> None:
    holder = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]])[:500],
    }
    data = (json.dumps(holder) + "\n").encode()
    try:  # over the old content, then cut: no block is freed first, so a full disk rarely refuses it
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    except OSError:  # the description is a courtesy; the lock itself is held
        os.ftruncate(fd, 0)


def _read_holder(fd: int) -> str:
    try:
        holder = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        holder = {}
    if not holder:
        return "its details are still being written"
    return (
        f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, started {holder.get('started', '?')}, "
        f"command: {holder.get('command', '?')}"
    )
