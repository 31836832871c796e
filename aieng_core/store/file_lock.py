"""flock on files, held for a block.

- `exclusive_lock`: one process at a time does the work (a training of one recipe, `aieng store
  gc`). `shared_lock`: any number at once, never while an exclusive holder works (writers
  publishing into the store, against gc). A lock file is a regular file opened for writing (not
  a directory): flock over NFS is emulated with byte-range locks, which need a descriptor open
  for writing. The lock file itself stays; it is empty.
- `held_file`: a shared lock on an existing file (an artifact's manifest.json), saying "in use"
  to `try_exclusive`, which takes the lock without waiting or reports that someone holds it.
  A shared lock needs a descriptor open for reading, an exclusive one a descriptor open for
  writing (NFS's emulation of flock with POSIX byte-range locks): every lock here is taken so.

The kernel drops a lock when its holder dies, however it dies, so a killed holder never
blocks the next one. Locks belong to open file descriptions: two open() calls in one process
conflict as two processes do.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path


@contextmanager
def _flock(path: Path, mode: int, on_wait: Callable[[], None] | None) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # releases the lock


def exclusive_lock(path: Path, on_wait: Callable[[], None] | None = None) -> AbstractContextManager[None]:
    """Hold an exclusive flock on `path` (created if missing) for the block; if another
    process holds it, call `on_wait` once (to say so) and wait for it."""
    return _flock(path, fcntl.LOCK_EX, on_wait)


def shared_lock(path: Path, on_wait: Callable[[], None] | None = None) -> AbstractContextManager[None]:
    """Hold a shared flock on `path` (created if missing) for the block; if an exclusive holder
    has it, call `on_wait` once and wait for it."""
    return _flock(path, fcntl.LOCK_SH, on_wait)


@contextmanager
def held_file(path: Path) -> Iterator[None]:
    """Hold a shared flock on the existing file `path` (opened read-only) for the block.

    FileNotFoundError when `path` is gone, or was replaced or removed while the lock was being
    taken: whoever held the exclusive lock (try_exclusive) moved it away meanwhile, and a lock
    on the old file protects nothing."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if not same:
            raise FileNotFoundError(f"{path} was removed while a lock on it was being taken")
        yield
    finally:
        os.close(fd)


def try_exclusive(path: Path) -> int | None:
    """A descriptor holding an exclusive flock on the existing file `path`, taken without
    waiting; None when someone holds a lock on it (`held_file`). The caller closes it to let go.
    Opened for writing, as an exclusive lock over NFS needs (read-only where the file is, as in
    a home shared read-only: a local filesystem takes the lock all the same)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except PermissionError:
        fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd
