"""What one sandboxed run returns, and the error raised when the sandbox cannot be set up."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from verl.algos.rewards.scoring import RewardSetupError


class RunStatus(str, enum.Enum):
    """How a program ended. Only COMPLETED means it exited with status 0 within every limit."""

    COMPLETED = "completed"
    RUNTIME_ERROR = "runtime_error"  # a non-zero exit status (an exception, sys.exit(1), ...)
    TIMEOUT = "timeout"  # the CPU-time or the wall-clock limit
    MEMORY = "memory"  # a MemoryError: the address-space limit
    KILLED = "killed"  # ended by a signal other than the CPU limit's
    OUTPUT_LIMIT = "output_limit"  # more output than max_output_mb
    SANDBOX_ERROR = "sandbox_error"  # the trainer's side of the run failed (logged); never a pass


@dataclass
class RunResult:
    status: RunStatus
    #: A short human-readable account of a status other than COMPLETED ("" when completed).
    reason: str
    stdout: str
    #: The last part of the standard error (at most a few thousand characters).
    stderr: str
    exit_code: int | None = None
    signal: int | None = None
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status is RunStatus.COMPLETED


class SandboxUnavailableError(RewardSetupError):
    """The machine cannot provide the isolation the configuration asks for. A configuration problem:
    it stops the run, because running untrusted code less isolated than asked is never an option."""

    def __init__(self, missing: str, detail: str, hint: str):
        super().__init__(f"the code sandbox cannot run programs here: {missing} ({detail}). To fix: {hint}.")
        self.missing = missing
        self.detail = detail
        self.hint = hint
