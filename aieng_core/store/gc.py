"""`aieng store gc`: retention by reachability. Delete only what no root reaches.

Roots:
- every deployment pointer's current bundle (store/pointers.py reads them, as every reader does);
- every bundle its stack can roll back to, the top `rollback_depth` entries (None: all of them);
- every pin (store/pins.py);
- every ref, refs/<asset>/<partition>.json: the current artifact of each asset and partition;
- every artifact whose manifest's created_at is newer than `keep_newer_than`: what a step is
  about to build from may not be named by a ref yet (it read the ref, a newer build replaced it).

A root keeps everything its manifest reaches through `inputs`, down to the raw snapshots. An
input gone from the store cannot be followed: it is reported, not an error.

Safety:
- gc holds the store's gc lock (work/locks/store-gc.lock) exclusively for the whole run;
  writers hold it shared while an artifact is in the store but no ref names it yet
  (ArtifactStore.writing), so gc never sees one in that moment. Pins are written under it too.
- An artifact a live writer or server holds (ArtifactStore.hold: a shared flock on its
  manifest.json; a build holds its inputs, a server its bundle, a promote its bundle) is skipped
  and reported as `held`: gc takes an exclusive flock on the manifest without waiting.
- Deletion is atomic per artifact: the directory is renamed to artifacts/<kind>/.gc-<id>-<time>
  (a name no reader takes for an artifact), the rename fsynced, then the files removed. A kill
  at any moment leaves whole artifacts and, at most, one `.gc-*` directory, which the next run
  removes first (`aieng store verify` lists it, not as damage).
- gc refuses to run (GcRefused, nothing deleted) when it cannot tell what a root keeps: a
  damaged pointer, ref or pin, or a manifest it cannot read that a root reaches. An artifact
  whose manifest is unreadable is never deleted (reported; `aieng store verify` names the damage).
- It never touches raw/, work/, deployments/, staging (`.*.tmp-*`) or damaged copies set aside.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aieng_core.asset_keys import SERVING_BUNDLE
from aieng_core.faults import crash_point
from aieng_core.store.artifacts import (
    MANIFEST,
    UNPARTITIONED,
    ArtifactIntegrityError,
    ArtifactStore,
    is_valid_name,
    walk_tree,
)
from aieng_core.store.atomic import fsync_path
from aieng_core.store.file_lock import exclusive_lock, try_exclusive
from aieng_core.store.pins import pins
from aieng_core.store.pointers import DeploymentStateError, Pointer, pointer_names

GC_PREFIX = ".gc-"  # artifacts/<kind>/.gc-<id>-<time>: an artifact being deleted, never one to read
DEFAULT_KEEP_NEWER_THAN = dt.timedelta(days=7)
Key = tuple[str, str]  # (kind, id)


class GcRefused(ValueError):
    """gc cannot tell what a root keeps; nothing was deleted."""


def collect_garbage(
    home: Path | str,
    dry_run: bool = False,
    keep_newer_than: dt.timedelta = DEFAULT_KEEP_NEWER_THAN,
    rollback_depth: int | None = None,
    now: dt.datetime | None = None,
    on_wait: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Delete (with `dry_run`: list) every artifact no root reaches. `{home, dry_run, roots:
    {pointers, rollback, pins, refs, recent}, kept, deleted: [{kind, id, bytes}], held,
    unreadable, missing_inputs, bytes_freed, leftovers_removed}`; see the module docstring.
    `on_wait` is called once if writers hold the gc lock and gc waits for them."""
    home = Path(home)
    if not home.is_dir():
        raise FileNotFoundError(f"AIENG_HOME {home} does not exist (set AIENG_HOME or --home)")
    if rollback_depth is not None and rollback_depth < 0:
        raise ValueError(f"rollback_depth must be at least 0 (or None: the whole stack), not {rollback_depth}")
    now = now if now is not None else dt.datetime.now(dt.UTC)
    store = ArtifactStore(home)
    with exclusive_lock(store.gc_lock, on_wait=on_wait):
        leftovers = _leftovers(store)
        if not dry_run:
            for path in leftovers:  # no other gc runs (we hold its lock): each was left by a killed one
                _remove_tree(path)
        manifests, unreadable = _scan(store)
        roots = _roots(store, manifests, now - keep_newer_than, rollback_depth)
        kept, missing = _closure(roots, manifests, {(item["kind"], item["id"]) for item in unreadable})
        deleted, held = [], []
        for kind, artifact_id in sorted(set(manifests) - kept):
            entry = {"kind": kind, "id": artifact_id, "bytes": _bytes(store.root / kind / artifact_id)}
            if _delete(store, kind, artifact_id, dry_run):
                deleted.append(entry)
                crash_point("gc.deleted")
            else:
                held.append(entry)
    return {
        "home": str(home),
        "dry_run": dry_run,
        "keep_newer_than_s": keep_newer_than.total_seconds(),
        "rollback_depth": rollback_depth,
        "roots": roots,
        "kept": [{"kind": kind, "id": artifact_id} for kind, artifact_id in sorted(kept)],
        "deleted": deleted,
        "held": held,
        "unreadable": unreadable,
        "missing_inputs": missing,
        "bytes_freed": sum(entry["bytes"] for entry in deleted),
        "leftovers_removed": [str(path) for path in leftovers],
    }


# ---- what is in the store ---------------------------------------------------------------------
def _artifact_dirs(store: ArtifactStore) -> list[tuple[str, Path]]:
    """(kind, directory) of every entry of artifacts/<kind>/ that is named as an artifact."""
    found: list[tuple[str, Path]] = []
    if not store.root.is_dir():
        return found
    for kind_dir in sorted(store.root.iterdir()):
        if is_valid_name(kind_dir.name) and _is_real_dir(kind_dir):
            found += [(kind_dir.name, entry) for entry in sorted(kind_dir.iterdir())]
    return found


def _leftovers(store: ArtifactStore) -> list[Path]:
    return [path for _, path in _artifact_dirs(store) if path.name.startswith(GC_PREFIX) and _is_real_dir(path)]


def _scan(store: ArtifactStore) -> tuple[dict[Key, dict[str, Any]], list[dict[str, Any]]]:
    """(the checked manifest of every artifact, the artifacts whose manifest gc cannot use)."""
    manifests: dict[Key, dict[str, Any]] = {}
    unreadable: list[dict[str, Any]] = []
    for kind, path in _artifact_dirs(store):
        if not (is_valid_name(path.name) and _is_real_dir(path)):
            continue  # staging, damaged copies set aside, gc's own leftovers, strays: never ours to delete
        problem = None
        try:
            manifest = store.get(kind, path.name).manifest
            problem = _manifest_problem(manifest, kind, path.name)
        except (ArtifactIntegrityError, LookupError) as exc:  # unreadable, or no manifest at all
            problem = str(exc)
        if problem is None:
            manifests[(kind, path.name)] = manifest
        else:
            unreadable.append({"kind": kind, "id": path.name, "path": str(path), "problem": problem})
    return manifests, unreadable


def _manifest_problem(manifest: Any, kind: str, artifact_id: str) -> str | None:
    if not isinstance(manifest, dict):
        return "manifest is not a JSON object"
    if (manifest.get("kind"), manifest.get("id")) != (kind, artifact_id):
        return f"manifest names {manifest.get('kind')} {manifest.get('id')}, not {kind} {artifact_id}"
    inputs = manifest.get("inputs", [])
    if not isinstance(inputs, list) or not all(
        isinstance(item, dict) and all(isinstance(item.get(k), str) and is_valid_name(item[k]) for k in ("kind", "id"))
        for item in inputs
    ):
        return "manifest 'inputs' is not a list of {kind, id}"
    if _created_at(manifest) is None:
        return f"manifest created_at {manifest.get('created_at')!r} is not an ISO date and time"
    return None


