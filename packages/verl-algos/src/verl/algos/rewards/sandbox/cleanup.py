"""Removing a run's scratch directory, whatever the program left in it.

The program owns its working directory: it may leave a tree deeper than any path length or
recursion limit, millions of entries, directories it took its own permissions from, and symbolic
links to files anywhere on the machine. The removal therefore

- never follows a symbolic link: every entry is looked at with ``lstat`` relative to an open
  directory, a link is only ever unlinked, and directories are opened with ``O_NOFOLLOW``;
- changes the mode only of a directory it has opened itself (``O_PATH | O_NOFOLLOW``, checked to
  be a directory, then chmod through ``/proc/self/fd``, which names that very inode), never of a
  file, so a hard or symbolic link to a file outside cannot have its mode changed;
- needs no recursion, no long path and a constant number of open files: each subdirectory is moved
  up to the top directory (``renameat``) and emptied there, so the tree is flattened as it goes.

It runs once every process of the run is gone (a run's PID namespace is empty by then), so nothing
changes the tree while it is removed.
"""

from __future__ import annotations

import itertools
import os
import stat

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(path: str) -> None:
    """Remove ``path`` and everything beneath it without following links (``path`` itself may be a
    link: then only the link is removed). Raises OSError if something cannot be removed."""
    parent, name = os.path.split(os.path.abspath(path))
    parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=parent_fd)
            return
        _remove_directory(parent_fd, name)
    finally:
        os.close(parent_fd)


def _remove_directory(parent_fd: int, name: str) -> None:
    _make_accessible(parent_fd, name)
    top = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    try:
        fresh_names = (f".verl-removing-{i}" for i in itertools.count())
        # The top directory's own entries are listed first: the directories moved into it must not
        # show up again in the listing being worked through.
        with os.scandir(top) as entries:
            listing = list(entries)
        pending = _empty(top, top, listing, fresh_names)
        while pending:
            moved = pending.pop()
            _make_accessible(top, moved)
            fd = os.open(moved, _DIR_FLAGS, dir_fd=top)
            try:
                with os.scandir(fd) as entries:
                    pending.extend(_empty(fd, top, entries, fresh_names))
            finally:
                os.close(fd)
            os.rmdir(moved, dir_fd=top)
    finally:
        os.close(top)
    os.rmdir(name, dir_fd=parent_fd)


def _empty(fd: int, top: int, entries, fresh_names) -> list[str]:
    """Unlink every non-directory in the directory ``fd``; move each subdirectory into ``top`` under
    a fresh name and return those names."""
    moved = []
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            _make_accessible(fd, entry.name)
            target = next(fresh_names)
            os.rename(entry.name, target, src_dir_fd=fd, dst_dir_fd=top)
            moved.append(target)
        else:
            os.unlink(entry.name, dir_fd=fd)
    return moved


def _make_accessible(parent_fd: int, name: str) -> None:
    """Give the owner read, write and search on the directory ``name`` (a program may have taken
    them away) so that it can be listed, emptied and moved. A link, or anything not a directory, is
    left alone. Best effort: where the mode cannot be changed, the removal itself says what failed."""
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IRWXU != stat.S_IRWXU:
            os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(st.st_mode) | stat.S_IRWXU)
    except OSError:
        pass
    finally:
        os.close(fd)
