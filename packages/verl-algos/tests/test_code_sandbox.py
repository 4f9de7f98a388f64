"""The code sandbox with real processes: hostile programs (a fork bomb, an infinite loop, a write
outside the working directory, a large allocation, socket connections) each fail safely and leave
nothing behind, and a machine that cannot sandbox stops with a clear error instead of running the
program unsandboxed."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading

import pytest

from verl.algos.rewards.sandbox import Isolation, RunStatus, Sandbox, SandboxLimits, SandboxUnavailableError
from verl.algos.rewards.sandbox.landlock import LandlockError, abi_version

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the code sandbox is Linux-only")

LIMITS = SandboxLimits(cpu_time_s=1, wall_time_s=2, memory_mb=256, max_processes=6)
#: The same sandbox without Landlock: shows which layer stops what (and that the test would notice).
NO_LANDLOCK = Isolation(filesystem=False, restrict_reads=False)


def landlock_available() -> bool:
    try:
        return abi_version() >= 1
    except LandlockError:
        return False


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    box = Sandbox(LIMITS)
    box.check()
    return box


@pytest.fixture
def open_dir():
    """A world-writable, world-readable directory outside any sandbox: file permissions alone would let
    the program's uid in, so only the sandbox's own isolation can keep it out."""
    path = tempfile.mkdtemp(prefix="verl-sandbox-test-")
    os.chmod(path, 0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def program_processes() -> list[int]:
    """Processes, anywhere on the machine, that run a sandboxed program (``... program.py``)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"program.py" in argv and b"-I" in argv:
            pids.append(int(entry))
    return pids


