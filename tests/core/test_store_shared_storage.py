"""A shared AIENG_HOME on NFS: every lock the store takes is on a regular file open as the lock
needs it (an exclusive lock for writing, a shared one for reading), never on a directory.

Linux's NFS client emulates flock with POSIX byte-range locks, which refuse (EBADF) an
exclusive lock on a descriptor not open for writing; a directory cannot be opened for
writing at all. Here fcntl.flock refuses the same, and the store's whole life runs under it:
builds, refs, a writer killed mid-build and its staging collected, a live writer's staging
kept, and gc deleting what nothing reaches. The same flows fail under it on the store's
earlier locks (taken on directories opened read-only)."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path

import pytest

from aieng_core.hashing import sha256_bytes
from aieng_core.store import ArtifactSpec, ArtifactStore, Produced
from aieng_core.store.atomic import atomic_directory, atomic_write_bytes, owner_alive
from aieng_core.store.file_lock import exclusive_lock, held_file, shared_lock, try_exclusive
from aieng_core.store.verify import verify_store

KIND = "thing"


@pytest.fixture(autouse=True)
def nfs_flock(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """fcntl.flock as over NFS; the locks taken, as (file type, access mode)."""
    real = fcntl.flock
    taken: list[tuple[str, int]] = []

    def flock(fd: int, operation: int) -> None:
        mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
        directory = stat.S_ISDIR(os.fstat(fd).st_mode)
        if operation & fcntl.LOCK_EX and (directory or mode == os.O_RDONLY):
            raise OSError(errno.EBADF, "Bad file descriptor: NFS takes an exclusive lock for writing only")
        if operation & fcntl.LOCK_SH and mode == os.O_WRONLY:
            raise OSError(errno.EBADF, "Bad file descriptor: NFS takes a shared lock for reading only")
        if not operation & fcntl.LOCK_UN:
            taken.append(("directory" if directory else "file", mode))
        real(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock)
    return taken


def _build(store: ArtifactStore, name: str) -> str:
    def produce(staging: Path) -> Produced:
        (staging / "data.txt").write_text(f"{name}\n")
        return Produced(content_sha256=sha256_bytes(name.encode()))

    spec = ArtifactSpec(kind=KIND, code_version="thing-v1", config_sha256="c" * 64, recipe={"n": name})
    return store.build(spec, produce).id


def test_builds_refs_and_holds_take_their_locks_as_nfs_allows(tmp_path: Path, nfs_flock: list) -> None:
    store = ArtifactStore(tmp_path / "home")
    artifact = store.get(KIND, _build(store, "a"))
    atomic_write_bytes(tmp_path / "home" / "refs" / "x.json", b"{}")
    with store.hold(artifact):
        pass
    with exclusive_lock(tmp_path / "lock"), shared_lock(tmp_path / "other"):
        pass
    assert nfs_flock and all(kind == "file" for kind, _ in nfs_flock)  # never a directory


def test_a_live_writers_staging_is_kept_and_a_dead_ones_collected(tmp_path: Path) -> None:
    home = tmp_path / "home"
    target = home / "artifacts" / KIND / "id1"
    with atomic_directory(target) as staging:
        (staging / "f").write_text("x")
        lock = staging.with_name(staging.name + ".lock")
        assert lock.is_file() and owner_alive(staging) is True
        result = verify_store(home, gc=True)
        assert result["staging"] == [{"path": str(staging), "type": "directory", "owner_alive": True}]
        assert result["removed"] == [] and staging.is_dir()
    assert target.is_dir() and not lock.exists() and not staging.exists()  # renamed; the lock file gone
    # What a writer killed after staging leaves: its directory and its lock file, unlocked.
    dead = home / "artifacts" / KIND / ".id2.tmp-deadbeef"
    dead.mkdir()
    (dead / "f").write_text("x")
    dead.with_name(dead.name + ".lock").touch()
    result = verify_store(home, gc=True)
    assert result["staging"] == [{"path": str(dead), "type": "directory", "owner_alive": False}]
    assert result["removed"] == [str(dead)] and not dead.exists()
    assert sorted(p.name for p in (home / "artifacts" / KIND).iterdir()) == ["id1"]


def test_gc_deletes_what_nothing_reaches_under_nfs_locks(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "home")
    artifact = store.get(KIND, _build(store, "b"))
    fd = try_exclusive(artifact.path / "manifest.json")
    assert fd is not None
    os.close(fd)
    with held_file(artifact.path / "manifest.json"):
        assert try_exclusive(artifact.path / "manifest.json") is None  # in use: left alone
