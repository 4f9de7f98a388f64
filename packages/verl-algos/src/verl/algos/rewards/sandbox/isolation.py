"""What the sandbox isolates, and the steps that set it up inside the launcher process.

- **Processes.** The program runs as an unprivileged uid (the trainer's own uid, or ``sandbox_uid``
  when the trainer is root, because the kernel never enforces ``RLIMIT_NPROC`` for root) inside a new
  user namespace and a new PID namespace. The process limit is counted per user namespace, so each
  sandbox has its own, and when the namespace's first process exits the kernel kills every process
  left in it, including those that left the process group with ``setsid``.
- **Network.** A new network namespace: no interfaces but a loopback that is down, and its own
  abstract UNIX socket names. A seccomp filter (:mod:`.seccomp`) refuses ``socket()`` for every
  family, which also closes the UNIX sockets bound to paths on the host, and io_uring.
- **Filesystem.** Landlock: changes only beneath the throwaway working directory; with
  ``restrict_reads`` also reads only of the interpreter's installation, the system directories and
  the working directory (so a program cannot read the dataset's answers or the trainer's files).

Only the standard library is imported: the launcher loads this file by path, before anything else.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_SET_NO_NEW_PRIVS = 38

#: Readable by every sandboxed program when reads are restricted: what an interpreter needs to start.
SYSTEM_READ_PATHS = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin", "/etc")
#: Devices a program may open: /dev/null read-write, the others read-only.
DEVICE_READ_PATHS = ("/dev/zero", "/dev/urandom", "/dev/random")
DEVICE_WRITE_PATHS = ("/dev/null",)

_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Isolation:
    """Which isolation to set up. Each field that is True must be available on the machine, or the
    sandbox refuses to run (it never falls back to running a program less isolated than asked).

    - ``network``: a new network namespace, so no connection reaches any host, this one included.
    - ``deny_sockets``: a seccomp filter refuses ``socket()`` for every address family (UNIX sockets
      bound to a path are otherwise reachable through the filesystem), io_uring, ``memfd_create``
      and System V shared memory; ``socketpair()`` stays allowed. Needs x86-64 or arm64.
    - ``filesystem``: Landlock, so files change only beneath the throwaway working directory.
    - ``restrict_reads``: Landlock also limits reads to the interpreter's installation, the system
      directories (/usr, /lib*, /bin, /sbin, /etc), a few devices, ``readable_paths`` and the working
      directory. Needs ``filesystem``.
    - ``user_namespace``: a new user namespace, which gives each sandbox its own process count and
      lets a non-root trainer create the other namespaces. A root trainer may turn it off where user
      namespaces are disabled; the sandboxes then share one process count (that of ``sandbox_uid``).
    - ``sandbox_uid``/``sandbox_gid``: who the program runs as when the trainer is root (nobody).
    """

    network: bool = True
    deny_sockets: bool = True
    filesystem: bool = True
    restrict_reads: bool = True
    readable_paths: tuple[str, ...] = ()
    user_namespace: bool = True
    sandbox_uid: int = 65534
    sandbox_gid: int = 65534

    def __post_init__(self) -> None:
        if self.restrict_reads and not self.filesystem:
            raise ValueError("Isolation(restrict_reads=True) needs filesystem=True (both are Landlock rules)")
        for path in self.readable_paths:
            if not os.path.isabs(path):
                raise ValueError(f"Isolation.readable_paths must be absolute paths, got {path!r}")
        if self.sandbox_uid == 0 or self.sandbox_gid == 0:
            raise ValueError("Isolation.sandbox_uid/sandbox_gid must not be 0: root is exempt from process limits")


class SetupError(RuntimeError):
    """An isolation step failed; ``missing`` names what the machine lacks and ``hint`` what to do."""

    def __init__(self, missing: str, detail: str, hint: str):
        super().__init__(f"{missing}: {detail}")
        self.missing = missing
        self.detail = detail
        self.hint = hint


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def drop_privileges(uid: int, gid: int) -> None:
    """From root to ``uid``/``gid`` with no supplementary groups, for good (real, effective, saved)."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    # Changing uid makes the process non-dumpable, which makes its /proc/self files root's and so
    # /proc/self/uid_map unwritable by the process itself; it has nothing secret, so undo that.
    _check(_libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def enter_namespaces(isolation: Isolation) -> None:
    """Drop root (if root) and create the namespaces ``isolation`` asks for. The PID namespace takes
    effect for the children forked afterwards: the first one becomes its init."""
    root = os.geteuid() == 0
    flags = CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | (CLONE_NEWNET if isolation.network else 0)
    if isolation.user_namespace:
        if root:
            drop_privileges(isolation.sandbox_uid, isolation.sandbox_gid)
        uid, gid = os.getuid(), os.getgid()
        try:
            unshare(CLONE_NEWUSER | flags)
        except OSError as e:
            raise SetupError(
                "user namespaces",
                f"unshare(CLONE_NEWUSER) failed: {e.strerror}",
                "enable unprivileged user namespaces (sysctl user.max_user_namespaces=10000; on Ubuntu >= 23.10 also "
                "sysctl kernel.apparmor_restrict_unprivileged_userns=0; in Docker, run with a seccomp profile that "
                "allows unshare), or, when the trainer runs as root, set isolation user_namespace=False",
            ) from None
        # Map the unprivileged uid/gid to themselves: the program keeps its uid and, after exec, has no
        # capabilities even inside the namespace (it is not uid 0 there).
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
        _write("/proc/self/gid_map", f"{gid} {gid} 1\n")
        not_dumpable()
        return
    if not root:
        raise SetupError(
            "user namespaces",
            "isolation user_namespace=False, but without root a process cannot create namespaces",
            "set user_namespace=True (the default), or run the trainer as root",
        )
    try:
        unshare(flags)
    except OSError as e:
        raise SetupError(
            "namespaces", f"unshare failed as root: {e.strerror}", "run with CAP_SYS_ADMIN or set network=False"
        ) from None
    drop_privileges(isolation.sandbox_uid, isolation.sandbox_gid)
    not_dumpable()


def not_dumpable() -> None:
    """Keep the program (same uid) out of the launcher's and reaper's /proc entries, and so out of
    their status pipe. The program's own exec makes it dumpable again, as any process is."""
    _check(_libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")


def die_with_parent() -> None:
    """SIGKILL this process when the thread that forked it exits (the launcher being killed)."""
    _check(_libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")


def no_new_privs() -> None:
    """No exec may ever grant privileges again (setuid binaries, file capabilities); Landlock needs it."""
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


def interpreter_read_paths(python: str) -> list[str]:
    """The installation of ``python`` (a venv and the installation it points to): two levels above
    the executable, before and after resolving symlinks (``<prefix>/bin/python``)."""
    paths = []
    for exe in (os.path.abspath(python), os.path.realpath(python)):
        prefix = os.path.dirname(os.path.dirname(exe))
        if prefix not in paths and prefix != "/":
            paths.append(prefix)
    return paths