class ProcessCounter:
    """The most sandboxed-program processes seen at once while a run is going on."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, len(program_processes()))
            self._stop.wait(0.02)

    def __enter__(self) -> ProcessCounter:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def test_a_correct_program_reads_stdin_and_its_directory_is_removed(sandbox):
    result = sandbox.run("import os\nprint(int(input()) * 2)\nprint(os.getcwd())", stdin="21\n")
    assert result.status is RunStatus.COMPLETED, result
    answer, workdir = result.stdout.split()
    assert answer == "42"
    assert "verl-sandbox-" in workdir and not os.path.exists(workdir), "the throwaway directory is removed"


def test_the_program_runs_unprivileged_in_its_own_namespaces():
    # if_nameindex needs a socket, which the seccomp filter refuses: this run goes without the filter.
    source = textwrap.dedent(
        """
        import os, socket
        print(os.getuid(), os.getpid(), [name for _, name in socket.if_nameindex()])
        """
    )
    result = Sandbox(LIMITS, Isolation(deny_sockets=False)).run(source)
    assert result.status is RunStatus.COMPLETED, result
    uid, pid, interfaces = result.stdout.split(maxsplit=2)
    assert int(uid) != 0, "never root: the kernel does not enforce process limits for root"
    assert pid == "2", "the program is the second process of a fresh PID namespace (the reaper is 1)"
    assert interfaces.strip() == "['lo']", "a fresh network namespace has only a loopback"


def test_fork_bomb_is_contained_and_every_process_is_gone_afterwards(sandbox):
    before = len(program_processes())
    bomb = textwrap.dedent(
        """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """
    )
    with ProcessCounter() as counter:
        result = sandbox.run(bomb)
    assert result.status is RunStatus.TIMEOUT, result
    assert 1 <= counter.peak <= LIMITS.max_processes, (
        f"{counter.peak} processes at once; the limit is {LIMITS.max_processes}"
    )
    assert len(program_processes()) == before, "the fork bomb left processes behind"


def test_the_process_limit_counts_the_program_itself(sandbox):
    source = textwrap.dedent(
        """
        import os, time
        children = 0
        while True:
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                time.sleep(30)
                os._exit(0)
            children += 1
        print(children)
        """
    )
    result = sandbox.run(source)
    assert result.status is RunStatus.COMPLETED, result
    assert int(result.stdout) == LIMITS.max_processes - 1
    assert program_processes() == [], "children sleeping when the program exits are killed with it"


def test_a_process_that_leaves_the_group_with_setsid_dies_with_the_run(sandbox):
    source = textwrap.dedent(
        """
        import os, time
        if os.fork() == 0:
            os.setsid()
            time.sleep(60)
            os._exit(0)
        print("parent done")
        """
    )
    result = sandbox.run(source)
    assert result.status is RunStatus.COMPLETED and result.stdout.strip() == "parent done", result
    assert program_processes() == []


def test_infinite_loop_hits_the_cpu_limit():
    # A generous wall clock, so that on a loaded machine it is still the CPU limit (1 s) that stops it.
    result = Sandbox(SandboxLimits(cpu_time_s=1, wall_time_s=60)).run("while True:\n    pass\n")
    assert result.status is RunStatus.TIMEOUT, result
    assert "CPU" in result.reason


def test_sleeping_forever_hits_the_wall_clock_limit(sandbox):
    result = sandbox.run("import time\ntime.sleep(3600)\n")
    assert result.status is RunStatus.TIMEOUT, result
    assert "wall-clock" in result.reason
    assert program_processes() == []


def test_large_allocation_is_a_memory_error_inside_the_program(sandbox):
    result = sandbox.run("data = bytearray(8 * 1024 ** 3)\nprint(len(data))\n")
    assert result.status is RunStatus.MEMORY, result
    assert "MemoryError" in result.stderr


def test_output_flood_is_cut(sandbox):
    result = sandbox.run("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n")
    assert result.status is RunStatus.OUTPUT_LIMIT, result
    assert len(result.stdout) == LIMITS.max_output_bytes


@pytest.mark.skipif(not landlock_available(), reason="Landlock is not available on this kernel")
def test_write_outside_its_directory_fails(sandbox, open_dir, tmp_path):
    targets = [os.path.join(open_dir, "escaped.txt"), str(tmp_path / "escaped.txt"), "/tmp/verl-sandbox-escaped.txt"]
    source = textwrap.dedent(
        f"""
        import os
        denied = []
        for path in {targets!r}:
            try:
                with open(path, "w") as f:
                    f.write("escaped")
            except OSError as e:
                denied.append(e.errno)
        os.makedirs("inside/ok")
        with open("inside/ok/file.txt", "w") as f:
            f.write("fine")
        print(len(denied), open("inside/ok/file.txt").read())
        """
    )
    result = sandbox.run(source)
    assert result.status is RunStatus.COMPLETED, result
    assert result.stdout.split() == [str(len(targets)), "fine"], "every write outside failed, inside worked"
    assert not any(os.path.exists(path) for path in targets)


@pytest.mark.skipif(not landlock_available(), reason="Landlock is not available on this kernel")
def test_without_landlock_the_same_write_would_succeed(open_dir):
    """The control for the test above: the open directory really is writable by the program's uid, so
    it is Landlock that stops the write."""
    result = Sandbox(LIMITS, NO_LANDLOCK).run(f"open({os.path.join(open_dir, 'control.txt')!r}, 'w').write('x')")
    assert result.status is RunStatus.COMPLETED, result
    assert os.path.exists(os.path.join(open_dir, "control.txt"))


@pytest.mark.skipif(not landlock_available(), reason="Landlock is not available on this kernel")
def test_reads_are_limited_to_the_interpreter_and_system_files(sandbox, open_dir):
    secret = os.path.join(open_dir, "answers.txt")
    with open(secret, "w") as f:
        f.write("the expected outputs")
    os.chmod(secret, 0o644)
    source = f"print(open('/etc/hostname').read() != '')\nprint(open({secret!r}).read())"
    result = sandbox.run(source)
    assert result.status is RunStatus.RUNTIME_ERROR and "PermissionError" in result.reason, result
    assert result.stdout.strip() == "True", "system files stay readable"
    assert "expected outputs" not in result.stdout
    control = Sandbox(LIMITS, Isolation(restrict_reads=False)).run(f"print(open({secret!r}).read())")
    assert control.stdout.strip() == "the expected outputs", "the file is readable without the read rules"


NETWORK_PROBE = """
import errno, socket
outcomes = []
for address in [("1.1.1.1", 53), ("127.0.0.1", {port})]:
    try:
        s = socket.socket()
        s.settimeout(2)
        s.connect(address)
        outcomes.append("connected")
    except OSError as e:
        outcomes.append(errno.errorcode.get(e.errno, str(e)))
try:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.sendto(b"x", ("1.1.1.1", 53))
    outcomes.append("sent")
except OSError as e:
    outcomes.append(errno.errorcode.get(e.errno, str(e)))
