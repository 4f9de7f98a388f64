"""A checkpoint's manifest: the size and SHA-256 of every file in its folder.

The manifest is the content of the folder's ``COMPLETE`` marker (see ``checkpoint_layout``), so marking a
checkpoint complete and recording what it holds is one atomic rename. Loading checks every file against it
first: a flipped byte, a truncated, missing or added file is refused with a message that names the file,
before any of it reaches a model.

What this guards against is damage (a torn write after a power cut, a bad copy, a disk error, a hand
edit), not a determined attacker, who could rewrite the manifest too. Safety against hostile files comes
from the loaders: checkpoints hold only safetensors and JSON, and nothing on the load path unpickles.

Building the manifest reads every file once and fsyncs it and its folder, so the bytes it vouches for are
on disk before the marker is.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

KIND = "verl-checkpoint-manifest"
VERSION = 1
ALGORITHM = "sha256"
_CHUNK = 4 * 1024 * 1024
#: Problems listed in one error message; more are counted.
_SHOWN = 5


class CheckpointIntegrityError(ValueError):
    """A checkpoint whose files do not match its manifest (or whose manifest is unreadable)."""


def _files(folder: Path, skip: frozenset[str]) -> list[str]:
    """Every regular file under ``folder`` as a relative POSIX path, sorted; ``skip``: top-level names."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for name in filenames:
            rel = Path(dirpath, name).relative_to(folder).as_posix()
            if rel not in skip:
                found.append(rel)
    return sorted(found)


def _digest(path: Path, sync: bool) -> tuple[int, str]:
    """(size, hex digest) of one file; ``sync``: also flush it to disk (it was just written)."""
    digest = hashlib.new(ALGORITHM)
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):  # hashlib releases the GIL on large updates: threads overlap
            digest.update(chunk)
            size += len(chunk)
        if sync:
            os.fsync(fh.fileno())
    return size, digest.hexdigest()


def _digests(folder: Path, names: list[str], sync: bool) -> dict[str, tuple[int, str]]:
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        results = pool.map(lambda name: _digest(folder / name, sync), names)
        return dict(zip(names, results))


def _fsync_tree(folder: Path) -> None:
    for dirpath, _, _ in os.walk(folder):
        fd = os.open(dirpath, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def build_manifest(folder: str | Path, step: int, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The manifest of everything now in ``folder`` (but the top-level names in ``skip``), flushed to disk."""
    folder = Path(folder)
    digests = _digests(folder, _files(folder, skip), sync=True)
    _fsync_tree(folder)
    return {
        "kind": KIND,
        "version": VERSION,
        "step": step,
        "algorithm": ALGORITHM,
        "files": {name: {"size": size, ALGORITHM: hexdigest} for name, (size, hexdigest) in digests.items()},
    }


def problems(folder: str | Path, manifest: dict[str, Any], skip: frozenset[str] = frozenset()) -> list[str]:
    """What in ``folder`` differs from ``manifest``, one phrase per file (empty: intact)."""
    folder = Path(folder)
    if manifest.get("kind") != KIND or manifest.get("version") != VERSION or manifest.get("algorithm") != ALGORITHM:
        return [
            f"its manifest is of an unknown kind or version ({manifest.get('kind')!r} v{manifest.get('version')}, "
            f"{manifest.get('algorithm')!r}); this verl reads {KIND!r} v{VERSION} ({ALGORITHM})"
        ]
    expected: dict[str, dict[str, Any]] = manifest["files"]
    present = set(_files(folder, skip))
    found = []
    for name in sorted(set(expected) - present):
        found.append(f"{name} is missing")
    for name in sorted(present - set(expected)):
        found.append(f"{name} is not part of the checkpoint (added after it was written)")
    common = sorted(set(expected) & present)
    sized = []
    for name in common:
        actual = (folder / name).stat().st_size
        want = int(expected[name]["size"])
        if actual != want:
            how = "truncated" if actual < want else "grown"
            found.append(f"{name} has {actual} bytes where {want} were written ({how})")
        else:
            sized.append(name)
    for name, (_, hexdigest) in _digests(folder, sized, sync=False).items():
        if hexdigest != expected[name][ALGORITHM]:
            found.append(f"{name} has changed since it was written ({ALGORITHM} mismatch)")
    return found


def describe(found: list[str]) -> str:
    shown = "; ".join(found[:_SHOWN])
    more = len(found) - _SHOWN
    return shown + (f"; and {more} more problem(s)" if more > 0 else "")
