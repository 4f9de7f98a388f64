"""The sandbox launcher: the process :mod:`runner` starts for each program, as
``python -I -S -B launcher.py <spec as JSON>``. Standard library only (it loads its two siblings by
path), so it starts fast and the trainer's packages are never imported on this side.

    launcher (trainer's uid; drops root, enters the new namespaces; watches the memory of the tree)
      └── reaper (PID 1 of the new PID namespace; dies with the launcher)
            └── program (rlimits, no_new_privs, Landlock, then exec of the interpreter)

The reaper waits for the program, reaps the orphans it leaves, writes the program's exit status to
the status pipe and exits, and the kernel then kills whatever is left in the namespace. On SIGTERM
(the wall-clock limit) the launcher kills the reaper; either way it exits only after the reaper, and
so every process of the namespace, is gone. Everything the launcher has to say goes to the status
pipe as JSON lines (never to the program's output).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import isolation  # noqa: E402
import landlock  # noqa: E402
import memory  # noqa: E402
import seccomp  # noqa: E402


def report(status_fd: int, message: dict) -> None:
    os.write(status_fd, (json.dumps(message) + "\n").encode())


def run_program(spec: dict, status_fd: int) -> None:
    """In the program's process: limits, Landlock, exec. Never returns."""
    try:
        isolation.no_new_privs()
        if spec["isolation"]["filesystem"]:
            landlock.restrict_self(
                writable=spec["writable"],
                readable=spec["readable"] if spec["isolation"]["restrict_reads"] else None,
                deny_tcp=spec["isolation"]["network"],
            )
        if spec["isolation"]["deny_sockets"]:
            seccomp.install()
        for name, soft, hard in spec["rlimits"]:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        os.execve(spec["python"], [spec["python"], *spec["argv"]], spec["env"])
    except landlock.LandlockError as e:
        report(status_fd, {"setup_error": "Landlock", "detail": str(e), "hint": _LANDLOCK_HINT})
    except seccomp.SeccompError as e:
        report(status_fd, {"setup_error": "a seccomp filter", "detail": str(e), "hint": _SECCOMP_HINT})
    except BaseException as e:  # an exec that fails, a limit the kernel refuses
        report(status_fd, {"launch_error": f"{type(e).__name__}: {e}"})
    os._exit(127)


def reap(spec: dict, status_fd: int) -> None:
    """PID 1 of the namespace: start the program, reap everything, report the program's status."""
    isolation.die_with_parent()
    program = os.fork()
    if program == 0:
        run_program(spec, status_fd)
    status = None
    while True:
        try:
            pid, status_word = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid == program:
            status = status_word
            break
    if status is not None:
        if os.WIFSIGNALED(status):
            report(status_fd, {"signal": os.WTERMSIG(status)})
        else:
            report(status_fd, {"exit_code": os.WEXITSTATUS(status)})
    os._exit(0)  # the kernel now kills every process left in the namespace


_SECCOMP_HINT = (
    "the socket filter needs Linux with seccomp on x86-64 or arm64; or set isolation deny_sockets=False to run "
    "without it (the network namespace still cuts TCP, UDP and abstract UNIX sockets off, but a UNIX socket bound "
    "to a path on this machine stays reachable)"
)

_LANDLOCK_HINT = (
    "Landlock needs Linux >= 5.13 with 'landlock' in the kernel's lsm= list; or set isolation filesystem=False "
    "and restrict_reads=False to run without it (files are then protected only by the permissions of the "
    "program's uid)"
)


def main() -> None:
    spec = json.loads(sys.argv[1])
    status_fd = spec["status_fd"]
    os.set_inheritable(status_fd, False)  # the program's exec closes it
    try:
        if spec["isolation"]["filesystem"]:
            try:
                landlock.abi_version()
            except landlock.LandlockError as e:
                raise isolation.SetupError("Landlock", str(e), _LANDLOCK_HINT) from None
        if spec["isolation"]["deny_sockets"] and seccomp.supported_machine() is None:
            raise isolation.SetupError(
                "a seccomp filter", f"no system call table for machine {os.uname().machine!r}", _SECCOMP_HINT
            )
        isolation.enter_namespaces(isolation.Isolation(**_isolation_fields(spec["isolation"])))
    except isolation.SetupError as e:
        report(status_fd, {"setup_error": e.missing, "detail": e.detail, "hint": e.hint})
        os._exit(0)
    reaper = os.fork()
    if reaper == 0:
        reap(spec, status_fd)
    # Asked to stop (the wall-clock limit): kill the reaper, which takes the whole namespace with it,
    # and exit only once that is done, so the trainer knows that every process of the run is gone.
    signal.signal(signal.SIGTERM, lambda *_: os.kill(reaper, signal.SIGKILL))
    status = watch(reaper, spec["total_memory_bytes"], status_fd)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


def watch(reaper: int, limit: int, status_fd: int) -> int:
    """Wait for the reaper while keeping the memory of all the program's processes together under
    ``limit`` bytes: past it, say so on the status pipe and kill the reaper (and so the namespace).
    Returns the reaper's wait status."""
    while True:
        pid, status = os.waitpid(reaper, os.WNOHANG)
        if pid == reaper:
            return status
        used = memory.tree_usage(reaper, limit)
        if used > limit:
            report(status_fd, {"total_memory": used})
            os.kill(reaper, signal.SIGKILL)
            return os.waitpid(reaper, 0)[1]
        time.sleep(memory.POLL_S)


def _isolation_fields(fields: dict) -> dict:
    return {**fields, "readable_paths": tuple(fields.get("readable_paths", ()))}


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        # Anything unexpected: say so on the status pipe when we can, never run the program anyway.
        try:
            report(json.loads(sys.argv[1])["status_fd"], {"launch_error": traceback.format_exc(limit=5)})
        finally:
            os._exit(126)
