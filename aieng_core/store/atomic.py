"""Atomic appearance of files and directories.

Write into a temporary sibling of the target (same filesystem, so rename is atomic), fsync
the files, rename, then fsync the parent directory so the rename itself survives a crash.
A reader sees the old state or the whole new one, never half of it, whatever kills the
writer. Never stage in the system temp dir: rename across devices fails.

A writer killed part-way leaves its staging sibling behind (`.<name>.tmp-XXXXXXXX`). Who may
remove one: its writer holds an exclusive flock from before creating it until it is renamed
or discarded, and the kernel drops the lock when the writer dies, however it dies.
`remove_if_abandoned` takes that lock without waiting, so it removes only what no live writer
owns (`aieng store verify --gc`).

The lock is always on a regular file opened for writing: a temporary file's own descriptor,
and for a staging directory its lock file beside it (`.<name>.tmp-XXXXXXXX.lock`, created and
locked before the directory, removed after the rename). Never on a directory descriptor
opened read-only: on NFS, flock is emulated with POSIX byte-range locks, and an exclusive one
needs a descriptor open for writing (docs/operations/artifact-store.md says what a shared
AIENG_HOME needs).
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
LOCK_SUFFIX = ".lock"  # a staging directory's lock file: its name plus this


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
        # The lock file first, locked, then the directory it names: a collector never sees a
        # staging directory whose writer does not hold its lock.
        owner, name = tempfile.mkstemp(prefix=f".{target.name}{TEMP_MARKER}", suffix=LOCK_SUFFIX, dir=target.parent)
        lock = Path(name)
        if _owned(owner, lock):
            staging = lock.with_name(lock.name.removesuffix(LOCK_SUFFIX))
            try:
                os.mkdir(staging)
                break
            except FileExistsError:  # a leftover of the same random name: another name
                lock.unlink(missing_ok=True)
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
        lock.unlink(missing_ok=True)  # while still held: a collector that opened it finds it gone
        os.close(owner)


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
def lock_of(path: Path) -> Path:
    """Where the writer's lock of the staging entry `path` is: beside a directory, the file itself."""
    return path.with_name(path.name + LOCK_SUFFIX) if path.is_dir() and not path.is_symlink() else path


def _open_lock(path: Path) -> int:
    """A descriptor open for writing on the lock file itself, never through a symbolic link
    (an exclusive lock over NFS needs one); nothing is created."""
    return os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)


def owner_alive(path: Path) -> bool:
    """Whether a live writer holds the staging entry `path` (a directory or a temporary file)."""
    try:
        fd = _open_lock(lock_of(path))
    except FileNotFoundError:
        return False  # gone, or a directory whose lock file is gone: no writer holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def remove_if_abandoned(path: Path) -> bool:
    """Remove the staging entry `path` (and a directory's lock file) if no live writer holds
    it; True when removed.

    The writer's lock is held while removing, so a writer cannot adopt the entry meanwhile;
    an entry renamed into place since it was listed is left alone (it is no longer at `path`).
    """
    lock = lock_of(path)
    try:
        fd = _open_lock(lock)
    except FileNotFoundError:
        if lock == path:
            return False  # gone: its writer finished (renamed it) or discarded it
        return _remove_unlocked_directory(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        try:
            if not os.path.samestat(os.fstat(fd), os.lstat(lock)):
                return False
        except FileNotFoundError:
            return False
        if lock != path:
            if not _remove_unlocked_directory(path):
                return False
        lock.unlink()
        return True
    finally:
        os.close(fd)


def _remove_unlocked_directory(path: Path) -> bool:
    """A staging directory no lock file guards: a writer's lock file is made (and locked)
    before its directory and removed after the rename, so no live writer owns this one."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(info.st_mode):
        return False
    shutil.rmtree(path)
    return True
