"""A seccomp filter, built by hand as classic BPF and installed through ``ctypes`` (Python has no
binding), that takes away the system calls a sandboxed program could use to reach outside:

- ``socket``: refused for every address family. The network namespace already cuts TCP, UDP,
  abstract UNIX sockets, netlink and packet sockets off from the host, but a UNIX socket bound to a
  *path* (``/run/docker.sock``, Ray's sockets in ``/tmp/ray``, an X server) is reached through the
  filesystem, which the program shares, and Landlock (up to ABI 7) does not govern ``connect``.
  Refusing ``socket`` closes every family at once. ``socketpair`` stays allowed: it makes two
  connected, unnamed ends inside the program, which reach nothing else (``asyncio`` and
  ``multiprocessing.Pipe`` need it).
- ``io_uring_setup``/``_enter``/``_register``: io_uring can open sockets and connect them without
  the ``socket`` system call ever being made.
- ``memfd_create`` and System V shared memory (``shmget``): memory that no process's resident set
  shows until it is mapped, so neither the address-space limit nor the sandbox's memory accounting
  would see it.
- Any system call of another ABI (i386 through ``int 0x80``, x32 on x86-64, arm32 on arm64): a
  filter on the native numbers would not see them, so they are all refused.

A refused call fails with an errno (EACCES for ``socket``, EPERM for the others); the program sees
an ordinary ``PermissionError``. The filter survives ``execve`` and cannot be removed; it needs
``no_new_privs``. Only the standard library is imported: the launcher loads this file by path.
"""

from __future__ import annotations

import ctypes
import errno
import os

_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_SECCOMP_RET_ALLOW = 0x7FFF0000
_SECCOMP_RET_ERRNO = 0x00050000

# Classic BPF opcodes.
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6].
_OFFSET_NR = 0
_OFFSET_ARCH = 4

_X32_SYSCALL_BIT = 0x40000000

#: Per machine: the audit architecture of the native ABI, and the native numbers of the calls refused.
_ARCHES = {
    "x86_64": {
        "audit_arch": 0xC000003E,  # AUDIT_ARCH_X86_64
        "socket": 41,
        "shmget": 29,
        "memfd_create": 319,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "x32": True,
    },
    "aarch64": {
        "audit_arch": 0xC00000B7,  # AUDIT_ARCH_AARCH64
        "socket": 198,
        "shmget": 194,
        "memfd_create": 279,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "x32": False,
    },
}
_ARCHES["amd64"] = _ARCHES["x86_64"]
_ARCHES["arm64"] = _ARCHES["aarch64"]

#: The refused calls and the errno each fails with.
REFUSED = {
    "socket": errno.EACCES,
    "io_uring_setup": errno.EPERM,
    "io_uring_enter": errno.EPERM,
    "io_uring_register": errno.EPERM,
    "memfd_create": errno.EPERM,
    "shmget": errno.EPERM,
}


class SeccompError(OSError):
    """The filter cannot be installed on this machine."""


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def supported_machine() -> str | None:
    """The machine name when the filter knows its system call numbers, else None."""
    machine = os.uname().machine.lower()
    return machine if machine in _ARCHES else None


def build_filter(machine: str) -> list[tuple[int, int, int, int]]:
    """The program, as (code, jt, jf, k) instructions: other ABIs refused, the REFUSED calls refused
    with their errno, everything else allowed."""
    arch = _ARCHES[machine]
    deny_all = (_RET_K, 0, 0, _SECCOMP_RET_ERRNO | errno.EPERM)
    refused = list(REFUSED.items())
    # Jump offsets are relative: 0 is the next instruction, 1 skips it.
    program: list[tuple[int, int, int, int]] = [(_LD_W_ABS, 0, 0, _OFFSET_ARCH)]
    program.append((_JEQ_K, 1, 0, arch["audit_arch"]))  # native: skip the next instruction
    program.append(deny_all)
    program.append((_LD_W_ABS, 0, 0, _OFFSET_NR))
    if arch["x32"]:
        program.append((_JGE_K, 0, 1, _X32_SYSCALL_BIT))  # x32 numbers: refuse; else skip the refusal
        program.append(deny_all)
    for name, code in refused:
        program.append((_JEQ_K, 0, 1, arch[name]))  # this call: fall into its refusal; else skip it
        program.append((_RET_K, 0, 0, _SECCOMP_RET_ERRNO | code))
    program.append((_RET_K, 0, 0, _SECCOMP_RET_ALLOW))
    return program


def install() -> None:
    """Install the filter on the calling thread (and, through fork and exec, on everything it starts).
    ``no_new_privs`` must already be set. Raises SeccompError where the machine is not supported."""
    machine = supported_machine()
    if machine is None:
        raise SeccompError(
            errno.ENOSYS, f"the seccomp socket filter knows no system call numbers for {os.uname().machine!r}"
        )
    program = build_filter(machine)
    filters = (_SockFilter * len(program))(*[_SockFilter(*instruction) for instruction in program])
    fprog = _SockFprog(len(program), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        code = ctypes.get_errno()
        raise SeccompError(code, f"prctl(PR_SET_SECCOMP) failed: {errno.errorcode.get(code, code)}")
