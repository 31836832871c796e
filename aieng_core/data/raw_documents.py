"""raw_documents: an immutable snapshot of the files landed for one day.

The landed files are copied byte for byte into the artifact, so what was cleaned can
always be traced to, and re-read from, exactly the bytes that arrived, even if someone
later edits or deletes the landing folder.

The landing folder is written by programs we do not own, so it is read defensively:
only regular files are snapshotted (a symbolic link, to a file or a folder, is never
followed: it is listed in `ignored_files` instead), and a file whose name is not valid
UTF-8 is still snapshotted, under a name with each invalid byte written as %XX.

An empty day is ordinary: a landing folder that exists and holds no data files is a
snapshot of nothing (zero files, `no_data: true`), and everything downstream of it is an
empty partition that training ignores. A day with no landing folder at all is refused when
it is asked for alone (most likely a mistyped date); inside a range it is recorded as
empty too, with `landing_folder: absent`, so one missing day never fails the days around
it (Dagster records a single-run range step for every partition of the range).
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from aieng_core import asset_keys
from aieng_core.config import AiengConfig
from aieng_core.data.empty_day import ABSENT, EMPTY, LANDED, has_no_data
from aieng_core.data.readers import DATA_SUFFIXES, is_data_file
from aieng_core.faults import crash_point
from aieng_core.hashing import CHUNK_BYTES, sha256_json, sha256_stream
from aieng_core.home import raw_partition_dir
from aieng_core.store import Artifact, ArtifactIntegrityError, ArtifactSpec, ArtifactStore, Produced, RunInfo
from aieng_core.store.source_paths import ESCAPED_BYTE, readable

KIND = asset_keys.RAW_DOCUMENTS
CODE_VERSION = "raw_documents-v2"  # v2: non-UTF-8 names snapshotted, sources carry their stored name
FILES_DIR = "files"

log = logging.getLogger("aieng.data")


class MissingPartitionData(FileNotFoundError):
    """The landing folder of a partition does not exist."""


def snapshot_names(files: list[Path]) -> list[str]:
    """The name each landed file gets inside the snapshot, valid UTF-8 and unique.

    A valid name is kept as it is. In any other name each invalid byte becomes %XX
    (b"caf\\xe9.jsonl" -> "caf%E9.jsonl"); if that is already taken, by a file landed under
    that very name or by another escaped one, "~2", "~3", ... goes before the data suffix.
    """
    names = [os.fsencode(p.name).decode("utf-8", "surrogateescape") for p in files]
    taken = {name for name in names if not ESCAPED_BYTE.search(name)}
    chosen = []
    for name in names:
        if not ESCAPED_BYTE.search(name):
            chosen.append(name)
            continue
        escaped = ESCAPED_BYTE.sub(lambda m: f"%{ord(m.group()) - 0xDC00:02X}", name)
        suffix = max((s for s in DATA_SUFFIXES if escaped.endswith(s)), key=len, default="")
        stem, candidate, n = escaped[: len(escaped) - len(suffix)], escaped, 1
        while candidate in taken:
            n += 1
            candidate = f"{stem}~{n}{suffix}"
        taken.add(candidate)
        chosen.append(candidate)
    return chosen


def landed_files(home: Path, partition: str) -> tuple[list[Path], list[str]]:
    """The data files of a partition, sorted by name (none for an empty folder), and the
    (readable) names of the entries ignored. Only regular files count: lstat, so a link is
    never followed. A partition without a landing folder raises MissingPartitionData."""
    folder = raw_partition_dir(home, partition)
    if not folder.is_dir():
        raise MissingPartitionData(
            f"raw partition folder {folder} does not exist; land {', '.join('*' + s for s in DATA_SUFFIXES)} "
            "files there (an existing empty folder is an empty day)"
        )
    entries = sorted(folder.iterdir())
    data = [p for p in entries if is_landed_data(p)]
    ignored = [readable(p.name) for p in entries if p not in data]
    return data, ignored


def is_landed_data(path: Path) -> bool:
    """A regular file (lstat: a link is never followed) with a data suffix, not hidden: what a
    snapshot reads. Partial writes (`.name.tmp`, `name.part`) are hidden or have no data suffix."""
    try:
        return stat.S_ISREG(path.lstat().st_mode) and is_data_file(path.name)
    except FileNotFoundError:  # removed while the folder was listed
        return False


def _open_landed(path: Path) -> BinaryIO:
    """Open a listed landed file, refusing it if it has since become a symbolic link
    (O_NOFOLLOW) or anything but a regular file (O_NONBLOCK: opening a FIFO must not hang)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise RuntimeError(
            f"{readable(path)} could not be opened ({exc.strerror}); retry once landing is complete"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RuntimeError(f"{readable(path)} is no longer a regular file; retry once landing is complete")
    return os.fdopen(fd, "rb", buffering=0)


def _copy_verified(source: Path, target: Path, expected_sha256: str) -> None:
    digest = hashlib.sha256()
    with _open_landed(source) as reader, open(target, "wb") as writer:
        while chunk := reader.read(CHUNK_BYTES):
            digest.update(chunk)
            writer.write(chunk)
    if digest.hexdigest() != expected_sha256:
        raise RuntimeError(f"{readable(source)} changed while it was being read; retry once landing is complete")


def build_raw_documents(
    store: ArtifactStore,
    config: AiengConfig,
    partition: str,
    run: RunInfo = RunInfo(),
    logger: Any = log,
    absent_ok: bool = False,
) -> Artifact:
    """Snapshot the partition's landing folder. `absent_ok`: a missing folder is recorded as an
    empty day (`landing_folder: absent`) instead of refused (a range run asks for that)."""
    try:
        files, ignored = landed_files(store.home, partition)
        landing = LANDED if files else EMPTY
    except MissingPartitionData:
        if not absent_ok:
            raise
        files, ignored, landing = [], [], ABSENT
    if landing != LANDED:
        kept = _snapshot_with_data(store, partition)
        if kept is not None:
            # The snapshot exists so that cleaning up the landing folder loses nothing: a folder
            # emptied or removed after its day was ingested never replaces the day's data.
            logger.warning(
                f"raw_documents {partition}: the landing folder is {'gone' if landing == ABSENT else 'empty'}, "
                f"but {kept.id} holds this day's {kept.metrics.get('files')} landed files; keeping it (land "
                "the day's files again to replace them)"
            )
            return Artifact(kept.kind, kept.id, kept.path, kept.manifest, reused=True)
    if landing == ABSENT:
        logger.warning(
            f"raw_documents {partition}: no landing folder {raw_partition_dir(store.home, partition)}; "
            "recorded as a day without data"
        )
    if landing == EMPTY:
        logger.info(f"raw_documents {partition}: the landing folder holds no data files; an empty day")
    sources: list[dict[str, Any]] = []
    for path, name in zip(files, snapshot_names(files)):
        with _open_landed(path) as handle:
            sha256, size = sha256_stream(handle)  # size and hash of the same read
            mtime_ns = os.fstat(handle.fileno()).st_mtime_ns
        sources.append(
            {
                "name": name,
                "landed_name": readable(path.name),
                "path": path,
                "size": size,
                "sha256": sha256,
                "mtime_ns": mtime_ns,
            }
        )
    # The landed name, not the path: the same bytes under the same names are the same
    # snapshot wherever $AIENG_HOME is.
    identity = [{"name": s["landed_name"], "size": s["size"], "sha256": s["sha256"]} for s in sources]
    if ignored:
        logger.warning(
            f"raw_documents {partition}: ignoring entries that are not regular data files: {', '.join(ignored)}"
        )
    spec = ArtifactSpec(
        kind=KIND,
        code_version=CODE_VERSION,
        config_sha256=sha256_json({}),  # a snapshot depends on no configuration
        config_sections={},
        partition=partition,
        # An absent folder and an empty one are different facts about the day: different ids.
        recipe={"sources": identity, **({"landing_folder": ABSENT} if landing == ABSENT else {})},
    )

    def produce(staging: Path) -> Produced:
        (staging / FILES_DIR).mkdir()
        for source in sources:
            _copy_verified(source["path"], staging / FILES_DIR / source["name"], source["sha256"])
            crash_point("raw_documents.file_copied")
        return Produced(
            content_sha256=sha256_json(identity),
            metrics={
                "files": len(sources),
                "bytes": sum(s["size"] for s in sources),
                "no_data": not sources,
                "landing_folder": landing,
            },
            extra={
                # path: where it landed, written by readable(); name: its file under files/.
                "sources": [
                    {
                        "path": readable(s["path"]),
                        "name": s["name"],
                        "size": s["size"],
                        "sha256": s["sha256"],
                        # Not part of the id: lets the landing sensor tell a re-landing without re-reading.
                        "mtime_ns": s["mtime_ns"],
                    }
                    for s in sources
                ],
                "ignored_files": ignored,
            },
        )

    return store.build(spec, produce, run, logger)


def _snapshot_with_data(store: ArtifactStore, partition: str) -> Artifact | None:
    """The partition's current snapshot, if it holds data and is intact."""
    current = store.current(KIND, partition)
    if current is None or has_no_data(current) or store.verify(current):
        return None
    return current


def snapshot_files(artifact: Artifact) -> list[tuple[str, Path]]:
    """(name, path) of every file in a raw_documents artifact, in processing order.

    Names are valid UTF-8. Snapshots made before sources recorded a "name" stored each
    file under its landed name.
    """
    names = sorted(source.get("name") or Path(source["path"]).name for source in artifact.manifest["sources"])
    for name in names:
        # A hand-edited manifest must not make us read outside the snapshot.
        if "/" in name or "\\" in name or "\x00" in name or name in (".", ".."):
            raise ArtifactIntegrityError(f"raw_documents artifact {artifact.id} lists an invalid file name {name!r}")
    return [(name, artifact.path / FILES_DIR / name) for name in names]
