"""`aieng store verify`: is everything in $AIENG_HOME whole, and what did crashed writers leave?

- Every artifact under artifacts/<kind>/<id>/ is re-hashed against its manifest
  (ArtifactStore.verify); a directory without a readable manifest, or whose manifest names
  another kind or id, is damaged too.
- Every ref (refs/<kind>/<partition>.json) and every deployment pointer
  (deployments/<pointer>/: its current.json and history.jsonl, read by store/pointers.py as
  every other reader reads them) must be valid and name an artifact that exists and is intact.
- Every bundle a deployment pointer serves or can roll back to (its current bundle and every
  entry of its stack) must be in the store and intact: `deployments` lists each,
  `{pointer, bundle_id, role: current|rollback, position, ok, problem}`, `position` being how
  many rollbacks make it current (0: the current one, 1: the top of the stack), `problem`
  naming the damaged or missing file.
- Staging left beside targets (`.<name>.tmp-XXXXXXXX` directories and files: artifacts,
  refs, training checkpoints, deployment pointers, gate reports) is listed with whether a
  live writer still owns it; `gc=True` removes those none does (store/atomic.py says how
  ownership is decided).

Damage (a damaged artifact, a bad ref) makes `ok` false. Staging that no live writer owns is a
warning, not damage: atomic writes make it invisible to every reader, it only takes space.
Damaged copies that a rebuild moved aside (`.damaged-<id>-<time>`) are listed, never removed.
What a killed `aieng store gc` left (`.gc-<id>-<time>`: an artifact it had begun deleting, no
longer an artifact to any reader) is listed as `gc_leftovers`, not as damage; the next gc
removes it.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from aieng_core import asset_keys
from aieng_core.store.artifacts import (
    MANIFEST,
    UNPARTITIONED,
    ArtifactIntegrityError,
    ArtifactNotFound,
    ArtifactStore,
    is_valid_name,
)
from aieng_core.store.atomic import LOCK_SUFFIX, is_temporary, owner_alive, remove_if_abandoned
from aieng_core.store.gc import GC_PREFIX
from aieng_core.store.pins import PINS_DIR
from aieng_core.store.pointers import DEPLOYMENTS_DIR, DeploymentStateError, Pointer, pointer_names
from aieng_core.store.recipes import RECIPES_DIR

# The directories of $AIENG_HOME that aieng writes with atomic writes (raw/ is the landing
# folder, written by programs we do not own; a DAGSTER_HOME inside the home is Dagster's).
STATE_DIRS = ("artifacts", "refs", "work", DEPLOYMENTS_DIR, PINS_DIR, RECIPES_DIR)
SET_ASIDE_PREFIX = ".damaged-"
BUNDLE_KIND = asset_keys.SERVING_BUNDLE


def verify_store(home: Path, gc: bool = False) -> dict[str, Any]:
    """`{ok, home, artifacts_checked, damaged, bad_refs, deployments, staging, removed,
    stale_staging, set_aside, gc_leftovers, unexpected}`; see the module docstring."""
    home = Path(home)
    if not home.is_dir():
        raise FileNotFoundError(f"AIENG_HOME {home} does not exist (set AIENG_HOME or --home)")
    store = ArtifactStore(home)
    damaged, intact, set_aside, unexpected = _check_artifacts(store)
    gc_leftovers = [path for path in set_aside if Path(path).name.startswith(GC_PREFIX)]
    set_aside = [path for path in set_aside if path not in gc_leftovers]
    bad_refs = _check_refs(store, intact, unexpected) + _check_pointers(store, intact)
    deployments = _check_deployed_bundles(store, damaged)
    staging: list[dict[str, Any]] = [
        {"path": str(path), "type": "directory" if path.is_dir() else "file", "owner_alive": owner_alive(path)}
        for path in find_staging(home)
    ]
    removed = [entry["path"] for entry in staging if gc and remove_if_abandoned(Path(entry["path"]))]
    return {
        "ok": not damaged and not bad_refs and all(entry["ok"] for entry in deployments),
        "home": str(home),
        "artifacts_checked": len(damaged) + len(intact),
        "damaged": damaged,
        "bad_refs": bad_refs,
        "deployments": deployments,
        "staging": staging,
        "removed": removed,
        # What is left that no live writer owns: zero after --gc (unless a writer died meanwhile).
        "stale_staging": sum(1 for e in staging if not e["owner_alive"] and e["path"] not in removed),
        "set_aside": set_aside,
        "gc_leftovers": gc_leftovers,
        "unexpected": unexpected,
    }


def _check_artifacts(
    store: ArtifactStore,
) -> tuple[list[dict[str, Any]], set[tuple[str, str]], list[str], list[str]]:
    damaged: list[dict[str, Any]] = []
    intact: set[tuple[str, str]] = set()
    set_aside: list[str] = []
    unexpected: list[str] = []
    if not store.root.is_dir():
        return damaged, intact, set_aside, unexpected
    for kind_dir in sorted(store.root.iterdir()):
        if not (is_valid_name(kind_dir.name) and _is_real_dir(kind_dir)):
            unexpected.append(str(kind_dir))
            continue
        for entry in sorted(kind_dir.iterdir()):
            if is_temporary(entry.name):
                continue  # staging: find_staging lists it
            if entry.name.startswith((SET_ASIDE_PREFIX, GC_PREFIX)):
                set_aside.append(str(entry))  # verify_store splits off gc's leftovers
            elif not (is_valid_name(entry.name) and _is_real_dir(entry)):
                unexpected.append(str(entry))
            else:
                problems = _artifact_problems(store, kind_dir.name, entry.name)
                if problems:
                    damaged.append({"kind": kind_dir.name, "id": entry.name, "path": str(entry), "problems": problems})
                else:
                    intact.add((kind_dir.name, entry.name))
    return damaged, intact, set_aside, unexpected


def _artifact_problems(store: ArtifactStore, kind: str, artifact_id: str) -> list[str]:
    try:
        artifact = store.get(kind, artifact_id)
    except ArtifactNotFound:
        return [f"{store.artifact_dir(kind, artifact_id) / MANIFEST}: missing (never written completely)"]
    except ArtifactIntegrityError as exc:
        return [str(exc)]
    manifest = artifact.manifest
    if not isinstance(manifest, dict):
        return [f"{artifact.path / MANIFEST}: not a JSON object"]
    named = (manifest.get("kind"), manifest.get("id"))
    if named != (kind, artifact_id):
        return [f"{artifact.path / MANIFEST}: names {named[0]} {named[1]}, not {kind} {artifact_id}"]
    return store.verify(artifact)


def _check_refs(store: ArtifactStore, intact: set[tuple[str, str]], unexpected: list[str]) -> list[dict[str, Any]]:
    bad: list[dict[str, Any]] = []
    if not store.refs.is_dir():
        return bad
    for kind_dir in sorted(store.refs.iterdir()):
        if not (is_valid_name(kind_dir.name) and _is_real_dir(kind_dir)):
            unexpected.append(str(kind_dir))
            continue
        for ref in sorted(kind_dir.iterdir()):
            if is_temporary(ref.name):
                continue
            stem = ref.name.removesuffix(".json")
            if not ref.name.endswith(".json") or not (stem == UNPARTITIONED or is_valid_name(stem)):
                unexpected.append(str(ref))
                continue
            partition = None if stem == UNPARTITIONED else stem
            problem, artifact_id = _ref_problem(store, kind_dir.name, partition, intact)
            if problem is not None:
                bad.append(
                    {
                        "ref": str(ref),
                        "kind": kind_dir.name,
                        "partition": partition,
                        "id": artifact_id,
                        "problem": problem,
                    }
                )
    return bad


def _ref_problem(
    store: ArtifactStore, kind: str, partition: str | None, intact: set[tuple[str, str]]
) -> tuple[str | None, Any]:
    """(why the ref is bad or None, the id it names)."""
    ref = store.refs / kind / f"{partition or UNPARTITIONED}.json"
    try:
        record = json.loads(ref.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"unreadable: {exc}", None
    artifact_id = record.get("id") if isinstance(record, dict) else None
    try:
        artifact = store.current(kind, partition)
    except (ArtifactNotFound, ArtifactIntegrityError) as exc:  # a bad id, or no such artifact
        return str(exc), artifact_id
    if artifact is None:
        return "vanished while being checked", artifact_id
    if (kind, artifact.id) not in intact:
        return f"points at {kind} {artifact.id}, which is damaged", artifact_id
    return None, artifact_id


def _check_pointers(store: ArtifactStore, intact: set[tuple[str, str]]) -> list[dict[str, Any]]:
    """Each deployment pointer's files must be valid (read as every other reader reads them)
    and name an intact serving_bundle, or nothing."""
    bad: list[dict[str, Any]] = []
    for name in pointer_names(store.home):
        pointer = Pointer(store.home, name)

        def bad_file(path: Path, problem: str, bundle_id: str | None = None) -> None:
            bad.append({"ref": str(path), "kind": BUNDLE_KIND, "partition": None, "id": bundle_id, "problem": problem})

        try:
            bundle_id = pointer.current()["bundle_id"]
        except DeploymentStateError as exc:
            bad_file(pointer.current_path, str(exc))
        else:
            if bundle_id is not None and (BUNDLE_KIND, bundle_id) not in intact:
                exists = (store.root / BUNDLE_KIND / bundle_id).is_dir()
                problem = f"{BUNDLE_KIND} {bundle_id} is {'damaged' if exists else 'not in the store'}"
                bad_file(pointer.current_path, problem, bundle_id)
        try:
            pointer.read_history(warn=False)
        except DeploymentStateError as exc:
            bad_file(pointer.history_path, str(exc))
    return bad


def _check_deployed_bundles(store: ArtifactStore, damaged: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each pointer's current bundle and every bundle of its stack (the history can roll back
    to each): in the store, and re-hashed intact (by _check_artifacts). A pointer whose
    current.json is damaged has no stack to read: _check_pointers reports it."""
    problems = {item["id"]: item["problems"] for item in damaged if item["kind"] == BUNDLE_KIND}
    entries: list[dict[str, Any]] = []
    for name in pointer_names(store.home):
        try:
            current = Pointer(store.home, name).current()
        except DeploymentStateError:
            continue
        reachable = [] if current["bundle_id"] is None else [(0, current["bundle_id"])]
        reachable += list(enumerate(reversed(current["stack"]), start=1))  # 1: the top of the stack
        for position, bundle_id in reachable:
            directory = store.root / BUNDLE_KIND / bundle_id
            problem = None
            if bundle_id in problems:
                found = problems[bundle_id]
                problem = found[0] + (f" (and {len(found) - 1} more problems)" if len(found) > 1 else "")
            elif not directory.is_dir():
                problem = f"{directory / MANIFEST}: missing ({BUNDLE_KIND} {bundle_id} is not in the store)"
            entries.append(
                {
                    "pointer": name,
                    "bundle_id": bundle_id,
                    "role": "current" if position == 0 else "rollback",
                    "position": position,
                    "ok": problem is None,
                    "problem": problem,
                }
            )
    return entries


