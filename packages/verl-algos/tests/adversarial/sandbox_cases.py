"""The code sandbox's adversarial table: each case says what a program (or a careless user) tries
and what must happen, and checks it with real processes. ``tests/test_sandbox_adversarial.py`` runs
every case; docs/reliability.md points here.

A case is a function registered with :func:`case`; it gets an :class:`Env` (a sandbox with short
limits, a code reward, a world-writable directory outside every sandbox) and asserts on what really
happened: a listener that received nothing, a planted file whose mode did not change, a score of 0.
Where a case shows that a layer holds, it also runs a control without that layer when that is cheap,
so that the case would notice if the attack stopped being an attack.
"""

from __future__ import annotations

import errno
import json
import os
import platform
import socket
import stat
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from verl.algos.rewards.code import CodeReward
from verl.algos.rewards.sandbox import Isolation, RunResult, RunStatus, Sandbox, SandboxLimits

LIMITS = SandboxLimits(cpu_time_s=2, wall_time_s=4, memory_mb=256, max_processes=6)


@dataclass
class Env:
    sandbox: Sandbox
    reward: CodeReward
    open_dir: str  # world-writable, outside every sandbox
    scratch_root: str  # where this process's sandboxes make their scratch folders (tempfile.tempdir)

    def leftovers(self) -> list[str]:
        """Scratch folders still there: none may be, once a run has returned."""
        return os.listdir(self.scratch_root)

    def run(self, source: str, isolation: Isolation | None = None, limits: SandboxLimits | None = None) -> RunResult:
        box = self.sandbox if isolation is None and limits is None else Sandbox(limits or LIMITS, isolation)
        return box.run(textwrap.dedent(source))

    def outcome(self, source: str, isolation: Isolation | None = None) -> str:
        """The one line a probe program prints (its stdout, stripped), asserting it completed."""
        result = self.run(source, isolation)
        assert result.status is RunStatus.COMPLETED, result
        return result.stdout.strip()


@dataclass(frozen=True)
class Case:
    name: str
    tried: str
    must: str
    check: Callable[[Env], None]


CASES: list[Case] = []


def case(name: str, tried: str, must: str):
    def register(check: Callable[[Env], None]) -> Callable[[Env], None]:
        CASES.append(Case(name, tried, must, check))
        return check

    return register


def markdown_table() -> str:
    rows = ["| case | what is tried | what must happen |", "|---|---|---|"]
    rows += [f"| `{c.name}` | {c.tried} | {c.must} |" for c in CASES]
    return "\n".join(rows)


# The probe of one socket family: create it and, where there is an address, connect or send to it;
# print the errno name of the first step that fails, or "reached".
SOCKET_PROBE = """
import errno, socket
try:
    s = socket.socket({family}, {kind}, {proto})
    {action}
    print("reached")
except OSError as e:
    print(errno.errorcode.get(e.errno, str(e)))
"""

NO_SOCKET_FILTER = Isolation(deny_sockets=False)


def _socket_probe(family: str, kind: str, proto: int = 0, action: str = "pass") -> str:
    return SOCKET_PROBE.format(family=family, kind=kind, proto=proto, action=action)


def _nothing_arrived(listener: socket.socket) -> bool:
    listener.setblocking(False)
    try:
        listener.accept() if listener.type == socket.SOCK_STREAM else listener.recv(16)
    except BlockingIOError:
        return True
    return False


