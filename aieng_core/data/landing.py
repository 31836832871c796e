"""What has landed in $AIENG_HOME/raw/, and whether the store's snapshot of it is up to date.

The landing sensor and `aieng data status` both read the landing folder through here, so they
agree on what changed. A folder's listing is what a raw snapshot would read (regular data
files, not hidden: is_landed_data), each with its size and modification time; its digest
changes whenever a file is added, removed, resized or rewritten, and only then.

A listing is *settled* once the landing sensor has seen the same digest for `settle_seconds`
by its own clock (orchestration/landing.py): a writer still copying a file keeps changing
the digest, and the writer's clock (NFS, another machine) is never trusted, so a file whose
modification time is in the past but which is still growing is not taken for finished (and a
snapshot that catches a file changing under it fails and is retried, raw_documents.py).

Whether the current snapshot already holds a listing is decided on names and sizes, then on
modification times when the snapshot recorded them, and only when those differ on the
files' SHA-256: a touched but unchanged file is not new data, an edited one of the same size is.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aieng_core import asset_keys
from aieng_core.data.empty_day import has_no_data
from aieng_core.data.raw_documents import is_landed_data
from aieng_core.hashing import sha256_json, sha256_stream
from aieng_core.home import parse_partition
from aieng_core.store import Artifact, ArtifactStore
from aieng_core.store.source_paths import readable

RAW_DIR = "raw"


@dataclass(frozen=True)
class LandedFileState:
    name: str  # readable(): valid UTF-8 whatever the landed name's bytes
    path: Path
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class LandingFolder:
    partition: str
    folder: Path
    files: tuple[LandedFileState, ...]

    @property
    def digest(self) -> str:
        """Names, sizes and modification times of the data files: what a run key names."""
        return sha256_json([[f.name, f.size, f.mtime_ns] for f in self.files])[:16]


def landing_folder(home: Path, partition: str) -> LandingFolder | None:
    """The listing of one partition's landing folder, or None when it has none."""
    folder = Path(home) / RAW_DIR / partition
    try:
        entries = sorted(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return None
    files = []
    for path in entries:
        if not is_landed_data(path):
            continue
        try:
            info = path.lstat()
        except FileNotFoundError:  # removed while listed: the next look sees the folder changed
            continue
        files.append(LandedFileState(readable(path.name), path, info.st_size, info.st_mtime_ns))
    return LandingFolder(partition, folder, tuple(files))


def landing_folders(home: Path) -> tuple[list[LandingFolder], list[str]]:
    """Every landing folder named like a partition (YYYY-MM-DD), by partition, and the names
    of the other entries of raw/ (no partition can hold them: the caller says so)."""
    root = Path(home) / RAW_DIR
    if not root.is_dir():
        return [], []
    folders, strays = [], []
    for entry in sorted(os.listdir(root)):
        name = readable(entry)
        try:
            parse_partition(name)
        except ValueError:
            if not name.startswith("."):
                strays.append(name)
            continue
        try:
            found = landing_folder(home, name)
        except OSError as exc:  # one unreadable folder must not hide the others
            strays.append(f"{name} (unreadable: {exc.strerror})")
            continue
        if found is None:
            strays.append(name)  # a file named like a day, not a folder
        else:
            folders.append(found)
    return folders, strays


def snapshot_holds(snapshot: Artifact | None, listing: LandingFolder) -> bool:
    """Whether raw_documents `snapshot` is of exactly the files `listing` lists (see the module
    docstring for how that is decided without re-reading unchanged files)."""
    if snapshot is None:
        return False
    if snapshot.metrics.get("landing_folder") == "absent":
        return False  # recorded as absent; the folder exists now
    sources: list[dict[str, Any]] = snapshot.manifest.get("sources", [])
    recorded = {Path(source["path"]).name: source for source in sources}
    landed = {f.name: f for f in listing.files}
    if set(recorded) != set(landed):
        return False
    if any(recorded[name]["size"] != f.size for name, f in landed.items()):
        return False
    if all(recorded[name].get("mtime_ns") == f.mtime_ns for name, f in landed.items()):
        return True
    for name, f in landed.items():
        try:
            with open(f.path, "rb") as handle:
                sha256, _ = sha256_stream(handle)
        except OSError:
            return False
        if sha256 != recorded[name]["sha256"]:
            return False
    return True


# A landing folder that is not (yet) a partition the pipeline ingests.
BEFORE_START = "before data.start_date"
NOT_YET = "not a partition until the day ends (UTC)"  # today's folder (or a later day's) is still landing
# A landing folder against what the store made of its partition.
INGESTED = "ingested"  # the current snapshot holds exactly these files, cleaned and tokenized from it
PARTLY = "partly ingested"  # snapshotted as landed, but cleaning or tokenizing it is missing or older
EMPTIED = "emptied since ingested"  # no data files now; the snapshot keeps the day's data
CHANGED = "changed since ingested"
NOT_INGESTED = "not ingested"


def ingest_state(store: ArtifactStore, listing: LandingFolder) -> str:
    """Where `listing`'s partition stands (the constants above). The landing sensor ingests
    what is CHANGED, PARTLY or NOT_INGESTED; `aieng data status` shows the same words."""
    snapshot = store.current(asset_keys.RAW_DOCUMENTS, listing.partition)
    if snapshot is None:
        return NOT_INGESTED
    if not listing.files and not has_no_data(snapshot):
        return EMPTIED
    if not snapshot_holds(snapshot, listing):
        return CHANGED
    clean = store.current(asset_keys.CLEAN_DOCUMENTS, listing.partition)
    if clean is None or clean.input_ids(asset_keys.RAW_DOCUMENTS) != [snapshot.id]:
        return PARTLY
    if store.current(asset_keys.BPE_TOKENIZER) is not None:
        tokenized = store.current(asset_keys.TOKENIZED_DOCUMENTS, listing.partition)
        if tokenized is None or clean.id not in tokenized.input_ids(asset_keys.CLEAN_DOCUMENTS):
            return PARTLY
    return INGESTED


def calendar_state(partition: str, today: dt.date, start_date: dt.date) -> str | None:
    """BEFORE_START or NOT_YET for a folder no run may ingest (yet), None for an ingestible day:
    the first thing the landing sensor and `aieng data status` say about a folder."""
    day = dt.date.fromisoformat(partition)
    if day < start_date:
        return BEFORE_START
    if day >= today:
        return NOT_YET
    return None


def landing_state(store: ArtifactStore, listing: LandingFolder, today: dt.date, start_date: dt.date) -> str:
    """calendar_state, else ingest_state: what `aieng data status` shows per landing folder. The
    sensor says the same words, and in between one more: still settling (by its own clock)."""
    return calendar_state(listing.partition, today, start_date) or ingest_state(store, listing)