def find_staging(home: Path) -> list[Path]:
    """Every staging directory and temporary file under the state directories, sorted. Artifact
    directories are not entered (a stray file in one is verify()'s to report), nor staging."""
    found = []
    for top in STATE_DIRS:
        for directory, dirnames, filenames in os.walk(home / top):
            here = Path(directory)
            # A staging directory's lock file is listed with its directory, not apart.
            found += [
                here / name
                for name in filenames
                if is_temporary(name)
                and not (name.endswith(LOCK_SUFFIX) and name.removesuffix(LOCK_SUFFIX) in dirnames)
            ]
            for name in list(dirnames):
                if is_temporary(name):
                    found.append(here / name)
                    dirnames.remove(name)
                elif top == "artifacts" and here.parent == home / top:
                    dirnames.remove(name)  # artifacts/<kind>/<id>: an artifact, or a damaged copy
    return sorted(found)


def _is_real_dir(path: Path) -> bool:
    return stat.S_ISDIR(path.lstat().st_mode)


def format_verify(result: dict[str, Any]) -> str:
    lines = [
        f"store {result['home']}: {'OK' if result['ok'] else 'DAMAGED'}: {result['artifacts_checked']} artifacts "
        f"re-hashed, {len(result['damaged'])} damaged, {len(result['bad_refs'])} bad refs"
    ]
    for item in result["damaged"]:
        lines.append(f"  DAMAGED {item['kind']} {item['id']}: {item['path']}")
        lines += [f"    {problem}" for problem in item["problems"]]
    for ref in result["bad_refs"]:
        lines.append(f"  BAD REF {ref['ref']}: {ref['problem']}")
    deployments = result["deployments"]
    if deployments:
        bad = [entry for entry in deployments if not entry["ok"]]
        pointers = len({entry["pointer"] for entry in deployments})
        lines.append(
            f"  deployments: {len(deployments)} bundles served or reachable by rollback on {pointers} pointers, "
            f"{len(bad)} damaged or missing"
        )
        for entry in bad:
            where = "current" if entry["role"] == "current" else f"rollback target {entry['position']}"
            lines.append(f"  DEPLOYMENT {entry['pointer']} {where} {entry['bundle_id']}: {entry['problem']}")
    for entry in result["staging"]:
        if entry["path"] in result["removed"]:
            state = "removed (no live writer)"
        elif entry["owner_alive"]:
            state = "a live writer owns it"
        else:
            state = "stale: no live writer (`aieng store verify --gc` removes it)"
        lines.append(f"  staging {entry['type']} {entry['path']}: {state}")
    if result["stale_staging"]:
        lines.append(f"WARNING: {result['stale_staging']} stale staging entries left by writers that died")
    lines += [f"  damaged copy set aside (kept for inspection): {path}" for path in result["set_aside"]]
    lines += [
        f"  left by a gc that was stopped (not an artifact; the next `aieng store gc` removes it): {path}"
        for path in result["gc_leftovers"]
    ]
    lines += [f"  WARNING: not something aieng writes here: {path}" for path in result["unexpected"]]
    return "\n".join(lines)