# ------------------------------------------------------------------------------------------ sockets
@case(
    "unix-path-socket",
    "connect to a UNIX socket the trainer listens on at a world-writable path (as /run/docker.sock or Ray's sockets)",
    "socket() is refused (EACCES) and nothing reaches the listener; without the seccomp filter the same connect "
    "succeeds, so the filter is what holds",
)
def unix_path_socket(env: Env) -> None:
    path = os.path.join(env.open_dir, "trainer.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        os.chmod(path, 0o777)
        listener.listen(4)
        probe = _socket_probe("socket.AF_UNIX", "socket.SOCK_STREAM", action=f"s.connect({path!r})")
        assert env.outcome(probe) == "EACCES"
        assert _nothing_arrived(listener)
        assert env.outcome(probe, NO_SOCKET_FILTER) == "reached", "control: the path socket is reachable otherwise"


@case(
    "unix-abstract-socket",
    "connect to an abstract UNIX socket (no file) the trainer listens on",
    "socket() is refused; without the filter the network namespace still keeps the name out of reach",
)
def unix_abstract_socket(env: Env) -> None:
    name = "\0verl-test-" + uuid.uuid4().hex
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(name)
        listener.listen(4)
        probe = _socket_probe("socket.AF_UNIX", "socket.SOCK_STREAM", action=f"s.connect({name!r})")
        assert env.outcome(probe) == "EACCES"
        assert env.outcome(probe, NO_SOCKET_FILTER) == "ECONNREFUSED"
        assert _nothing_arrived(listener)


def _inet_case(family: socket.AddressFamily, kind: socket.SocketKind, host: str) -> Callable[[Env], None]:
    def check(env: Env) -> None:
        with socket.socket(family, kind) as listener:
            listener.bind((host, 0))
            if kind == socket.SOCK_STREAM:
                listener.listen(4)
            port = listener.getsockname()[1]
            verb = (
                f"s.connect(({host!r}, {port}))"
                if kind == socket.SOCK_STREAM
                else f"s.sendto(b'x', ({host!r}, {port}))"
            )
            probe = _socket_probe(f"socket.{family.name}", f"socket.{kind.name}", action=verb)
            assert env.outcome(probe) == "EACCES"
            assert env.outcome(probe, NO_SOCKET_FILTER) != "reached", "the network namespace is a second layer"
            assert _nothing_arrived(listener)

    return check


for _family, _host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
    for _kind, _proto in ((socket.SOCK_STREAM, "TCP"), (socket.SOCK_DGRAM, "UDP")):
        _label = f"{_family.name.lower().replace('af_', '')}-{_proto.lower()}"
        case(
            _label,
            f"{_proto} over {_family.name} to a listener of the trainer on {_host}",
            "socket() is refused and nothing arrives; without the filter the empty network namespace still has no route",
        )(_inet_case(_family, _kind, _host))


@case("netlink-socket", "open a netlink socket (routing, uevents)", "socket() is refused (EACCES)")
def netlink_socket(env: Env) -> None:
    assert env.outcome(_socket_probe("socket.AF_NETLINK", "socket.SOCK_RAW")) == "EACCES"


@case("packet-socket", "open a raw packet socket", "socket() is refused (EACCES)")
def packet_socket(env: Env) -> None:
    assert env.outcome(_socket_probe("socket.AF_PACKET", "socket.SOCK_RAW")) == "EACCES"


@case(
    "socketpair",
    "socket.socketpair(), which asyncio and multiprocessing.Pipe use",
    "allowed: two connected, unnamed ends inside the program that reach nothing else",
)
def socketpair_allowed(env: Env) -> None:
    source = "import socket\na, b = socket.socketpair()\na.send(b'ok')\nprint(b.recv(2).decode())"
    assert env.outcome(source) == "ok"


@case(
    "io-uring",
    "io_uring_setup, whose IORING_OP_SOCKET/CONNECT would never call socket()",
    "refused (EPERM)",
)
def io_uring(env: Env) -> None:
    source = """
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(120)
    fd = libc.syscall(425, 4, params)
    print(fd, ctypes.get_errno())
    """
    assert env.outcome(source) == f"-1 {errno.EPERM}"


# Machine code (x86-64) for socket(AF_UNIX, SOCK_STREAM, 0) through another ABI: i386's int 0x80
# (socket is 359 there) and x32 (the native number with bit 30 set). Returns eax.
_I386_SOCKET = "53 b8 67 01 00 00 bb 01 00 00 00 b9 01 00 00 00 31 d2 cd 80 5b c3"
_X32_SOCKET = "b8 29 00 00 40 bf 01 00 00 00 be 01 00 00 00 31 d2 0f 05 c3"
_RUN_MACHINE_CODE = """
import ctypes, mmap
code = bytes.fromhex({code!r})
memory = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
memory.write(code)
address = ctypes.addressof(ctypes.c_char.from_buffer(memory))
print(ctypes.CFUNCTYPE(ctypes.c_int)(address)())
"""


@case(
    "foreign-abi-socket",
    "socket() through the i386 (int 0x80) and x32 system call tables, which a filter on native numbers would miss",
    "refused (-EPERM) on x86-64: the filter refuses every call of another ABI",
)
def foreign_abi_socket(env: Env) -> None:
    if platform.machine() != "x86_64":
        import pytest

        pytest.skip("the machine code is x86-64 (on arm64 the filter refuses arm32 calls the same way, untested)")
    for code in (_I386_SOCKET, _X32_SOCKET):
        assert env.outcome(_RUN_MACHINE_CODE.format(code=code)) == str(-errno.EPERM)


@case(
    "nested-namespaces",
    "unshare a new user and network namespace inside the sandbox (to gain capabilities), then open a socket or mount",
    "the socket is still refused (the filter is inherited) and mount is refused (Landlock forbids mount changes)",
)
def nested_namespaces(env: Env) -> None:
    source = """
    import ctypes, errno, socket
    libc = ctypes.CDLL(None, use_errno=True)
    unshared = libc.unshare(0x10000000 | 0x40000000) == 0
    try:
        socket.socket()
        sock = "created"
    except OSError as e:
        sock = errno.errorcode[e.errno]
    mounted = libc.mount(b"none", b".", b"tmpfs", 0, None) == 0
    print(unshared, sock, mounted)
    """
    _unshared, sock, mounted = env.outcome(source).split()
    assert sock == "EACCES" and mounted == "False"


@case(
    "unmapped-memory",
    "memfd_create and System V shared memory: memory no process's resident set shows",
    "both refused (EPERM)",
)
def unmapped_memory(env: Env) -> None:
    source = """
    import ctypes, os
    try:
        os.memfd_create("x")
        memfd = "created"
    except OSError as e:
        memfd = e.errno
    libc = ctypes.CDLL(None, use_errno=True)
    shm = libc.shmget(0, 1 << 30, 0o1000 | 0o600)
    print(memfd, shm, ctypes.get_errno())
    """
    assert env.outcome(source) == f"{errno.EPERM} -1 {errno.EPERM}"


# ------------------------------------------------------------------------------------------ verdict
A_PLUS_B = {"inputs": ["1 2\n", "10 20\n"], "outputs": ["3\n", "30\n"]}
SQUARES = {"assert_case": ["assert square(3) == 9", "assert square(-4) == 16", "assert abs(square(0.5) - 0.25) < 1e-9"]}
WRONG_SQUARE = "def square(x):\n    return x + 1\n"

#: Wrong solutions that rewrite the way they end or what the judge would look at; each must score 0.
FORGERIES = {
    "excepthook": "import os, sys\nsys.excepthook = lambda *a: os._exit(0)\n",
    "atexit": "import atexit, os\natexit.register(lambda: os._exit(0))\n",
    "exit-early": "import os\nos._exit(0)\n",
    "sys-exit-0": "import sys\nsys.exit(0)\n",
    "always-equal": "class Anything:\n    __eq__ = lambda self, other: True\n    __lt__ = __eq__\n    __sub__ = lambda self, o: self\n    __abs__ = lambda self: 0\n",
    "patched-builtins": "import builtins\nbuiltins.AssertionError = type('Quiet', (Exception,), {})\nbuiltins.abs = lambda x: 0\n",
    "kill-harness": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
    "kill-reaper": "import os, signal\ntry:\n    os.kill(1, signal.SIGKILL)\nexcept OSError:\n    pass\n",
    "fake-records": (
        "print('@@verl-judge@@[\"ran\"]')\n"
        + "".join(f"print('@@verl-judge@@[\"value\", {i}, 0]')\n" for i in range(3))
        + "print('PASS')\nimport os\nos._exit(0)\n"
    ),
    "read-own-source": "import re\n_tests = open(__file__).read() if '__file__' in dir() else ''\n",
}


def _forgery_program(trick: str, base: str) -> str:
    # The trick runs first; square is defined wrong (or, for always-equal, returns the cheating object).
    if "class Anything" in trick:
        return trick + "def square(x):\n    return Anything()\n"
    return base + trick


@case(
    "forged-verdict",
    "a wrong solution that rewrites its exit path (sys.excepthook, atexit + os._exit(0), sys.exit(0)), returns an "
    "object equal to everything, patches builtins and AssertionError, kills its harness or the namespace's init, "
    "prints fake PASS and judge-record lines, or reads its own source for the expected values",
    "each scores 0 (the trainer compares the values the harness recorded with expectations the program never sees); "
    "a correct solution still scores 1",
)
def forged_verdict(env: Env) -> None:
    correct = env.reward("code", "```python\ndef square(x):\n    return x * x\n```", json.dumps(SQUARES))
    assert correct["score"] == 1.0, correct
    for name, trick in FORGERIES.items():
        program = _forgery_program(trick, WRONG_SQUARE)
        result = env.reward("code", f"```python\n{program}```", json.dumps(SQUARES))
        assert result["score"] == 0.0, (name, result)
    for name, trick in FORGERIES.items():  # the same tricks on stdin/stdout tests
        program = "a, b = map(int, input().split())\nprint(a * b)\n" + trick
        result = env.reward("code", f"```python\n{program}```", json.dumps(A_PLUS_B))
        assert result["score"] == 0.0, (name, result)


@case(
    "crash-after-correct-output",
    "print the right answer, then crash (or forge exit 0 after the crash via atexit)",
    "the crash fails the test: a harness error record is never overruled by the exit status",
)
def crash_after_output(env: Env) -> None:
    crash = "a, b = map(int, input().split())\nprint(a + b)\nraise RuntimeError('late')\n"
    assert env.reward("code", f"```python\n{crash}```", json.dumps(A_PLUS_B))["score"] == 0.0
    forged = "import atexit, os\natexit.register(lambda: os._exit(0))\n" + crash
    assert env.reward("code", f"```python\n{forged}```", json.dumps(A_PLUS_B))["score"] == 0.0


# ------------------------------------------------------------------------------------------ cleanup
@case(
    "deep-tree",
    "build a folder tree 1500 levels deep, 4500 characters of path (past PATH_MAX and Python's recursion limit)",
    "the run ends normally, the reward scores it, and the scratch folder is removed",
)
def deep_tree(env: Env) -> None:
    source = """
    import os
    for _ in range(1500):
        os.mkdir("dd")
        os.chdir("dd")
    open("leaf", "w").write("x")
    print("built")
    """
    patient = SandboxLimits(cpu_time_s=20, wall_time_s=30, memory_mb=256, max_processes=6)  # a busy machine
    result = env.run(source, limits=patient)
    assert result.status is RunStatus.COMPLETED and result.stdout.strip() == "built", result
    assert env.leftovers() == []
    scored = env.reward("code", "```python\n" + textwrap.dedent(source) + "```", json.dumps(A_PLUS_B))
    # A scored failure (wrong_answer; timeout on a busy machine), never an exception out of the reward.
    assert scored["score"] == 0.0 and scored["code_status"] in ("wrong_answer", "timeout"), scored
    assert env.leftovers() == []


@case(
    "huge-tree",
    "create 8000 files and folders, some folders without any permission bits",
    "the scratch folder is removed all the same",
)
def huge_tree(env: Env) -> None:
    source = """
    import os
    for i in range(100):
        os.makedirs(f"a{i}/b")
        for j in range(40):
            open(f"a{i}/b/f{j}", "w").close()
            os.mkdir(f"a{i}/d{j}")
        os.chmod(f"a{i}/b", 0)
        os.chmod(f"a{i}", 0)
    print("built")
    """
    patient = SandboxLimits(cpu_time_s=20, wall_time_s=30, memory_mb=256, max_processes=6)  # a busy machine
    result = env.run(source, limits=patient)
    assert result.status is RunStatus.COMPLETED and result.stdout.strip() == "built", result
    assert env.leftovers() == []


PLANT_LINKS = """
import os
os.makedirs("trap/inner")
os.symlink({target!r}, "trap/inner/file-link")
os.symlink({target_dir!r}, "trap/inner/dir-link")
os.symlink({target!r}, "top-link")
os.chmod("trap/inner", 0o500)
os.chmod("trap", 0o500)
print("planted")
"""


def _planted_targets(env: Env, owner: int) -> tuple[str, str]:
    target = os.path.join(env.open_dir, "outside.txt")
    with open(target, "w") as f:
        f.write("keep me")
    target_dir = os.path.join(env.open_dir, "outside-dir")
    os.mkdir(target_dir)
    with open(os.path.join(target_dir, "inside.txt"), "w") as f:
        f.write("keep me too")
    for path in (target, target_dir, os.path.join(target_dir, "inside.txt")):
        os.chown(path, owner, owner) if os.geteuid() == 0 else None
    os.chmod(target, 0o600)
    os.chmod(target_dir, 0o755)
    return target, target_dir


def _assert_untouched(target: str, target_dir: str) -> None:
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600, "the cleanup changed the mode of a file outside"
    assert stat.S_IMODE(os.stat(target_dir).st_mode) == 0o755
    assert open(target).read() == "keep me"
    assert open(os.path.join(target_dir, "inside.txt")).read() == "keep me too"


@case(
    "planted-links",
    "plant symlinks to a file and a folder outside, inside folders it made read-only, so that a cleanup that "
    "retries with chmod would follow them",
    "the cleanup removes the links, never their targets, and changes no mode outside (trainer as root)",
)
def planted_links(env: Env) -> None:
    target, target_dir = _planted_targets(env, Isolation().sandbox_uid)
    assert env.outcome(PLANT_LINKS.format(target=target, target_dir=target_dir)) == "planted"
    _assert_untouched(target, target_dir)
    assert env.leftovers() == []


NON_ROOT_TRAINER = """
import json, site, sys
site.addsitedir({site_dir!r})
from verl.algos.rewards.sandbox import Sandbox, SandboxLimits
result = Sandbox(SandboxLimits(wall_time_s=10)).run({source!r})
print(json.dumps([result.status.value, result.stdout, result.stderr[-500:]]))
"""


def _python_for(uid: int) -> str | None:
    """A Python of this interpreter's version that ``uid`` can run (the venv's may be under /root)."""
    from verl.algos.rewards.sandbox.interpreter import reachable_by

    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        if os.path.exists(candidate) and reachable_by(candidate, uid, uid) is None:
            return candidate
    return None


@case(
    "planted-links-non-root-trainer",
    "the same links, with the trainer running as an unprivileged user (the program then runs as that user too, "
    "and owns the targets' user: a chmod through a link would succeed)",
    "the targets keep their mode and content, the scratch folder is removed",
)
def planted_links_non_root(env: Env) -> None:
    nobody = 65534
    python = _python_for(nobody)
    site_dir = next((p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)), None)
    if os.geteuid() != 0 or python is None or site_dir is None:
        import pytest

        pytest.skip("needs root to start the trainer side as another user, and a Python that user can run")
    target, target_dir = _planted_targets(env, nobody)
    scratch = os.path.join(env.open_dir, "scratch-of-nobody")
    os.mkdir(scratch, 0o700)
    os.chown(scratch, nobody, nobody)
    driver = NON_ROOT_TRAINER.format(
        site_dir=site_dir, source=textwrap.dedent(PLANT_LINKS.format(target=target, target_dir=target_dir))
    )
    done = subprocess.run(
        [python, "-I", "-c", driver],
        user=nobody,
        group=nobody,
        extra_groups=[],
        capture_output=True,
        text=True,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": scratch},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    status, stdout, stderr = json.loads(done.stdout.strip().splitlines()[-1])
    assert status == "completed" and stdout.strip() == "planted", (status, stdout, stderr)
    _assert_untouched(target, target_dir)
    leftovers = [name for name in os.listdir(scratch) if name.startswith("verl-sandbox-")]  # torch caches go here too
    assert leftovers == [], "the non-root trainer left its scratch folder behind"


@case(
    "trainer-side-exception",
    "a failure on the trainer's side of a run (here: a standard input that is not text)",
    "the run is a scored failure (sandbox_error, with the reason), never an exception out of the reward, and the "
    "scratch folder is removed",
)
def trainer_side_exception(env: Env) -> None:
    result = env.sandbox.run("print(1)", stdin=object())  # type: ignore[arg-type]
    assert result.status is RunStatus.SANDBOX_ERROR and "TypeError" in result.reason, result
    assert env.leftovers() == []


# ------------------------------------------------------------------------------------------ resources
@case(
    "memory-summed-over-children",
    "four children, each allocating 100 MiB (well under the 256 MiB per-process limit), 400 MiB together",
    "the run is ended with status memory and scores 0 (the memory of the whole program is accounted)",
)
def memory_summed(env: Env) -> None:
    source = """
    import os, time
    children = []
    for _ in range(4):
        pid = os.fork()
        if pid == 0:
            block = bytearray(100 * 1024 * 1024)
            for i in range(0, len(block), 4096):
                block[i] = 1
            time.sleep(30)
            os._exit(0)
        children.append(pid)
    for pid in children:
        os.waitpid(pid, 0)
    print(3)
    """
    result = env.run(source, limits=SandboxLimits(cpu_time_s=5, wall_time_s=20, memory_mb=256, max_processes=6))
    assert result.status is RunStatus.MEMORY and "together" in result.reason, result
    assert result.wall_s < 15, "ended by the accounting, not by the wall clock"
    program = (
        "```python\n" + textwrap.dedent(source).replace("print(3)", "print(sum(map(int, input().split())))") + "```"
    )
    assert env.reward("code", program, json.dumps(A_PLUS_B))["score"] == 0.0
    single = env.run("block = bytearray(150 * 1024 * 1024)\nprint(len(block) > 0)")
    assert single.status is RunStatus.COMPLETED, "one process within the limit is not ended"


@case(
    "fork-bomb",
    "fork without end",
    "at most max_processes at once; the run times out and no process is left",
)
def fork_bomb(env: Env) -> None:
    result = env.run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n")
    assert result.status is RunStatus.TIMEOUT, result


@case(
    "outliving-children",
    "leave children behind that sleep past the program's end, one of them in a new session (setsid), one ignoring SIGTERM",
    "every one is killed with the run (the PID namespace ends with its init)",
)
def outliving_children(env: Env) -> None:
    marker = os.path.join(env.open_dir, "late-" + uuid.uuid4().hex)
    source = f"""
    import os, signal, time
    for detach in (True, False):
        if os.fork() == 0:
            if detach:
                os.setsid()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(1)
            open({marker!r}, "w").write("survived")
            os._exit(0)
    print("parent done")
    """
    assert env.outcome(source, Isolation(filesystem=False, restrict_reads=False)) == "parent done"
    import time

    time.sleep(1.5)
    assert not os.path.exists(marker), "a child outlived its run"


@case(
    "signals-outside",
    "signal the trainer by its pid, every process it can (kill -1), and ptrace the namespace's init",
    "the trainer's pid does not exist in the sandbox (ESRCH), kill -1 reaches only the program's own processes, "
    "ptrace is refused",
)
def signals_outside(env: Env) -> None:
    source = f"""
    import ctypes, errno, os, signal
    try:
        os.kill({os.getpid()}, signal.SIGKILL)
        direct = "sent"
    except OSError as e:
        direct = errno.errorcode[e.errno]
    libc = ctypes.CDLL(None, use_errno=True)
    traced = libc.ptrace(16, 1, None, None)  # PTRACE_ATTACH to the reaper
    print(direct, traced, flush=True)
    os.kill(-1, signal.SIGKILL)
    """
    result = env.run(source)
    direct, traced = result.stdout.split()
    assert direct == "ESRCH" and traced == "-1", result
    assert os.getpgrp() > 0, "the trainer is still here"


@case(
    "inherited-fds-and-env",
    "look for file descriptors inherited from the trainer, and for the trainer's environment (secrets, paths)",
    "only standard input, output and error are open; the environment is the sandbox's own five variables",
)
def inherited(env: Env) -> None:
    os.environ["VERL_SANDBOX_TEST_SECRET"] = "hunter2"
    try:
        source = """
        import os
        open_fds = []
        for fd in range(3, 1024):
            try:
                os.fstat(fd)
                open_fds.append(fd)
            except OSError:
                pass
        print(open_fds, sorted(os.environ))
        """
        out = env.outcome(source)
    finally:
        del os.environ["VERL_SANDBOX_TEST_SECRET"]
    assert out == "[] ['HOME', 'LANG', 'LC_ALL', 'PATH', 'TMPDIR']", out


@case(
    "proc-mem-and-links",
    "read the namespace init's memory through /proc/1/mem, read a secret through a symlink it plants, and hard-link a "
    "file from outside into its folder",
    "each is refused",
)
def proc_mem_and_links(env: Env) -> None:
    secret = os.path.join(env.open_dir, "answers.txt")
    with open(secret, "w") as f:
        f.write("expected outputs")
    os.chmod(secret, 0o644)
    source = f"""
    import os
    outcomes = []
    for attempt in (
        lambda: open("/proc/1/mem", "rb").read(1),
        lambda: (os.symlink({secret!r}, "peek"), open("peek").read())[1],
        lambda: os.link({secret!r}, "linked"),
    ):
        try:
            attempt()
            outcomes.append("done")
        except OSError as e:
            outcomes.append(type(e).__name__)
    print(" ".join(outcomes))
    """
    assert "done" not in env.outcome(source).split()


@case(
    "huge-output-and-files",
    "flood standard output, and write one file past max_file_size_mb",
    "the output is cut and the run fails with output_limit; the big write fails inside the program",
)
def huge_output(env: Env) -> None:
    flood = env.run("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n")
    assert flood.status is RunStatus.OUTPUT_LIMIT and len(flood.stdout) == LIMITS.max_output_bytes
    big = """
    try:
        with open("big", "wb") as f:
            f.write(b"x" * (32 * 1024 * 1024))
        print("written")
    except OSError as e:
        print(type(e).__name__)
    """
    assert env.outcome(big) != "written"