def _created_at(manifest: dict[str, Any]) -> dt.datetime | None:
    value = manifest.get("created_at")
    try:
        moment = dt.datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None
    if moment is not None and moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment


# ---- what must stay ---------------------------------------------------------------------------
def _roots(
    store: ArtifactStore, manifests: dict[Key, dict[str, Any]], cutoff: dt.datetime, depth: int | None
) -> dict[str, list[dict[str, Any]]]:
    def in_store(kind: str, artifact_id: str) -> bool:
        return (store.root / kind / artifact_id).is_dir()

    pointers, rollback = [], []
    for name in pointer_names(store.home):
        try:
            current = Pointer(store.home, name).current()
        except DeploymentStateError as exc:
            raise GcRefused(f"gc cannot tell which bundles {name} serves or rolls back to: {exc}") from None
        if current["bundle_id"] is not None:
            bundle = current["bundle_id"]
            pointers.append({"pointer": name, "bundle_id": bundle, "in_store": in_store(SERVING_BUNDLE, bundle)})
        for position, bundle in enumerate(reversed(current["stack"]), start=1):  # 1: the top of the stack
            if depth is None or position <= depth:
                rollback.append(
                    {
                        "pointer": name,
                        "bundle_id": bundle,
                        "position": position,
                        "in_store": in_store(SERVING_BUNDLE, bundle),
                    }
                )
    try:
        pinned = [
            {"kind": p["kind"], "id": p["id"], "reason": p["reason"], "in_store": in_store(p["kind"], p["id"])}
            for p in pins(store.home)
        ]
    except ValueError as exc:
        raise GcRefused(f"gc cannot tell what the pins keep: {exc}") from None
    refs = [{**ref, "in_store": in_store(ref["kind"], ref["id"])} for ref in _refs(store)]
    recent = [
        {"kind": kind, "id": artifact_id, "created_at": manifest["created_at"]}
        for (kind, artifact_id), manifest in sorted(manifests.items())
        if (_created_at(manifest) or cutoff) > cutoff
    ]
    return {"pointers": pointers, "rollback": rollback, "pins": pinned, "refs": refs, "recent": recent}


