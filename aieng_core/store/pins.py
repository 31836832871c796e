"""Pins: artifacts kept by `aieng store gc` whatever else reaches them (`aieng store pin ID
--reason TEXT`, `aieng store unpin ID`, `aieng store pins`).

One file per pin, `$AIENG_HOME/pins/<artifact_id>.json`: `{id, kind, reason, actor,
pinned_at}`, replaced atomically, so a reader never sees half of one. A pin keeps its artifact
and everything its manifest reaches, down to the raw snapshots, as every root does (store/gc.py).

A pin is written under the store's gc lock, shared (as every writer holds it): gc holds it
exclusively while it reads the pins and deletes, so a pin never names an artifact gc is
deleting; it names one that exists, or it is refused.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

from aieng_core.hashing import canonical_json
from aieng_core.store.artifacts import ArtifactNotFound, ArtifactStore, is_valid_name, validate_name
from aieng_core.store.atomic import atomic_write_bytes, fsync_path, is_temporary

PINS_DIR = "pins"  # under $AIENG_HOME
PIN_KEYS = ("id", "kind", "reason", "actor", "pinned_at")


class PinError(ValueError):
    """A pin that cannot be made, removed or read, with a message a user can act on (a
    ValueError, so `aieng` prints it as one line and exits 1)."""


def pins_dir(home: Path | str) -> Path:
    return Path(home) / PINS_DIR


def pin_path(home: Path | str, artifact_id: str) -> Path:
    return pins_dir(home) / f"{validate_name(artifact_id, 'artifact id')}.json"


def pin(store: ArtifactStore, artifact_id: str, reason: str, actor: str) -> dict[str, Any]:
    """Pin the artifact `artifact_id` (any kind); returns the pin record. Pinning a pinned
    artifact again replaces its reason and actor. Refuses an id the store does not hold
    (ArtifactNotFound) and an empty reason (PinError): a pin nobody can explain is never removed."""
    path = pin_path(store.home, artifact_id)
    if not isinstance(reason, str) or not reason.strip():
        raise PinError(f"cannot pin {artifact_id}: give the reason it must be kept (--reason TEXT)")
    if not isinstance(actor, str) or not actor:
        raise PinError(f"cannot pin {artifact_id}: actor must be a non-empty string, not {actor!r}")
    with store.writing():
        try:
            artifact = store.find(artifact_id)
        except ArtifactNotFound:
            raise ArtifactNotFound(
                f"cannot pin {artifact_id}: no artifact with that id under {store.root} "
                "(`aieng lineage ID` and `aieng store gc --dry-run --json` list the ids there are)"
            ) from None
        record = {
            "id": artifact.id,
            "kind": artifact.kind,
            "reason": reason.strip(),
            "actor": actor,
            "pinned_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        }
        atomic_write_bytes(path, canonical_json(record))
    return record


def unpin(home: Path | str, artifact_id: str) -> dict[str, Any]:
    """Remove the pin of `artifact_id`; returns the record removed. PinError when there is none."""
    path = pin_path(home, artifact_id)
    record = read_pin(path)  # a damaged pin is named, not removed unseen
    path.unlink()
    fsync_path(path.parent)
    return record


def read_pin(path: Path) -> dict[str, Any]:
    """The pin record in `path`, checked; PinError naming the file when missing or not a pin."""
    try:
        doc = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise PinError(f"{path.stem} is not pinned (no {path}); `aieng store pins` lists the pins") from None
    except (OSError, ValueError) as exc:
        raise PinError(f"{path}: unreadable pin: {exc}; repair or remove it by hand") from None
    problem = _pin_problem(doc, path.stem)
    if problem is not None:
        raise PinError(f"{path}: not a pin ({problem}); repair or remove it by hand")
    return doc


def _pin_problem(doc: Any, artifact_id: str) -> str | None:
    if not isinstance(doc, dict):
        return "not a JSON object"
    missing = [key for key in PIN_KEYS if not isinstance(doc.get(key), str)]
    if missing:
        return f"{', '.join(missing)} missing or not strings"
    if doc["id"] != artifact_id:
        return f"names id {doc['id']!r}, not {artifact_id!r}"
    if not is_valid_name(doc["kind"]):
        return f"kind {doc['kind']!r} is not a valid artifact kind"
    return None


def pins(home: Path | str) -> list[dict[str, Any]]:
    """Every pin, by artifact id. A damaged pin file raises PinError naming it: gc cannot tell
    what it keeps."""
    directory = pins_dir(home)
    if not directory.is_dir():
        return []
    found = []
    for name in sorted(os.listdir(directory)):
        if is_temporary(name):  # a pin being written, or one a killed writer left (store verify --gc)
            continue
        path = directory / name
        if not name.endswith(".json") or not is_valid_name(path.stem):
            raise PinError(f"{path}: not a pin file (pins/ holds <artifact_id>.json only); move it elsewhere")
        found.append(read_pin(path))
    return found
