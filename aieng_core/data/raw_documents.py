"""raw_documents: an immutable snapshot of the files landed for one day.

The landed files are copied byte for byte into the artifact, so what was cleaned can
always be traced to, and re-read from, exactly the bytes that arrived, even if someone
later edits or deletes the landing folder.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

from aieng_core import asset_keys
from aieng_core.config import AiengConfig
from aieng_core.hashing import CHUNK_BYTES, sha256_file, sha256_json
from aieng_core.home import raw_partition_dir
from aieng_core.data.readers import DATA_SUFFIXES, is_data_file
from aieng_core.store import Artifact, ArtifactSpec, ArtifactStore, Produced, RunInfo

KIND = asset_keys.RAW_DOCUMENTS
CODE_VERSION = "raw_documents-v1"
FILES_DIR = "files"

log = logging.getLogger("aieng.data")


class MissingPartitionData(FileNotFoundError):
    """The landing folder of a partition is missing or holds no data files."""


def landed_files(home: Path, partition: str) -> tuple[list[Path], list[str]]:
    """The data files of a partition, sorted by name, and the names of files ignored."""
    folder = raw_partition_dir(home, partition)
    if not folder.is_dir():
        raise MissingPartitionData(f"raw partition folder {folder} does not exist; land {', '.join('*' + s for s in DATA_SUFFIXES)} files there")
    entries = sorted(folder.iterdir())
    data = [p for p in entries if p.is_file() and is_data_file(p.name)]
    ignored = [p.name for p in entries if p not in data]
    if not data:
        raise MissingPartitionData(f"raw partition folder {folder} holds no data files ({', '.join('*' + s for s in DATA_SUFFIXES)})")
    return data, ignored


def _copy_verified(source: Path, target: Path, expected_sha256: str) -> None:
    digest = hashlib.sha256()
    with open(source, "rb") as reader, open(target, "wb") as writer:
        while chunk := reader.read(CHUNK_BYTES):
            digest.update(chunk)
            writer.write(chunk)
    if digest.hexdigest() != expected_sha256:
        raise RuntimeError(f"{source} changed while it was being read; retry once landing is complete")


def build_raw_documents(
    store: ArtifactStore, config: AiengConfig, partition: str, run: RunInfo = RunInfo(), logger: Any = log
) -> Artifact:
    files, ignored = landed_files(store.home, partition)
    sources = [{"name": p.name, "path": str(p), "size": p.stat().st_size, "sha256": sha256_file(p)} for p in files]
    identity = [{"name": s["name"], "size": s["size"], "sha256": s["sha256"]} for s in sources]
    if ignored:
        logger.warning(f"raw_documents {partition}: ignoring files that are not data files: {', '.join(ignored)}")
    spec = ArtifactSpec(
        kind=KIND,
        code_version=CODE_VERSION,
        config_sha256=sha256_json({}),  # a snapshot depends on no configuration
        partition=partition,
        recipe={"sources": identity},
    )

    def produce(staging: Path) -> Produced:
        (staging / FILES_DIR).mkdir()
        for source in sources:
            _copy_verified(Path(source["path"]), staging / FILES_DIR / source["name"], source["sha256"])
        return Produced(
            content_sha256=sha256_json(identity),
            metrics={"files": len(sources), "bytes": sum(s["size"] for s in sources)},
            extra={
                "sources": [{"path": s["path"], "size": s["size"], "sha256": s["sha256"]} for s in sources],
                "ignored_files": ignored,
            },
        )

    return store.build(spec, produce, run, logger)


def snapshot_files(artifact: Artifact) -> list[tuple[str, Path]]:
    """(name, path) of every file in a raw_documents artifact, in processing order."""
    names = sorted(Path(source["path"]).name for source in artifact.manifest["sources"])
    return [(name, artifact.path / FILES_DIR / name) for name in names]
