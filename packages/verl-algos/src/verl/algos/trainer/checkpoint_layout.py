"""verl's run layout on disk, and the rules that make it crash-safe.

```
<trainer.default_local_dir>/
  latest_checkpointed_iteration.txt     the step of the newest COMPLETE checkpoint, written last
  global_step_<N>/
    actor/ critic/                      each engine's sharded checkpoint (written atomically by the engine)
    trainer_state.json                  step, dataloader position, KL controller, RNG seeds
    COMPLETE                            the manifest (size and SHA-256 of every other file), written last
  metrics.jsonl
```

A checkpoint counts only when its folder has ``COMPLETE``; a run killed while writing leaves a folder
without it, which resume ignores (the next save of that step replaces it, and a later save removes such
leftovers). ``COMPLETE`` is the folder's manifest (``checkpoint_manifest``), so completing a checkpoint and
recording what it holds is one atomic rename, and every load checks the files against it first.

Each manifest also carries a sequence number, one more than any other checkpoint's of the run: resume picks
the most recently completed checkpoint, also when a run stopped between ``COMPLETE`` and the latest file,
or when a run resumed from an earlier step left checkpoints of an abandoned continuation behind.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from verl.algos.trainer import checkpoint_manifest as manifests
from verl.algos.trainer.checkpoint_manifest import CheckpointIntegrityError

logger = logging.getLogger(__name__)

LATEST_FILE = "latest_checkpointed_iteration.txt"
COMPLETE_MARKER = "COMPLETE"
TRAINER_STATE = "trainer_state.json"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")
_NOT_IN_MANIFEST = frozenset({COMPLETE_MARKER})

__all__ = ["CheckpointDiskFullError", "CheckpointIntegrityError"]


class CheckpointDiskFullError(OSError):
    """The filesystem of the run folder filled up while a checkpoint was written."""


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


def _read_marker(folder: Path) -> dict[str, Any] | None:
    """The manifest in ``COMPLETE``; None for a marker of an older verl (plain text, the step number)."""
    text = (folder / COMPLETE_MARKER).read_text()
    if not text.lstrip().startswith("{"):
        return None
    try:
        marker = json.loads(text)
    except json.JSONDecodeError as exc:
        what = f"its {COMPLETE_MARKER} manifest is not valid JSON ({exc})"
        raise CheckpointIntegrityError(_refusal(folder, what)) from None
    if not isinstance(marker, dict):
        raise CheckpointIntegrityError(_refusal(folder, f"its {COMPLETE_MARKER} manifest is not a JSON object"))
    return marker


#: ``_sequence`` of a checkpoint written by an older verl (a plain-text marker), and of a damaged marker.
_LEGACY, _DAMAGED = -1, -2


def _sequence(folder: Path) -> int:
    """The completion order of a complete checkpoint, or ``_LEGACY`` / ``_DAMAGED``."""
    try:
        marker = _read_marker(folder)
    except (OSError, CheckpointIntegrityError):
        return _DAMAGED
    if marker is None:
        return _LEGACY
    sequence = marker.get("sequence")
    return sequence if isinstance(sequence, int) and sequence >= 0 else _DAMAGED


def _named_by_latest_file(root: Path) -> Path | None:
    try:
        return step_dir(root, int((root / LATEST_FILE).read_text().strip()))
    except (OSError, ValueError):
        return None


def _step_folders(root: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every global_step_<N> folder, complete or not, by step."""
    if not root.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir())


def mark_complete(root: str | Path, step: int, trainer_state: dict[str, Any]) -> Path:
    """Finish a checkpoint whose engine parts are written: trainer state, the manifest as the ``COMPLETE``
    marker (after every file it lists is flushed to disk), then the latest file."""
    folder = step_dir(root, step)
    write_text_atomic(folder / TRAINER_STATE, json.dumps(trainer_state, indent=1))
    manifest = manifests.build_manifest(folder, step, skip=_NOT_IN_MANIFEST)
    others = [_sequence(f) for s, f in _step_folders(Path(root)) if s != step and is_complete(f)]
    manifest["sequence"] = max([0, *others]) + 1
    write_text_atomic(folder / COMPLETE_MARKER, json.dumps(manifest, indent=1) + "\n")
    write_text_atomic(Path(root) / LATEST_FILE, f"{step}\n")
    return folder


def remove_checkpoint(folder: Path) -> None:
    """Delete a checkpoint folder, its marker first: a stop halfway never leaves a "complete" husk."""
    marker = folder / COMPLETE_MARKER
    if marker.is_file():
        marker.unlink()
    shutil.rmtree(folder, ignore_errors=True)


def prepare_step_dir(root: str | Path, step: int) -> Path:
    """An empty folder for a new checkpoint of ``step`` (a leftover one is removed)."""
    folder = step_dir(root, step)
    if folder.exists():
        remove_checkpoint(folder)  # being rewritten: not complete until marked again
    folder.mkdir(parents=True)
    return folder


