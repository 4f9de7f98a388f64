"""The resource limits of one sandboxed program."""

from __future__ import annotations

import math
from dataclasses import dataclass

_MIB = 1024 * 1024


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one program run. ``cpu_time_s`` (whole seconds, rounded up), ``memory_mb``, ``max_file_size_mb`` and
    ``max_open_files`` are kernel resource limits of each of its processes (``RLIMIT_CPU``,
    ``RLIMIT_AS``, ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``); ``max_processes`` (``RLIMIT_NPROC``) bounds how
    many processes and threads it may have at once, itself included; ``wall_time_s`` is enforced by
    the trainer, which kills every process of the run when it is over; ``max_output_mb`` is how much
    of its standard output is read back (the rest of a longer output is cut, and the run counts as
    a failure).

    Memory is held twice: ``memory_mb`` is the address-space limit of each process, and
    ``total_memory_mb`` (default: ``memory_mb``) bounds the resident memory of all the program's
    processes together, by accounting (see :mod:`.memory`): a program whose children add up to more
    is ended and its run fails with ``memory``."""

    cpu_time_s: float = 5.0
    wall_time_s: float = 10.0
    memory_mb: int = 1024
    max_processes: int = 8
    max_file_size_mb: int = 16
    max_open_files: int = 64
    max_output_mb: float = 8.0
    total_memory_mb: int | None = None

    def __post_init__(self) -> None:
        if self.total_memory_mb is not None and not self.total_memory_mb > 0:
            raise ValueError(f"SandboxLimits.total_memory_mb={self.total_memory_mb!r} must be positive (or None)")
        for name in ("cpu_time_s", "wall_time_s", "memory_mb", "max_processes", "max_file_size_mb", "max_open_files"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"SandboxLimits.{name}={value!r} must be positive")
        if self.memory_mb < 64:
            raise ValueError(f"SandboxLimits.memory_mb={self.memory_mb} is too small for a Python interpreter (>= 64)")
        if self.max_open_files < 16:
            raise ValueError(f"SandboxLimits.max_open_files={self.max_open_files} is too small to start Python (>= 16)")
        if self.max_output_mb > self.max_file_size_mb:
            raise ValueError(
                f"SandboxLimits.max_output_mb={self.max_output_mb} exceeds max_file_size_mb={self.max_file_size_mb}: "
                "the program's output is a file, so it can never be longer than max_file_size_mb"
            )

    @property
    def total_memory_bytes(self) -> int:
        return (self.total_memory_mb or self.memory_mb) * _MIB

    @property
    def max_output_bytes(self) -> int:
        return int(self.max_output_mb * _MIB)

    def rlimits(self, extra_processes: int) -> list[tuple[str, int, int]]:
        """``(RLIMIT name, soft, hard)`` for the program's process. ``extra_processes``: processes of the
        sandbox counted against the same limit that are not the program's (the launcher and reaper).

        The CPU limit's soft value sends SIGXCPU (which ends the program); the hard value, a second
        later, SIGKILL, for a program that catches SIGXCPU."""
        cpu = max(1, math.ceil(self.cpu_time_s))
        return [
            ("RLIMIT_CPU", cpu, cpu + 1),
            ("RLIMIT_AS", self.memory_mb * _MIB, self.memory_mb * _MIB),
            ("RLIMIT_NPROC", self.max_processes + extra_processes, self.max_processes + extra_processes),
            ("RLIMIT_FSIZE", self.max_file_size_mb * _MIB, self.max_file_size_mb * _MIB),
            ("RLIMIT_NOFILE", self.max_open_files, self.max_open_files),
            ("RLIMIT_CORE", 0, 0),
        ]
