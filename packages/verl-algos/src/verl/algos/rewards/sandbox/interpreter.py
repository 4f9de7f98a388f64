"""Which Python interpreter runs the sandboxed programs.

A root trainer runs programs as an unprivileged uid, which may not reach the trainer's own
interpreter: pyenv and conda often live under /root (mode 0700). The interpreter is then the first
of a few system ones that the uid can execute, and the choice is logged once.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import stat
import sys

from verl.algos.rewards.sandbox.result import SandboxUnavailableError

logger = logging.getLogger(__name__)

_SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")


def reachable_by(path: str, uid: int, gid: int) -> str | None:
    """None when ``uid``/``gid`` (no supplementary groups) may execute ``path`` and search the
    ``lib`` directory of its installation; otherwise the first path in the way."""
    real = os.path.realpath(path)
    library = os.path.join(os.path.dirname(os.path.dirname(real)), "lib")
    for target in (real, library):
        parts = target.split(os.sep)
        for i in range(2, len(parts) + 1):  # every ancestor, then the target itself: each needs "x"
            current = os.sep.join(parts[:i])
            try:
                st = os.stat(current)
            except OSError:
                return current
            if st.st_uid == uid:
                allowed = st.st_mode & stat.S_IXUSR
            elif st.st_gid == gid:
                allowed = st.st_mode & stat.S_IXGRP
            else:
                allowed = st.st_mode & stat.S_IXOTH
            if not allowed:
                return current
    return None


@functools.cache
def choose_python(configured: str | None, uid: int, gid: int) -> str:
    """``configured`` (SandboxUnavailableError when ``uid`` cannot run it) or, when None, the trainer's interpreter
    or else a system python3 that ``uid`` can run."""
    if configured:
        path = shutil.which(configured) or configured
        blocked = reachable_by(path, uid, gid)
        if blocked is not None:
            raise SandboxUnavailableError(
                "an interpreter",
                f"the sandbox python {configured!r} cannot be run by uid {uid}: {blocked} is not accessible to it",
                "choose an interpreter that this uid can execute (e.g. /usr/bin/python3)",
            )
        return path
    candidates = [sys.executable, *_SYSTEM_PYTHONS]
    for candidate in candidates:
        if os.path.exists(candidate) and reachable_by(candidate, uid, gid) is None:
            if candidate != sys.executable:
                logger.warning(
                    "code sandbox: programs run as uid %d, which cannot reach this interpreter (%s: %s is not "
                    "accessible); they run with %s instead (set the sandbox's python to choose another)",
                    uid,
                    sys.executable,
                    reachable_by(sys.executable, uid, gid),
                    candidate,
                )
            return candidate
    raise SandboxUnavailableError(
        "an interpreter",
        f"no Python interpreter that uid {uid} can execute (tried {candidates})",
        "install python3 in /usr/bin, or give the sandbox a python that this uid can reach",
    )
