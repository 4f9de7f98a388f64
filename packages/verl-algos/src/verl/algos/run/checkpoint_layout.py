"""verl's run layout on disk, and the rules that make it crash-safe.

```
<trainer.default_local_dir>/
  latest_checkpointed_iteration.txt     the step of the newest COMPLETE checkpoint, written last
  global_step_<N>/
    actor/ critic/                      each engine's sharded checkpoint (written atomically by the engine)
    trainer_state.json                  step, dataloader position, KL controller, RNG seeds
    writer.json                         the lineage of the run writing it, written first
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

Each checkpoint also carries its run's *lineage* (``writer.json`` from the moment the folder exists, and the
manifest once complete): a run started from scratch gets a new one, a resumed run continues the lineage of
the checkpoint it resumed from. Nothing here removes or replaces a folder of another lineage: rotation
(``prune_old``) and rewriting a step (``prepare_step_dir``) touch only the writing run's own folders (and
empty ones), so checkpoints of another run, or files a user put there, survive. The lineage defaults to that
of the run that holds the folder's lock in this process (``run_folder_lock``); None is the lineage of
checkpoints written without one (older verl, tools and tests).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from verl.algos.run import checkpoint_manifest as manifests
from verl.algos.run.checkpoint_manifest import CheckpointIntegrityError

logger = logging.getLogger(__name__)

LATEST_FILE = "latest_checkpointed_iteration.txt"
COMPLETE_MARKER = "COMPLETE"
TRAINER_STATE = "trainer_state.json"
WRITER_FILE = "writer.json"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")
_NOT_IN_MANIFEST = frozenset({COMPLETE_MARKER, WRITER_FILE})

__all__ = [
    "CheckpointDiskFullError",
    "CheckpointIntegrityError",
    "CheckpointNonFiniteError",
    "CheckpointOwnershipError",
    "RunFolderDiskFullError",
]


class RunFolderDiskFullError(OSError):
    """The filesystem of the run folder filled up (a checkpoint, the metrics or the log was being written)."""


class CheckpointDiskFullError(RunFolderDiskFullError):
    """The filesystem of the run folder filled up while a checkpoint was written."""


class CheckpointOwnershipError(RuntimeError):
    """A step folder this run would replace belongs to another run (another lineage) or is not verl's."""


class CheckpointNonFiniteError(ValueError):
    """A checkpoint about to be marked complete holds NaN or inf values."""


class _Unset:
    def __repr__(self) -> str:
        return "<the lineage of the run holding the folder>"


#: Default of ``lineage`` arguments: the lineage of the run that holds the folder's lock in this process.
OWNER = _Unset()


def _lineage(root: str | Path, lineage: str | None | _Unset) -> str | None:
    if isinstance(lineage, _Unset):
        from verl.algos.run.folder_lock import lineage_of

        return lineage_of(root)
    return lineage


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


def step_folders(root: str | Path) -> list[tuple[int, Path]]:
    """(step, folder) of every global_step_<N> folder under ``root``, complete or not, by step."""
    return _step_folders(Path(root))


def mark_complete(
    root: str | Path, step: int, trainer_state: dict[str, Any], lineage: str | None | _Unset = OWNER
) -> Path:
    """Finish a checkpoint whose engine parts are written: trainer state, the manifest as the ``COMPLETE``
    marker (after every file it lists is flushed to disk), then the latest file. A checkpoint holding NaN or
    inf values is never marked complete (:class:`CheckpointNonFiniteError`)."""
    from verl.algos.run.checkpoint_values import nonfinite_tensors

    folder = step_dir(root, step)
    write_text_atomic(folder / TRAINER_STATE, json.dumps(trainer_state, indent=1))
    bad = nonfinite_tensors(folder)
    if bad:
        kept = latest_complete(root)
        raise CheckpointNonFiniteError(
            f"checkpoint {folder} holds non-finite (NaN/inf) or unreadable values ({'; '.join(bad[:3])}"
            f"{'; ...' if len(bad) > 3 else ''}), so it is not marked complete and will never be resumed from or "
            f"exported. The last complete checkpoint is {kept or 'none'}. Weights or optimizer state that diverged "
            "come from a learning rate too high for the model (see also optim.clip_grad and trainer.nonfinite): lower it "
            "and run again"
        )
    manifest = manifests.build_manifest(folder, step, skip=_NOT_IN_MANIFEST)
    manifest["lineage"] = _lineage(root, lineage)
    others = [_sequence(f) for s, f in _step_folders(Path(root)) if s != step and is_complete(f)]
    manifest["sequence"] = max([0, *others]) + 1
    write_text_atomic(folder / COMPLETE_MARKER, json.dumps(manifest, indent=1) + "\n")
    write_text_atomic(Path(root) / LATEST_FILE, f"{step}\n")
    return folder