print(" ".join(outcomes))
"""


@pytest.mark.parametrize(
    "isolation",
    [Isolation(), Isolation(filesystem=False, restrict_reads=False, deny_sockets=False)],
    ids=["default", "network-namespace-only"],
)
def test_socket_connections_fail(isolation):
    """To an outside address and to a socket the test listens on in the trainer's namespace: with the
    default isolation (seccomp refuses the socket, Landlock refuses TCP and the namespace has no
    route) and with the network namespace alone."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        result = Sandbox(LIMITS, isolation).run(NETWORK_PROBE.format(port=port))
        assert result.status is RunStatus.COMPLETED, result
        outcomes = result.stdout.split()
        assert len(outcomes) == 3 and "connected" not in outcomes and "sent" not in outcomes, outcomes
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever reached the listener


def test_the_trainer_carries_on_after_hostile_programs(sandbox):
    """The same sandbox keeps working after each kind of failure."""
    for source in ["while True: pass", "bytearray(8 * 1024 ** 3)", "import os\nwhile True: os.fork()", "1/0"]:
        assert sandbox.run(source).status is not RunStatus.COMPLETED
    assert sandbox.run("print('still here')").stdout == "still here\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root trainer may run without a user namespace")
def test_root_without_user_namespace_still_enforces_the_limits():
    box = Sandbox(LIMITS, Isolation(user_namespace=False))
    result = box.run("import os\nprint(os.getuid(), os.getpid())\nopen('/tmp/verl-sandbox-escaped.txt', 'w')")
    assert result.status is RunStatus.RUNTIME_ERROR, result
    assert result.stdout.split() == [str(Isolation().sandbox_uid), "2"]
    with ProcessCounter() as counter:
        bomb = box.run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n")
    assert bomb.status is RunStatus.TIMEOUT and counter.peak <= LIMITS.max_processes
    assert program_processes() == []


@pytest.mark.skipif(os.geteuid() != 0, reason="a non-root trainer runs programs as itself")
def test_an_interpreter_the_program_uid_cannot_reach_is_a_clear_error(tmp_path):
    hidden = tmp_path / "private"
    hidden.mkdir(mode=0o700)
    python = hidden / "python3"
    os.symlink(shutil.which("python3") or "/usr/bin/python3", python)
    with pytest.raises(SandboxUnavailableError, match="cannot be run by uid 65534"):
        Sandbox(LIMITS, python=str(python)).run("print(1)")


NO_USER_NAMESPACES = r"""
import ctypes, os, sys
from verl.algos.rewards.sandbox import Sandbox, SandboxLimits, SandboxUnavailableError

# A machine whose user namespaces are disabled, simulated without touching the real machine: a
# child user namespace (uid 0 and 65534 mapped) whose own limit on nested user namespaces is 0.
libc = ctypes.CDLL(None, use_errno=True)
ready_r, ready_w = os.pipe()
go_r, go_w = os.pipe()
child = os.fork()
if child == 0:
    if libc.unshare(0x10000000) != 0:
        os._exit(3)
    os.write(ready_w, b"1")
    os.read(go_r, 1)
    with open("/proc/sys/user/max_user_namespaces", "w") as f:
        f.write("0")
    try:
        Sandbox(SandboxLimits(wall_time_s=5)).run("print('ran unsandboxed')")
    except SandboxUnavailableError as e:
        print("REFUSED:", e, flush=True)
        os._exit(0)
    print("NOT REFUSED", flush=True)
    os._exit(1)
os.read(ready_r, 1)
for name in ("uid_map", "gid_map"):
    with open(f"/proc/{child}/{name}", "w") as f:
        f.write("0 0 1\n65534 65534 1\n")
os.write(go_w, b"1")
_, status = os.waitpid(child, 0)
sys.exit(os.WEXITSTATUS(status))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="simulating a machine without user namespaces needs root")
def test_without_user_namespaces_the_sandbox_refuses_with_a_clear_error():
    done = subprocess.run([sys.executable, "-c", NO_USER_NAMESPACES], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "REFUSED: the code sandbox cannot run programs here: user namespaces" in done.stdout
    assert "max_user_namespaces" in done.stdout and "user_namespace=False" in done.stdout, "says how to fix it"
    assert "ran unsandboxed" not in done.stdout
