"""verl's run layout on disk, and the rules that make it crash-safe.

```
<trainer.default_local_dir>/
  latest_checkpointed_iteration.txt     the step of the newest COMPLETE checkpoint, written last
  global_step_<N>/
    actor/ critic/                      each engine's sharded checkpoint (written atomically by the engine)
    trainer_state.json                  step, dataloader position, KL controller, RNG seeds
    COMPLETE                            written after everything else in the folder
  metrics.jsonl
```

A checkpoint counts only when its folder has ``COMPLETE`` and the latest file names it; a run killed while
writing leaves a folder without ``COMPLETE``, which resume ignores (and the next save of that step
replaces).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

LATEST_FILE = "latest_checkpointed_iteration.txt"
COMPLETE_MARKER = "COMPLETE"
TRAINER_STATE = "trainer_state.json"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"global_step_{step}"


def write_text_atomic(path: Path, text: str) -> None:
    """Write via a temporary file in the same folder, fsync, rename: readers see old or new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_complete(folder: Path) -> bool:
    return (folder / COMPLETE_MARKER).is_file() and (folder / TRAINER_STATE).is_file()


def mark_complete(root: str | Path, step: int, trainer_state: dict[str, Any]) -> Path:
    """Finish a checkpoint whose engine parts are written: trainer state, marker, then the latest file."""
    folder = step_dir(root, step)
    write_text_atomic(folder / TRAINER_STATE, json.dumps(trainer_state, indent=1))
    write_text_atomic(folder / COMPLETE_MARKER, f"{step}\n")
    write_text_atomic(Path(root) / LATEST_FILE, f"{step}\n")
    return folder


def prepare_step_dir(root: str | Path, step: int) -> Path:
    """An empty folder for a new checkpoint of ``step`` (a leftover incomplete one is removed)."""
    folder = step_dir(root, step)
    if folder.exists():
        if is_complete(folder):
            (folder / COMPLETE_MARKER).unlink()  # being rewritten: not complete until marked again
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def latest_complete(root: str | Path) -> Path | None:
    """The newest complete checkpoint: the one the latest file names if complete, else the highest
    complete global_step folder (the latest file may predate a crash mid-rename)."""
    root = Path(root)
    if not root.is_dir():
        return None
    latest = root / LATEST_FILE
    if latest.is_file():
        try:
            folder = step_dir(root, int(latest.read_text().strip()))
            if is_complete(folder):
                return folder
        except ValueError:
            pass
    steps = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir())
    for _, folder in reversed(steps):
        if is_complete(folder):
            return folder
    return None


def resolve_resume(root: str | Path, resume_mode: str, resume_from_path: str | None) -> Path | None:
    """Where to resume from: None for a fresh start."""
    if resume_mode == "disable":
        return None
    explicit = resume_from_path if resume_mode == "auto" else resume_mode
    if resume_mode != "auto" or resume_from_path:
        folder = Path(str(explicit)).expanduser()
        if not _STEP_DIR.match(folder.name):
            raise ValueError(f"resume path {str(folder)!r} must be a global_step_<N> folder of a run")
        if not is_complete(folder):
            raise ValueError(
                f"resume path {str(folder)!r} is not a complete checkpoint (no {COMPLETE_MARKER} marker or trainer "
                "state): it was interrupted while being written; pick an earlier global_step folder"
            )
        return folder
    return latest_complete(root)


def read_trainer_state(folder: Path) -> dict[str, Any]:
    return json.loads((folder / TRAINER_STATE).read_text())


def step_of(folder: Path) -> int:
    match = _STEP_DIR.match(folder.name)
    if not match:
        raise ValueError(f"{folder} is not a global_step_<N> folder")
    return int(match.group(1))


def prune_old(root: str | Path, keep: int | None) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints (None or <= 0 keeps everything)."""
    if not keep or keep <= 0:
        return []
    root = Path(root)
    complete = sorted(
        (int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir() and is_complete(p)
    )
    removed = []
    for _, folder in complete[:-keep]:
        (folder / COMPLETE_MARKER).unlink()  # first, so a crash mid-delete never leaves a "complete" husk
        shutil.rmtree(folder)
        removed.append(folder)
    return removed