def _refs(store: ArtifactStore) -> list[dict[str, Any]]:
    """`{kind, partition, id}` of every ref, read as ArtifactStore.current reads it."""
    found: list[dict[str, Any]] = []
    if not store.refs.is_dir():
        return found
    for kind_dir in sorted(store.refs.iterdir()):
        if not (is_valid_name(kind_dir.name) and _is_real_dir(kind_dir)):
            continue
        partitions: list[str | None] = list(store.current_partitions(kind_dir.name))
        if (kind_dir / f"{UNPARTITIONED}.json").is_file():
            partitions.append(None)
        for partition in partitions:
            ref = kind_dir / f"{partition or UNPARTITIONED}.json"
            try:
                record = json.loads(ref.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise GcRefused(f"gc cannot tell what {ref} keeps: unreadable: {exc}") from None
            artifact_id = record.get("id") if isinstance(record, dict) else None
            if not (isinstance(artifact_id, str) and is_valid_name(artifact_id)):
                raise GcRefused(f"gc cannot tell what {ref} keeps: id {artifact_id!r} is not an artifact id")
            found.append({"kind": kind_dir.name, "partition": partition, "id": artifact_id})
    return found


def _closure(
    roots: dict[str, list[dict[str, Any]]], manifests: dict[Key, dict[str, Any]], unreadable: set[Key]
) -> tuple[set[Key], list[dict[str, Any]]]:
    """(every artifact a root reaches through manifest inputs, the inputs missing from the store)."""
    pending: list[tuple[Key, str | None]] = []  # (artifact, the artifact whose input it is)
    for entry in roots["pointers"] + roots["rollback"]:
        pending.append(((SERVING_BUNDLE, entry["bundle_id"]), None))
    for entry in roots["pins"] + roots["refs"] + roots["recent"]:
        pending.append(((entry["kind"], entry["id"]), None))
    kept: set[Key] = set()
    missing: list[dict[str, Any]] = []
    while pending:
        key, needed_by = pending.pop()
        if key in kept:
            continue
        if key in unreadable:
            raise GcRefused(
                f"gc cannot tell what {key[0]} {key[1]} needs: its manifest is unreadable, and "
                f"{'a root' if needed_by is None else needed_by} reaches it; restore it (or move it aside "
                "as .damaged-<id>) first: `aieng store verify` names the damage"
            )
        if key not in manifests:
            if needed_by is not None:  # a root gone from the store is reported with the root
                missing.append({"kind": key[0], "id": key[1], "needed_by": needed_by})
            continue
        kept.add(key)
        pending += [((item["kind"], item["id"]), f"{key[0]} {key[1]}") for item in manifests[key].get("inputs", [])]
    return kept, sorted(missing, key=lambda item: (item["kind"], item["id"], item["needed_by"]))


# ---- deleting ---------------------------------------------------------------------------------
def _delete(store: ArtifactStore, kind: str, artifact_id: str, dry_run: bool) -> bool:
    """Delete one artifact atomically (with `dry_run`: only see whether it could be); False
    when a live writer or server holds it, which is left alone."""
    path = store.root / kind / artifact_id
    fd = try_exclusive(path / MANIFEST)
    if fd is None:
        return False
    try:
        if dry_run:
            return True
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
        aside = path.parent / f"{GC_PREFIX}{artifact_id}-{stamp}"
        os.rename(path, aside)
        fsync_path(path.parent)  # the rename survives a crash: never a half artifact under its id
        crash_point("gc.renamed")
    finally:
        os.close(fd)  # a hold waiting on it now finds the manifest gone
    _remove_tree(aside)
    return True


def _remove_tree(root: Path) -> None:
    """Remove `root` and everything under it, links included, never following one."""
    for directory, dirnames, filenames in os.walk(root, topdown=False):
        here = Path(directory)
        for name in filenames:
            (here / name).unlink()
            crash_point("gc.file_removed")
        for name in dirnames:
            child = here / name
            if child.is_symlink():
                child.unlink()
            else:
                child.rmdir()
    root.rmdir()


def _bytes(path: Path) -> int:
    return sum(info.st_size for _, _, info in walk_tree(path) if stat.S_ISREG(info.st_mode))


def _is_real_dir(path: Path) -> bool:
    return stat.S_ISDIR(path.lstat().st_mode)


# ---- output -----------------------------------------------------------------------------------
def format_gc(result: dict[str, Any]) -> str:
    verb = "would delete" if result["dry_run"] else "deleted"
    lines = [f"  {verb} {item['kind']} {item['id']} ({item['bytes']:,} bytes)" for item in result["deleted"]]
    lines += [f"  held {item['kind']} {item['id']}: a live writer or server holds it; kept" for item in result["held"]]
    lines += [f"  unreadable {item['kind']} {item['id']}: {item['problem']}; kept" for item in result["unreadable"]]
    lines += [
        f"  missing input {item['kind']} {item['id']} of {item['needed_by']}: not in the store"
        for item in result["missing_inputs"]
    ]
    removing = "would remove" if result["dry_run"] else "removed"
    lines += [f"  {removing} what a stopped gc left: {path}" for path in result["leftovers_removed"]]
    roots = result["roots"]
    counts = ", ".join(f"{len(roots[name])} {name}" for name in ("pointers", "rollback", "pins", "refs", "recent"))
    would = "would be " if result["dry_run"] else ""
    summary = (
        f"store gc {result['home']}{' (dry run)' if result['dry_run'] else ''}: {len(result['deleted'])} artifacts "
        f"{would}deleted, {result['bytes_freed']:,} bytes {would}freed; {len(result['kept'])} kept, reached from "
        f"roots ({counts}); {len(result['held'])} held, {len(result['unreadable'])} unreadable"
    )
    return "\n".join([*lines, summary])
