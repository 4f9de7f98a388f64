"""Where a run starts, decided before Ray starts: the checkpoint it resumes from, its lineage, and whether
the run folder may be written at all.

verl's resume semantics are kept: ``trainer.resume_mode=auto`` resumes from the folder's newest complete
checkpoint (or starts fresh when there is none), ``disable`` starts fresh, ``resume_path`` /
a global_step_<N> path resumes from that checkpoint. What is added is that nothing is overwritten without
being asked:

- A run's *lineage* is the identity stamped into its checkpoints: a fresh run gets a new one, a resumed run
  continues the one of the checkpoint it resumes from. (A run that finds only incomplete folders of a run
  that never completed a checkpoint takes that run's lineage over: it is the same run started again.)
- A run that would write into a folder holding complete checkpoints of *another* lineage (a fresh run,
  ``resume_mode=disable``, pointed at an older run's folder; a run resumed from a checkpoint of another
  folder) is refused before it writes anything, naming the checkpoints, unless ``trainer.start_over=true``.
- ``trainer.start_over=true`` moves what earlier runs left (checkpoints, partial ones included, the latest
  file and metrics) into ``<run folder>/earlier_run_<time>/`` and starts fresh: nothing is deleted. It
  cannot be combined with resuming from a checkpoint of the same folder.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl.algos.run import checkpoint_layout as layout
from verl.core.config import ConfigError

logger = logging.getLogger(__name__)

#: What an earlier run leaves in the folder besides its checkpoints, moved aside with them by start_over.
EARLIER_RUN_FILES = (layout.LATEST_FILE, "metrics.jsonl")


@dataclass
class RunStart:
    root: Path
    #: The checkpoint to resume from (None: a fresh start).
    resume_from: Path | None
    lineage: str | None
    #: With trainer.start_over: what is moved into ``set_aside_to`` before the run writes anything.
    set_aside: list[Path] = field(default_factory=list)
    set_aside_to: Path | None = None

    def apply(self, lock: Any) -> None:
        """Move what start_over sets aside (the run holds ``lock``), and give the lock the run's lineage."""
        if self.set_aside:
            self.set_aside_to.mkdir(parents=True)
            for path in self.set_aside:
                path.rename(self.set_aside_to / path.name)
            logger.warning(
                "trainer.start_over=true: moved the earlier run's %s into %s (nothing was deleted)",
                ", ".join(p.name for p in self.set_aside),
                self.set_aside_to,
            )
        lock.lineage = self.lineage


def plan_start(trainer_cfg: Any, writes_checkpoints: bool = True) -> RunStart:
    """The start of a run with ``trainer_cfg`` (verl's trainer section); a ConfigError when the resume
    path is missing or not a complete checkpoint, or when the run would write over another run's
    checkpoints. Reads only: nothing is written."""
    root = Path(trainer_cfg.default_local_dir).expanduser()
    start_over = bool(getattr(trainer_cfg, "start_over", False))
    resume_mode = "disable" if start_over and trainer_cfg.resume_mode == "auto" else trainer_cfg.resume_mode
    try:
        resume_from = layout.resolve_resume(root, resume_mode, trainer_cfg.resume_from_path)
    except layout.CheckpointIntegrityError:
        raise
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    complete = _complete_checkpoints(root)
    if resume_from is not None:
        lineage = layout.checkpoint_lineage(resume_from)
    else:
        lineage = _abandoned_lineage(root, complete) or uuid.uuid4().hex[:16]
    start = RunStart(root, resume_from, lineage)
    if not writes_checkpoints:
        return start
    if start_over:
        return _set_earlier_run_aside(start, root, resume_from)
    _refuse_foreign_checkpoints(trainer_cfg, root, resume_from, complete, lineage)
    return start


def _set_earlier_run_aside(start: RunStart, root: Path, resume_from: Path | None) -> RunStart:
    """trainer.start_over: the earlier run's files to move into ``earlier_run_<time>/`` (nothing deleted)."""
    if resume_from is not None and resume_from.resolve().parent == root.resolve():
        raise ConfigError(
            f"trainer.start_over=true would move the checkpoint this run resumes from ({resume_from}) out of "
            f"{root}; resume from a copy outside the folder, or drop trainer.start_over"
        )
    start.set_aside = [p for p in sorted(root.iterdir()) if _earlier_run_file(p)] if root.is_dir() else []
    aside = root / time.strftime("earlier_run_%Y%m%d-%H%M%S")
    start.set_aside_to = next(
        p for p in (aside, *(aside.with_name(f"{aside.name}-{i}") for i in range(2, 1000))) if not p.exists()
    )
    return start


def _refuse_foreign_checkpoints(
    trainer_cfg: Any, root: Path, resume_from: Path | None, complete: list[tuple[Path, str | None]], lineage: str
) -> None:
    """A ConfigError when the folder holds checkpoints (or checkpoint-named folders) of another run."""
    foreign = [folder.name for folder, found in complete if found != lineage]
    strays = [
        folder.name
        for _, folder in layout.step_folders(root)
        if not layout.is_complete(folder) and not layout.owned_by(folder, lineage)
    ]
    if not foreign and not strays:
        return
    if not foreign:  # only folders named like checkpoints that no run of this lineage wrote
        raise ConfigError(
            f"trainer.default_local_dir={trainer_cfg.default_local_dir} holds {_names(strays)}: folders named like "
            "checkpoints that are incomplete and were not written by this run, so verl would have to replace them "
            "when it saves those steps. Move them out of the folder, give this run another "
            "trainer.default_local_dir, or set trainer.start_over=true to move them into "
            f"{root}/earlier_run_<time>/ (nothing is deleted)"
        )
    names = _names(foreign)
    if resume_from is None:
        why = f"trainer.resume_mode={trainer_cfg.resume_mode} starts a new run"
    else:
        why = f"this run resumes from {resume_from}, another run's checkpoint,"
    raise ConfigError(
        f"{why} but trainer.default_local_dir={trainer_cfg.default_local_dir} holds checkpoints of an earlier run "
        f"({names}), which the new run would overwrite and rotate away. Resume that run instead "
        f"(trainer.resume_mode=auto), give this run another trainer.default_local_dir, or set "
        f"trainer.start_over=true to move the earlier run's checkpoints and metrics into "
        f"{root}/earlier_run_<time>/ and start again (nothing is deleted)"
    )


def _names(folders: list[str]) -> str:
    return ", ".join(folders[:5]) + (", ..." if len(folders) > 5 else "")


def _complete_checkpoints(root: Path) -> list[tuple[Path, str | None]]:
    """(folder, lineage) of every complete checkpoint in ``root``; an unreadable lineage counts as foreign."""
    found = []
    for _, folder in layout.step_folders(root):
        if layout.is_complete(folder):
            known, lineage = layout.folder_lineage(folder)
            found.append((folder, lineage if known else f"unknown:{folder.name}"))
    return found


def _abandoned_lineage(root: Path, complete: list) -> str | None:
    """The lineage of a run that wrote into ``root`` but completed no checkpoint there (killed during its first
    save): a run starting afresh continues it, so that its incomplete folders are its own to replace."""
    if complete:
        return None
    partial = []
    for _, folder in layout.step_folders(root):
        known, lineage = layout.folder_lineage(folder)
        if known and lineage is not None:
            partial.append(((folder / layout.WRITER_FILE).stat().st_mtime, lineage))
    return max(partial)[1] if partial else None


def _earlier_run_file(path: Path) -> bool:
    return path.name in EARLIER_RUN_FILES or (path.is_dir() and path.name.startswith("global_step_"))