def _disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` or what caused it is "no space left" (also inside a worker's remote traceback)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(exc)
        if os.strerror(errno.ENOSPC) in text or os.strerror(errno.EDQUOT) in text:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


@contextmanager
def checkpoint_write(root: str | Path, step: int) -> Iterator[Path]:
    """``with checkpoint_write(root, step) as folder:`` write the engines' parts into ``folder``, then
    :func:`mark_complete`. If the filesystem fills up meanwhile, the partial folder is removed (it can never
    be loaded, and the logs need the space it took) and :class:`CheckpointDiskFullError` says what to do;
    the last complete checkpoint is untouched."""
    root = Path(root)
    folder = step_dir(root, step)
    try:
        yield prepare_step_dir(root, step)
    except Exception as exc:
        if not _disk_full(exc):
            raise
        remove_checkpoint(folder)
        kept = latest_complete(root)
        free = shutil.disk_usage(root).free
        resume = f" (trainer.resume_mode={kept})" if kept else ""
        raise CheckpointDiskFullError(
            errno.ENOSPC,
            f"no space left on device while writing checkpoint {folder}: the partial checkpoint was removed; "
            f"the last complete checkpoint is {kept or 'none (this was the first)'}. Free space on the filesystem "
            f"of {root} ({free / 2**20:.1f} MiB free now) or point trainer.default_local_dir elsewhere, and run "
            f"again to continue from it{resume}",
        ) from exc


def latest_complete(root: str | Path) -> Path | None:
    """The most recently completed checkpoint: the highest manifest sequence. If the latest file names a
    checkpoint whose marker is damaged, that one (resume then refuses it, saying so, rather than quietly
    going back further). For checkpoints of an older verl (no sequence): the one the latest file names if
    complete, else the highest complete step."""
    root = Path(root)
    complete = [(step, folder) for step, folder in _step_folders(root) if is_complete(folder)]
    if not complete:
        return None
    named = _named_by_latest_file(root)
    if named is not None and is_complete(named) and _sequence(named) == _DAMAGED:
        return named
    sequence, newest = max((_sequence(folder), folder) for _, folder in complete)
    if sequence >= 0:
        return newest
    if named is not None and is_complete(named):
        return named
    return complete[-1][1]


def verify_checkpoint(folder: str | Path) -> None:
    """Check every file of a complete checkpoint against its manifest; :class:`CheckpointIntegrityError`
    names what differs and how to go on without it."""
    folder = Path(folder)
    marker = _read_marker(folder)
    if marker is None:
        logger.warning("checkpoint %s has no manifest (written by an older verl): its files cannot be checked", folder)
        return
    found = manifests.problems(folder, marker, skip=_NOT_IN_MANIFEST)
    if found:
        raise CheckpointIntegrityError(_refusal(folder, manifests.describe(found)))


def _refusal(folder: Path, what: str) -> str:
    earlier = [f for s, f in _step_folders(folder.parent) if f != folder and is_complete(f) and s < _step(folder)]
    suggestion = f"trainer.resume_mode={earlier[-1]}" if earlier else "trainer.resume_mode=<a global_step_<N> folder>"
    return (
        f"checkpoint {folder} is damaged or was modified after it was written: {what}. verl does not load it. "
        f"Resume from an earlier complete checkpoint with {suggestion}, or delete {folder} (a run resuming "
        "automatically then takes the previous one)"
    )


def _step(folder: Path) -> int:
    match = _STEP_DIR.match(folder.name)
    return int(match.group(1)) if match else -1


def resolve_resume(root: str | Path, resume_mode: str, resume_from_path: str | None) -> Path | None:
    """Where to resume from, checked against its manifest: None for a fresh start."""
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
    else:
        folder = latest_complete(root)
        if folder is None:
            return None
    verify_checkpoint(folder)
    return folder


def read_trainer_state(folder: Path) -> dict[str, Any]:
    return json.loads((folder / TRAINER_STATE).read_text())


def step_of(folder: Path) -> int:
    match = _STEP_DIR.match(folder.name)
    if not match:
        raise ValueError(f"{folder} is not a global_step_<N> folder")
    return int(match.group(1))


def prune_old(root: str | Path, keep: int | None) -> list[Path]:
    """After a save: delete all but the ``keep`` most recently completed checkpoints (None or <= 0 keeps them
    all), and the incomplete folders below the newest one's step (left by a stop mid-write or mid-prune;
    they can never be loaded)."""
    root = Path(root)
    folders = _step_folders(root)
    complete = sorted((_sequence(folder), step, folder) for step, folder in folders if is_complete(folder))
    if not complete:
        return []
    newest = complete[-1][1]
    removed = [folder for step, folder in folders if step < newest and not is_complete(folder)]
    if keep and keep > 0:
        removed += [folder for _, _, folder in complete[:-keep]]
    removed.sort(key=_step)
    for folder in removed:
        remove_checkpoint(folder)
    return removed
