"""Landlock (Linux >= 5.13): an unprivileged process restricts what it and its descendants may do
to the filesystem (and, from ABI 4, to TCP ports; from ABI 6, to signals and abstract UNIX sockets
outside its domain). Called through ``ctypes`` because Python has no binding.

Only the standard library is imported: the sandbox launcher loads this file before anything else.
A domain, once entered, cannot be left or widened, and it survives ``execve``.
"""

from __future__ import annotations

import ctypes
import enum
import os

# The three system calls have the same numbers on every architecture that has them (asm-generic).
_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1

#: Filesystem access rights: bit i for the i-th name, in the kernel header's order
#: (include/uapi/linux/landlock.h). REFER came with ABI 2, TRUNCATE with ABI 3, IOCTL_DEV with ABI 5.
Fs = enum.IntFlag(
    "Fs",
    "EXECUTE WRITE_FILE READ_FILE READ_DIR REMOVE_DIR REMOVE_FILE MAKE_CHAR MAKE_DIR MAKE_REG MAKE_SOCK "
    "MAKE_FIFO MAKE_BLOCK MAKE_SYM REFER TRUNCATE IOCTL_DEV",
)
Net = enum.IntFlag("Net", "BIND_TCP CONNECT_TCP")  # ABI 4
Scope = enum.IntFlag("Scope", "ABSTRACT_UNIX_SOCKET SIGNAL")  # ABI 6

READ_ACCESS = Fs.EXECUTE | Fs.READ_FILE | Fs.READ_DIR
#: Every right that changes the filesystem, per ABI version (IOCTL_DEV is not a write, but an ioctl
#: on a device can change things, so it is kept with the writes).
_WRITE_ACCESS_ABI1 = (
    Fs.WRITE_FILE
    | Fs.REMOVE_DIR
    | Fs.REMOVE_FILE
    | Fs.MAKE_CHAR
    | Fs.MAKE_DIR
    | Fs.MAKE_REG
    | Fs.MAKE_SOCK
    | Fs.MAKE_FIFO
    | Fs.MAKE_BLOCK
    | Fs.MAKE_SYM
)
#: Rights that may be granted on a file (not a directory).
_FILE_ACCESS = Fs.EXECUTE | Fs.WRITE_FILE | Fs.READ_FILE | Fs.TRUNCATE | Fs.IOCTL_DEV

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class LandlockError(OSError):
    """Landlock is missing or refused the ruleset."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def abi_version() -> int:
    """The Landlock ABI version of the running kernel; raises LandlockError when there is none."""
    version = _libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    if version < 0:
        errno = ctypes.get_errno()
        reason = {
            38: "the kernel has no Landlock system calls (Linux >= 5.13 is needed)",  # ENOSYS
            95: "Landlock is built in but not enabled (add 'landlock' to the lsm= kernel boot parameter)",  # EOPNOTSUPP
        }.get(errno, os.strerror(errno))
        raise LandlockError(errno, f"Landlock is unavailable: {reason}")
    return int(version)


def write_access(abi: int) -> int:
    access = _WRITE_ACCESS_ABI1
    if abi >= 2:
        access |= Fs.REFER
    if abi >= 3:
        access |= Fs.TRUNCATE
    if abi >= 5:
        access |= Fs.IOCTL_DEV
    return access


def restrict_self(
    writable: list[str], readable: list[str] | None, deny_tcp: bool = True, scope_ipc: bool = True
) -> int:
    """Enter a Landlock domain where the filesystem may be changed only beneath ``writable`` and, when
    ``readable`` is not None, read or executed only beneath ``readable`` + ``writable``. With
    ``deny_tcp`` (ABI >= 4) no TCP connect or bind is allowed; with ``scope_ipc`` (ABI >= 6) no signal
    to, nor abstract UNIX socket of, a process outside the domain. ``no_new_privs`` must already be
    set. Paths that do not exist are skipped. Returns the ABI version used."""
    abi = abi_version()
    handled_fs = write_access(abi) | (READ_ACCESS if readable is not None else 0)
    attr = _RulesetAttr(handled_access_fs=handled_fs)
    size = 8  # ABI 1-3: only handled_access_fs
    if abi >= 4 and deny_tcp:
        attr.handled_access_net = Net.BIND_TCP | Net.CONNECT_TCP
        size = 16
    if abi >= 6 and scope_ipc:
        attr.scoped = Scope.ABSTRACT_UNIX_SOCKET | Scope.SIGNAL
        size = 24
    ruleset = _libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        errno = ctypes.get_errno()
        raise LandlockError(errno, f"landlock_create_ruleset failed: {os.strerror(errno)}")
    try:
        for path in writable:
            _allow(ruleset, path, handled_fs)
        for path in readable or ():
            _allow(ruleset, path, READ_ACCESS)
        if _libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            errno = ctypes.get_errno()
            raise LandlockError(errno, f"landlock_restrict_self failed: {os.strerror(errno)}")
    finally:
        os.close(ruleset)
    return abi


def _allow(ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        if not os.path.isdir(path):
            access &= _FILE_ACCESS
        rule = _PathBeneathAttr(allowed_access=access, parent_fd=fd)
        if (
            _libc.syscall(
                _SYS_ADD_RULE,
                ctypes.c_int(ruleset),
                ctypes.c_int(_RULE_PATH_BENEATH),
                ctypes.byref(rule),
                ctypes.c_uint32(0),
            )
            < 0
        ):
            errno = ctypes.get_errno()
            raise LandlockError(errno, f"landlock_add_rule for {path} failed: {os.strerror(errno)}")
    finally:
        os.close(fd)