def folder_lineage(folder: Path) -> tuple[bool, str | None]:
    """(known, lineage) of a step folder: from its ``writer.json``, else from a readable manifest (an older
    verl's checkpoint: lineage None). Not known: a folder verl did not write, or an unreadable one."""
    try:
        writer = json.loads((folder / WRITER_FILE).read_text())
        if isinstance(writer, dict) and "lineage" in writer:
            return True, writer["lineage"]
    except (OSError, ValueError):
        pass
    if is_complete(folder):
        try:
            marker = _read_marker(folder)
        except (OSError, CheckpointIntegrityError):
            return False, None
        return True, marker.get("lineage") if marker is not None else None
    return False, None


def _is_empty(folder: Path) -> bool:
    """Nothing in it, or only the temporary file of a ``writer.json`` whose write was cut short."""
    try:
        return all(p.name.startswith(f".{WRITER_FILE}.") and p.is_file() for p in folder.iterdir())
    except OSError:
        return False


def owned_by(folder: Path, lineage: str | None) -> bool:
    """Whether a run of ``lineage`` may remove or replace ``folder``: one of its own, or an empty folder."""
    if _is_empty(folder):
        return True
    known, found = folder_lineage(folder)
    return known and found == lineage


def remove_checkpoint(folder: Path) -> None:
    """Delete a checkpoint folder of this run, its marker first (a stop halfway never leaves a "complete"
    husk) and its ``writer.json`` last (a husk still says whose it is, so a later prune of that run removes
    it). Of a complete checkpoint only the files its manifest lists go: a file someone added survives, with
    the folder that holds it."""
    listed = None
    if is_complete(folder):
        try:
            marker = _read_marker(folder)
            listed = set(marker["files"]) | {TRAINER_STATE} if marker is not None else None
        except (OSError, CheckpointIntegrityError, KeyError, TypeError):
            listed = None
        (folder / COMPLETE_MARKER).unlink()
    if listed is None:
        for child in list(folder.iterdir()) if folder.is_dir() else []:
            if child.name == WRITER_FILE:
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
    else:
        for name in listed:
            (folder / name).unlink(missing_ok=True)
        for dirpath, _, _ in sorted(os.walk(folder), key=lambda entry: -len(entry[0])):  # deepest first
            if Path(dirpath) != folder and not any(Path(dirpath).iterdir()):
                os.rmdir(dirpath)
    (folder / WRITER_FILE).unlink(missing_ok=True)
    if not any(folder.iterdir()):
        folder.rmdir()
    else:
        logger.warning("kept %s: it holds files that are not part of the checkpoint", folder)


def prepare_step_dir(root: str | Path, step: int, lineage: str | None | _Unset = OWNER) -> Path:
    """An empty folder for a new checkpoint of ``step``, its ``writer.json`` naming the lineage. A folder of
    that step written by this lineage before (a leftover, or a checkpoint of an abandoned continuation) is
    removed; one of another lineage, or one verl did not write, is refused (:class:`CheckpointOwnershipError`)."""
    lineage = _lineage(root, lineage)
    folder = step_dir(root, step)
    if folder.exists() or folder.is_symlink():
        if folder.is_symlink() or not folder.is_dir() or not owned_by(folder, lineage):
            raise CheckpointOwnershipError(
                f"{folder} exists and was not written by this run (lineage {lineage}): verl does not replace it. "
                "Move it out of the run folder, or give the run another trainer.default_local_dir"
            )
        remove_checkpoint(folder)  # being rewritten: not complete until marked again
        if folder.exists():
            raise CheckpointOwnershipError(
                f"{folder} holds files that are not part of the checkpoint verl wrote there, so it was not "
                "replaced; move them out of the folder and run again"
            )
    folder.mkdir(parents=True)
    writer = {"lineage": lineage, "step": step, "host": socket.gethostname(), "pid": os.getpid()}
    write_text_atomic(folder / WRITER_FILE, json.dumps(writer) + "\n")
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
def checkpoint_write(root: str | Path, step: int, lineage: str | None | _Unset = OWNER) -> Iterator[Path]:
    """``with checkpoint_write(root, step) as folder:`` write the engines' parts into ``folder``, then
    :func:`mark_complete`. If the filesystem fills up meanwhile, the partial folder is removed (it can never
    be loaded, and the logs need the space it took) and :class:`CheckpointDiskFullError` says what to do;
    the last complete checkpoint is untouched."""
    root = Path(root)
    folder = step_dir(root, step)
    try:
        yield prepare_step_dir(root, step, lineage)
    except Exception as exc:
        if not _disk_full(exc):
            raise
        remove_checkpoint(folder)
        raise disk_full_error(root, f"checkpoint {folder}", "the partial checkpoint was removed; ") from exc


def is_disk_full(exc: BaseException | None) -> bool:
    return _disk_full(exc)


def close_unflushable(stream: Any) -> None:
    """Close a file whose buffered writes the full disk refused: closing flushes, which fails again, and the
    file is closed all the same; what was buffered is dropped."""
    try:
        stream.close()
    except OSError:
        pass


def disk_full_error(root: str | Path, what: str, done: str = "") -> RunFolderDiskFullError:
    """The error of a full disk while writing ``what`` into run folder ``root``: what is kept and what to do
    (:class:`CheckpointDiskFullError` for a checkpoint)."""
    kept = latest_complete(root)
    try:
        free = f"{shutil.disk_usage(root).free / 2**20:.1f} MiB free now"
    except OSError:
        free = "free space unknown"
    resume = f" (trainer.resume_mode={kept})" if kept else ""
    cls = CheckpointDiskFullError if what.startswith("checkpoint ") else RunFolderDiskFullError
    return cls(
        errno.ENOSPC,
        f"no space left on device while writing {what}: {done}the last complete checkpoint is "
        f"{kept or 'none (none was written yet)'}. Free space on the filesystem of {root} ({free}) or point "
        f"trainer.default_local_dir elsewhere, and run again to continue from it{resume}",
    )


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


#: Checkpoints verified in this process: folder -> (name, size, mtime) of each file at the time. A run checks
#: its resume checkpoint before Ray starts and again when it loads it; the second check is free when no file
#: changed in between.
_VERIFIED: dict[Path, tuple] = {}


def _file_stats(folder: Path) -> tuple:
    stats = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for name in sorted(filenames):
            st = os.stat(os.path.join(dirpath, name))
            stats.append((os.path.join(dirpath, name), st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(stats)


def verify_checkpoint(folder: str | Path) -> None:
    """Check every file of a complete checkpoint against its manifest; :class:`CheckpointIntegrityError`
    names what differs and how to go on without it."""
    folder = Path(folder)
    marker = _read_marker(folder)
    if marker is None:
        logger.warning("checkpoint %s has no manifest (written by an older verl): its files cannot be checked", folder)
        return
    key = folder.resolve()
    stats = _file_stats(folder)
    if _VERIFIED.get(key) == stats:
        return
    found = manifests.problems(folder, marker, skip=_NOT_IN_MANIFEST)
    if found:
        raise CheckpointIntegrityError(_refusal(folder, manifests.describe(found)))
    _VERIFIED[key] = stats


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
    """Where to resume from, checked against its manifest: None for a fresh start. ``resume_mode`` is verl's:
    ``auto`` (the newest complete checkpoint of ``root``, or ``resume_from_path`` when given), ``disable``,
    ``resume_path`` (``resume_from_path``, required), or the path of a global_step_<N> folder."""
    if resume_mode == "disable":
        return None
    if resume_mode == "resume_path" and not resume_from_path:
        raise ValueError(
            "trainer.resume_mode=resume_path needs trainer.resume_from_path (a global_step_<N> folder to resume from)"
        )
    explicit = resume_from_path if resume_mode in ("auto", "resume_path") else resume_mode
    key = "trainer.resume_from_path" if resume_mode in ("auto", "resume_path") else "trainer.resume_mode"
    if resume_mode != "auto" or resume_from_path:
        folder = Path(str(explicit)).expanduser()
        if not folder.exists():
            raise ValueError(f"{key}={explicit}: resume path {str(folder)!r} does not exist")
        if not _STEP_DIR.match(folder.name):
            raise ValueError(f"{key}={explicit}: resume path {str(folder)!r} must be a global_step_<N> folder of a run")
        if not is_complete(folder):
            raise ValueError(
                f"{key}={explicit}: resume path {str(folder)!r} is not a complete checkpoint (no {COMPLETE_MARKER} "
                "marker or trainer state): it was interrupted while being written; pick an earlier global_step folder"
            )
    else:
        folder = latest_complete(root)
        if folder is None:
            return None
    verify_checkpoint(folder)
    return folder


def checkpoint_lineage(folder: Path) -> str | None:
    """The lineage recorded in a complete checkpoint's manifest (None: an older verl's checkpoint)."""
    marker = _read_marker(folder)
    return marker.get("lineage") if marker is not None else None


def read_trainer_state(folder: Path) -> dict[str, Any]:
    return json.loads((folder / TRAINER_STATE).read_text())


def step_of(folder: Path) -> int:
    match = _STEP_DIR.match(folder.name)
    if not match:
        raise ValueError(f"{folder} is not a global_step_<N> folder")
    return int(match.group(1))


def prune_old(root: str | Path, keep: int | None, lineage: str | None | _Unset = OWNER) -> list[Path]:
    """After a save: delete all but the ``keep`` most recently completed checkpoints of this run's lineage
    (None or <= 0 keeps them all), and this lineage's incomplete folders below its newest one's step (left by
    a stop mid-write or mid-prune; they can never be loaded). Folders of other lineages, and folders verl did
    not write, are never removed."""
    root = Path(root)
    lineage = _lineage(root, lineage)
    folders = [(step, folder) for step, folder in _step_folders(root) if owned_by(folder, lineage)]
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
