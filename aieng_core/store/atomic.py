"""Atomic appearance of files and directories.

Write into a temporary sibling of the target (same filesystem, so rename is atomic), fsync
the files, rename, then fsync the parent directory so the rename itself survives a crash.
A reader sees the old state or the whole new one, never half of it, whatever kills the
writer. Never stage in the system temp dir: rename across devices fails.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TEMP_MARKER = ".tmp-"


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


@contextmanager
def atomic_directory(target: Path) -> Iterator[Path]:
    """Yield an empty staging directory that becomes `target` when the block succeeds.

    Raises FileExistsError if `target` appeared meanwhile (another writer won the race);
    the staging directory is removed on any failure.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}{TEMP_MARKER}", dir=target.parent))
    try:
        yield staging
        fsync_tree(staging)
        try:
            os.rename(staging, target)
        except OSError as exc:
            if target.exists():
                raise FileExistsError(f"{target} appeared while it was being written") from exc
            raise
        fsync_path(target.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, staging = tempfile.mkstemp(prefix=f".{path.name}{TEMP_MARKER}", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(staging, path)
        fsync_path(path.parent)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise
