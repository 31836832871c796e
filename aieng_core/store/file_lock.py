"""An exclusive flock on a lock file, held for a block: one process at a time does the work.

A regular file opened for writing (not a directory): flock over NFS is emulated with byte-range
locks, which need a descriptor open for writing. The kernel drops the lock when its holder
dies, so a killed holder never blocks the next one. The lock file itself stays; it is empty.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def exclusive_lock(path: Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created if missing) for the block; if another
    process holds it, call `on_wait` once (to say so) and wait for it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
