"""Running one untrusted Python program in the sandbox, from the trainer's side.

Each run gets a fresh directory (``tempfile.mkdtemp``, removed afterwards) holding the program's
working directory and, beside it where the program cannot reach them, the files of its standard
input, output and error. The launcher (``launcher.py``, a fresh ``python -I``) starts in a new
session, sets up the isolation and the limits, and execs the interpreter on the program. The trainer
waits at most ``wall_time_s``, then has the launcher kill the run's PID namespace (or, if the launcher
does not answer, kills its whole process group). :meth:`Sandbox.run` returns only once every process
of the run is gone.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

from verl.algos.rewards.sandbox.cleanup import remove_tree
from verl.algos.rewards.sandbox.interpreter import choose_python
from verl.algos.rewards.sandbox.isolation import (
    DEVICE_READ_PATHS,
    DEVICE_WRITE_PATHS,
    SYSTEM_READ_PATHS,
    Isolation,
    interpreter_read_paths,
)
from verl.algos.rewards.sandbox.limits import SandboxLimits
from verl.algos.rewards.sandbox.result import RunResult, RunStatus, SandboxUnavailableError

logger = logging.getLogger(__name__)

_MIB = 1024 * 1024
_LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launcher.py")
_STDERR_TAIL = 4000
#: Processes of a sandbox that count against RLIMIT_NPROC besides the program's: launcher and reaper.
_SANDBOX_PROCESSES = 2
#: How long the launcher gets to tear a run down before its whole process group is killed.
_STOP_GRACE_S = 5.0
#: The CPU and wall-clock limits (at least) of the setup check's trivial program.
_CHECK_TIME_S = 30.0
_SIGNAL_NAMES = {s.value: s.name for s in signal.Signals}


class Sandbox:
    """Runs Python programs under ``limits`` with ``isolation``. ``python``: the interpreter of the
    programs (None: the trainer's own, or a system python3 when the program's uid cannot reach it).
    Thread-safe: a scorer may call :meth:`run` from several threads at once."""

    def __init__(
        self, limits: SandboxLimits | None = None, isolation: Isolation | None = None, python: str | None = None
    ):
        if not sys.platform.startswith("linux"):
            raise SandboxUnavailableError("Linux", f"this is {sys.platform}", "run code rewards on Linux")
        self.limits = limits or SandboxLimits()
        self.isolation = isolation or Isolation()
        self._python_setting = python
        self._python: str | None = None
        self._checked = False
        self._lock = threading.Lock()

    @property
    def program_uid(self) -> tuple[int, int]:
        """The uid/gid the programs run as."""
        if os.geteuid() == 0:
            return self.isolation.sandbox_uid, self.isolation.sandbox_gid
        return os.getuid(), os.getgid()

    @property
    def python(self) -> str:
        if self._python is None:
            self._python = choose_python(self._python_setting, *self.program_uid)
        return self._python

    def check(self) -> None:
        """Run a trivial program once, so a machine that cannot sandbox fails at setup with a clear
        error rather than giving every sample 0. Raises SandboxUnavailableError."""
        with self._lock:
            if self._checked:
                return
            # Generous time limits: this checks the setup, and a busy machine must not fail it.
            patient = dataclasses.replace(
                self.limits,
                cpu_time_s=max(self.limits.cpu_time_s, _CHECK_TIME_S),
                wall_time_s=max(self.limits.wall_time_s, _CHECK_TIME_S),
            )
            result = self.run("print('sandbox ok')", limits=patient)
            if result.status is not RunStatus.COMPLETED or result.stdout.strip() != "sandbox ok":
                raise SandboxUnavailableError(
                    "a working interpreter",
                    f"a trivial program under the sandbox ended with {result.status.value} ({result.reason}); "
                    f"stderr: {result.stderr[-1000:]!r}",
                    f"check that {self.python} starts under the limits (memory_mb={self.limits.memory_mb}, "
                    f"max_open_files={self.limits.max_open_files}) and, with restrict_reads, add what it needs to "
                    "isolation readable_paths",
                )
            self._checked = True

    def run(self, source: str, stdin: str = "", limits: SandboxLimits | None = None) -> RunResult:
        """Run ``source`` with ``stdin`` as its standard input, under ``limits`` (default: the
        sandbox's). Failures of the program are results, never exceptions, and so is anything that
        goes wrong on the trainer's side of a run (status ``sandbox_error``, with the reason logged);
        only a sandbox that cannot be set up raises SandboxUnavailableError. The run's scratch
        directory is removed in every case (see :mod:`.cleanup`)."""
        root = tempfile.mkdtemp(prefix="verl-sandbox-")
        result = None
        try:
            result = self._run_in(root, source, stdin, limits or self.limits)
        except SandboxUnavailableError:
            raise
        except Exception as e:
            logger.exception("code sandbox: a run failed on the trainer's side; it scores as a failure")
            result = _sandbox_error(f"the sandbox failed while running the program: {type(e).__name__}: {e}")
        finally:
            try:
                remove_tree(root)
            except Exception as e:
                logger.exception("code sandbox: could not remove the scratch directory %s", root)
                result = _sandbox_error(f"the scratch directory {root} could not be removed: {type(e).__name__}: {e}")
        return result

    # -- internals ----------------------------------------------------------------------------------
    def _prepare(self, root: str, source: str, stdin: str) -> str:
        """Lay out a run's directory: ``work/`` (the program's, with ``program.py``) and, beside it
        where the program cannot reach them, the files of its standard input, output and error."""
        workdir = os.path.join(root, "work")
        os.mkdir(workdir, 0o700)
        program = os.path.join(workdir, "program.py")
        with open(program, "w", encoding="utf-8", errors="replace") as f:
            f.write(source)
        if os.geteuid() == 0:  # the program runs as sandbox_uid: let it into its own directory only
            os.chmod(root, 0o711)
            os.chown(workdir, self.isolation.sandbox_uid, self.isolation.sandbox_gid)
            os.chmod(program, 0o644)
        with open(os.path.join(root, "stdin"), "w", encoding="utf-8", errors="replace") as f:
            f.write(stdin)
        return workdir

    def _launch_spec(self, python: str, workdir: str, limits: SandboxLimits, status_fd: int) -> dict:
        """What the launcher needs, as JSON: it imports nothing of verl."""
        return {
            "python": python,
            "argv": ["-I", "-B", "program.py"],
            "env": {
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                "HOME": workdir,
                "TMPDIR": workdir,
                "LANG": "C.UTF-8",
                "LC_ALL": "C.UTF-8",
            },
            "isolation": {**dataclasses.asdict(self.isolation), "readable_paths": list(self.isolation.readable_paths)},
            "writable": [workdir, *DEVICE_WRITE_PATHS],
            "readable": [
                *SYSTEM_READ_PATHS,
                *interpreter_read_paths(python),
                *DEVICE_READ_PATHS,
                *self.isolation.readable_paths,
            ],
            "rlimits": limits.rlimits(extra_processes=_SANDBOX_PROCESSES),
            "total_memory_bytes": limits.total_memory_bytes,
            "status_fd": status_fd,
        }

    def _run_in(self, root: str, source: str, stdin: str, limits: SandboxLimits) -> RunResult:
        python = self.python
        workdir = self._prepare(root, source, stdin)
        status_read, status_write = os.pipe()
        spec = self._launch_spec(python, workdir, limits, status_write)
        start = time.monotonic()
        timed_out = False
        try:
            with (
                open(os.path.join(root, "stdin"), "rb") as stdin_file,
                open(os.path.join(root, "stdout"), "wb") as stdout_file,
                open(os.path.join(root, "stderr"), "wb") as stderr_file,
            ):
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", "-B", _LAUNCHER, json.dumps(spec)],
                    stdin=stdin_file,
                    stdout=stdout_file,
                    stderr=stderr_file,
                    pass_fds=(status_write,),
                    start_new_session=True,  # its own process group, killed as one on timeout
                    cwd=workdir,
                    env={"PATH": "/usr/bin:/bin"},
                )
                os.close(status_write)
                status_write = -1
                try:
                    proc.wait(timeout=limits.wall_time_s)
                except subprocess.TimeoutExpired:
                    timed_out = True
                    _stop(proc)
                finally:
                    _kill_group(proc.pid)  # whatever is left in the group (nothing, unless the launcher failed)
                    proc.wait()
        finally:
            if status_write >= 0:
                os.close(status_write)
            messages = _read_status(status_read)
        wall_s = time.monotonic() - start
        for message in messages:
            if "setup_error" in message:
                raise SandboxUnavailableError(message["setup_error"], message["detail"], message["hint"])
            if "launch_error" in message:
                raise SandboxUnavailableError(
                    "a working launcher",
                    message["launch_error"].strip(),
                    f"make sure {python} is executable by the program's uid; report a bug if it is",
                )
        stdout, truncated = _read_head(os.path.join(root, "stdout"), limits.max_output_bytes)
        stderr = _read_tail(os.path.join(root, "stderr"), _STDERR_TAIL)
        exit_code = next((m["exit_code"] for m in messages if "exit_code" in m), None)
        signum = next((m["signal"] for m in messages if "signal" in m), None)
        total_memory = next((m["total_memory"] for m in messages if "total_memory" in m), None)
        status, reason = _classify(
            limits, timed_out, exit_code, signum, stderr, truncated, proc.returncode, total_memory
        )
        return RunResult(status, reason, stdout, stderr, exit_code, signum, wall_s)


def _sandbox_error(reason: str) -> RunResult:
    return RunResult(RunStatus.SANDBOX_ERROR, reason, "", "")


def _classify(
    limits: SandboxLimits,
    timed_out: bool,
    exit_code: int | None,
    signum: int | None,
    stderr: str,
    truncated: bool,
    launcher: int,
    total_memory: int | None = None,
) -> tuple[RunStatus, str]:
    """The status of a run and, unless it completed, why."""
    if total_memory is not None:
        return RunStatus.MEMORY, (
            f"its processes together used {total_memory / _MIB:.0f} MiB, more than the limit of "
            f"{limits.total_memory_bytes / _MIB:.0f} MiB for the whole program"
        )
    if timed_out:
        return RunStatus.TIMEOUT, f"ran past the wall-clock limit of {limits.wall_time_s:g}s"
    if signum is not None:
        if signum == signal.SIGXCPU:
            return RunStatus.TIMEOUT, f"used more than the CPU-time limit of {limits.cpu_time_s:g}s"
        return RunStatus.KILLED, f"killed by signal {_SIGNAL_NAMES.get(signum, signum)}"
    if exit_code is None:
        return RunStatus.KILLED, f"the sandbox ended without the program's status (launcher exit {launcher})"
    last_line = stderr.strip().rsplit("\n", 1)[-1] if stderr.strip() else ""
    if exit_code != 0 and last_line.startswith("MemoryError"):
        return RunStatus.MEMORY, f"ran out of memory (the limit is {limits.memory_mb} MiB of address space)"
    if truncated:
        return RunStatus.OUTPUT_LIMIT, f"wrote more than {limits.max_output_mb:g} MiB of output"
    if exit_code != 0:
        return RunStatus.RUNTIME_ERROR, f"exit status {exit_code}: {last_line[:300]}"
    return RunStatus.COMPLETED, ""


def _stop(proc: subprocess.Popen) -> None:
    """Past the wall-clock limit: ask the launcher to kill the run's PID namespace and wait until it
    has (so no process of the run outlives this call); kill the whole group if it does not answer."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=_STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def _read_status(fd: int) -> list[dict]:
    """The launcher's JSON lines. Non-blocking: whatever was written before every writer ended."""
    os.set_blocking(fd, False)
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    messages = []
    for line in b"".join(chunks).decode("utf-8", "replace").splitlines():
        try:
            messages.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return messages


def _read_head(path: str, limit: int) -> tuple[str, bool]:
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    return data[:limit].decode("utf-8", "replace"), len(data) > limit


def _read_tail(path: str, chars: int) -> str:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 4 * chars))
        return f.read().decode("utf-8", "replace")[-chars:]
