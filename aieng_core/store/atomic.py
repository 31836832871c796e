"""Atomic appearance of files and directories.

Write into a temporary sibling of the target (same filesystem, so rename is atomic), fsync
the files, rename, then fsync the parent directory so the rename itself survives a crash.
A reader sees the old state or the whole new one, never half of it, whatever kills the
writer. Never stage in the system temp dir: rename across devices fails.

A writer killed part-way leaves its staging sibling behind (`.<name>.tmp-XXXXXXXX`). Who may
remove one: its writer holds an exclusive flock on it (on the directory, or on the temporary
file) from creating it until it is renamed or discarded, and the kernel drops the lock when
the writer dies, however it dies. `remove_if_abandoned` takes that lock without waiting, so
it removes only what no live writer owns (`aieng store verify --gc`).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from aieng_core.faults import crash_point

TEMP_MARKER = ".tmp-"


class TargetExists(FileExistsError):
    """`target` appeared while an atomic directory for it was being written: another writer won."""

    def __init__(self, target: Path) -> None:
        super().__init__(f"{target} appeared while it was being written")
        self.target = target


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    for directory, _, files in os.walk(root):
        for name in files:
            fsync_path(Path(directory) / name)
        fsync_path(Path(directory))


def is_temporary(name: str) -> bool:
    return name.startswith(".") and TEMP_MARKER in name


def _owned(fd: int, path: Path) -> bool:
    """Take the writer's lock on a staging entry just created; False if a collector removed it
    in the moment between its creation and the lock (the caller then makes another)."""
    fcntl.flock(fd, fcntl.LOCK_EX)  # a collector holds it only while it removes the entry
    try:
        return os.path.samestat(os.fstat(fd), os.lstat(path))
    except FileNotFoundError:
        return False


@contextmanager
def atomic_directory(target: Path) -> Iterator[Path]:
    """Yield an empty staging directory that becomes `target` when the block succeeds.

    Raises TargetExists if `target` appeared meanwhile (another writer won the race);
    the staging directory is removed on any failure.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    while True:
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}{TEMP_MARKER}", dir=target.parent))
        owner = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
        if _owned(owner, staging):
            break
        os.close(owner)
    try:
        yield staging
        fsync_tree(staging)
        crash_point("atomic_dir.synced")
        try:
            os.rename(staging, target)
        except OSError as exc:
            if target.exists():
                raise TargetExists(target) from exc
            raise
        crash_point("atomic_dir.renamed")
        fsync_path(target.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        os.close(owner)  # releases the lock (on `target` by now, where nothing looks for it)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}{TEMP_MARKER}", dir=path.parent)
        staging = Path(name)
        if _owned(fd, staging):
            break
        os.close(fd)
    try:
        with os.fdopen(fd, "wb") as handle:  # closing it, after the replace, releases the lock
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
            crash_point("atomic_file.synced")
            os.replace(staging, path)
        fsync_path(path.parent)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise


# ---- abandoned staging (what `aieng store verify` lists and `--gc` removes) -------------------
def _open_entry(path: Path) -> int:
    """A descriptor on the entry itself, never through a symbolic link."""
    return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)


def owner_alive(path: Path) -> bool:
    """Whether a live writer holds the staging entry `path` (a directory or a temporary file)."""
    try:
        fd = _open_entry(path)
    except FileNotFoundError:
        return False  # gone: its writer finished (renamed it) or discarded it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def remove_if_abandoned(path: Path) -> bool:
    """Remove the staging entry `path` if no live writer holds it; True when removed.

    The writer's lock is held while removing, so a writer cannot adopt the entry meanwhile;
    an entry renamed into place since it was listed is left alone (it is no longer at `path`).
    """
    try:
        fd = _open_entry(path)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return False
        if not os.path.samestat(os.fstat(fd), info):
            return False
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(path)
        else:
            path.unlink()
        return True
    finally:
        os.close(fd)
