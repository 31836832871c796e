"""Walking manifest `inputs`: up from an artifact to the raw snapshots it was built from, and
down from a partition or a landed file to everything built from it, deployments included.

Every manifest names its inputs by (kind, id); following them recursively reaches every
artifact that decided its bytes, down to raw_documents, whose manifests list the landed
files' hashes. `aieng lineage` and the serving bundle's lineage summary both start here.
Going down, one pass over every manifest in the store builds the reverse edges
(`index_store`), so the answer costs one read per artifact however large the store.

Deployment state is read through store/pointers.py, the one reader of a pointer's files:
`current` means the bundle the production pointer names. Going down, every pointer's applied
history gives the intervals each bundle served on it (`served_intervals`).

A bundle's data version (`bundle_data_version`) is the content hash (`content_sha256`) of the
dataset_manifest its lineage summary names: the hash Dagster records as that asset's
DataVersion, which the same data gives on any machine. The dataset_manifest's artifact id is
not used: it is derived from its recipe (inputs' ids, code version, config), not its content.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aieng_core import asset_keys
from aieng_core.hashing import sha256_file
from aieng_core.home import parse_partition
from aieng_core.store.artifacts import (
    MANIFEST,
    Artifact,
    ArtifactIntegrityError,
    ArtifactNotFound,
    ArtifactStore,
    InvalidArtifactName,
    is_valid_name,
)
from aieng_core.store.pointers import PRODUCTION, DeploymentStateError, Pointer, pointer_names
from aieng_core.store.source_paths import readable


def upstream(store: ArtifactStore, artifact: Artifact) -> list[Artifact]:
    """Every artifact `artifact` was built from, directly or not, each once, nearest first
    (breadth-first, inputs in manifest order). An input missing from the store raises
    ArtifactNotFound naming it: a chain with a hole is not a lineage."""
    seen = {(artifact.kind, artifact.id)}
    found: list[Artifact] = []
    frontier = [artifact]
    while frontier:
        next_frontier = []
        for node in frontier:
            for item in node.manifest.get("inputs", []):
                key = (item["kind"], item["id"])
                if key in seen:
                    continue
                seen.add(key)
                parent = store.get(*key)
                found.append(parent)
                next_frontier.append(parent)
        frontier = next_frontier
    return found


def lineage_summary(store: ArtifactStore, artifact: Artifact) -> dict[str, Any]:
    """The ids an incident responder asks for first: which model, dataset and tokenizer,
    which daily partitions, and how many landed files they came from."""
    chain = [artifact, *upstream(store, artifact)]

    def ids(kind: str) -> list[str]:
        return [a.id for a in chain if a.kind == kind]

    def single(kind: str) -> str | None:
        found = ids(kind)
        return found[0] if len(found) == 1 else None

    raw = [a for a in chain if a.kind == asset_keys.RAW_DOCUMENTS]
    return {
        asset_keys.MODEL_CHECKPOINT: single(asset_keys.MODEL_CHECKPOINT),
        asset_keys.DATASET_MANIFEST: single(asset_keys.DATASET_MANIFEST),
        asset_keys.BPE_TOKENIZER: single(asset_keys.BPE_TOKENIZER),
        "partitions": sorted({a.manifest["partition"] for a in raw if a.manifest.get("partition")}),
        "raw_documents": sorted(a.id for a in raw),
        "raw_source_files": sum(len(a.manifest.get("sources", [])) for a in raw),
        "artifacts": len(chain),  # `artifact` and everything upstream of it
    }


def bundle_store(bundle_path: Path | str) -> ArtifactStore | None:
    """The store holding the bundle directory at `bundle_path`
    (`<home>/artifacts/serving_bundle/<id>/`), or None for a bundle outside a store."""
    path = Path(os.path.abspath(bundle_path))
    if path.parent.name == asset_keys.SERVING_BUNDLE and path.parent.parent.name == "artifacts":
        return ArtifactStore(path.parents[2])
    return None


def bundle_data_version(store: ArtifactStore | None, bundle_manifest: dict[str, Any]) -> str | None:
    """The content hash of the dataset_manifest a bundle was trained on (its manifest's
    lineage summary names it), as that artifact's manifest records it; None when the bundle
    names none, or `store` (None: no store) does not hold it readable."""
    lineage = bundle_manifest.get("lineage")
    dataset_id = lineage.get(asset_keys.DATASET_MANIFEST) if isinstance(lineage, dict) else None
    if store is None or not isinstance(dataset_id, str):
        return None
    try:
        dataset = store.get(asset_keys.DATASET_MANIFEST, dataset_id)
    except (ArtifactNotFound, ArtifactIntegrityError, InvalidArtifactName):
        return None
    value = dataset.manifest.get("content_sha256")
    return value if isinstance(value, str) and value else None


# ---- the whole chain of one artifact ----------------------------------------------------------

# Provenance records a commit built from a checkout with uncommitted changes as "<sha>-dirty".
DIRTY_SUFFIX = "-dirty"


def git_state(git_commit: Any) -> tuple[str | None, bool | None]:
    """(commit, dirty) from a manifest's `git_commit`: dirty is None when no commit was recorded."""
    if not isinstance(git_commit, str) or not git_commit:
        return None, None
    if git_commit.endswith(DIRTY_SUFFIX):
        return git_commit[: -len(DIRTY_SUFFIX)], True
    return git_commit, False


def node(artifact: Artifact) -> dict[str, Any]:
    """An artifact as `aieng lineage --json` lists it: its manifest plus its `path`."""
    return {**artifact.manifest, "path": str(artifact.path)}


def lineage_graph(store: ArtifactStore, artifact: Artifact) -> dict[str, Any]:
    """`{"root": id, "nodes": {id: manifest + {"path"}}}`: `artifact` and everything upstream
    of it (`upstream`, so a missing input raises ArtifactNotFound naming it). The edges are
    each node's manifest `inputs`."""
    nodes = {artifact.id: node(artifact)}
    for parent in upstream(store, artifact):
        if parent.id in nodes:  # ids hash their kind, so two kinds sharing one is a forged manifest
            raise ArtifactIntegrityError(f"two artifacts in the lineage of {artifact.id} share the id {parent.id}")
        nodes[parent.id] = node(parent)
    return {"root": artifact.id, "nodes": nodes}


# ---- deployment state (store/pointers.py: only the production pointer serves) ------------------


class NothingDeployed(ArtifactNotFound):
    """`current` was asked for, and the pointer names no bundle."""


def deployed_bundle(store: ArtifactStore, pointer: str = PRODUCTION) -> tuple[Artifact, dict[str, Any]]:
    """The serving bundle `pointer` points at, and its deployment state with `events`: the
    pointer's history events that made it current (`to` is the bundle)."""
    files = Pointer(store.home, pointer)
    state, history = files.applied()
    if state["bundle_id"] is None:
        raise NothingDeployed(
            f"nothing is deployed to {pointer} "
            f"({files.current_path} {'names no bundle' if state['sequence'] else 'does not exist'}); "
            "deploy one with `aieng deploy promote BUNDLE_ID`, or ask for a given artifact with "
            "`aieng lineage ARTIFACT_ID`"
        )
    bundle_id = state["bundle_id"]
    try:
        bundle = store.get(asset_keys.SERVING_BUNDLE, bundle_id)
    except ArtifactNotFound as exc:
        raise ArtifactNotFound(f"the {pointer} deployment points at serving_bundle {bundle_id!r}: {exc}") from None
    events = [e for e in history if e["to"] == bundle_id]
    return bundle, {**state, "events": events}


# ---- everything downstream of a partition or a landed file ------------------------------------

# The graph's order (docs/index.md, "The asset graph"), for listing; kinds not named here come after, by name.
GRAPH_ORDER = (
    asset_keys.RAW_DOCUMENTS,
    asset_keys.CLEAN_DOCUMENTS,
    asset_keys.BPE_TOKENIZER,
    asset_keys.TOKENIZED_DOCUMENTS,
    asset_keys.DATASET_MANIFEST,
    asset_keys.MODEL_CHECKPOINT,
    asset_keys.BENCHMARK_REPORT,
    asset_keys.SERVING_BUNDLE,
)
PARTITION_LIKE = re.compile(r"\d{1,4}-\d{1,2}-\d{1,2}")

Key = tuple[str, str]  # (kind, id)


@dataclass
class StoreIndex:
    """Every manifest in the store, read once, with the reverse edges of their `inputs`."""

    manifests: dict[Key, dict[str, Any]] = field(default_factory=dict)
    paths: dict[Key, Path] = field(default_factory=dict)
    dependants: dict[Key, list[Key]] = field(default_factory=dict)
    current: set[Key] = field(default_factory=set)  # what the refs point at
    unreadable: list[str] = field(default_factory=list)  # manifests and refs that could not be read

    def downstream(self, seeds: set[Key]) -> set[Key]:
        """The seeds and everything built from them, directly or not."""
        found = set(seeds)
        frontier = list(seeds)
        while frontier:
            key = frontier.pop()
            for dependant in self.dependants.get(key, ()):
                if dependant not in found:
                    found.add(dependant)
                    frontier.append(dependant)
        return found


def _read_json(path: Path, index: StoreIndex) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        index.unreadable.append(f"{path}: {exc}")
        return None


def index_store(store: ArtifactStore) -> StoreIndex:
    """One pass over every artifact's manifest and every ref (no manifest read twice)."""
    index = StoreIndex()
    for kind_dir in sorted(store.root.iterdir()) if store.root.is_dir() else []:
        if not is_valid_name(kind_dir.name) or not kind_dir.is_dir():
            continue
        for artifact_dir in sorted(kind_dir.iterdir()):
            # Moved-aside and in-progress directories start with "." and are not valid names.
            manifest_path = artifact_dir / MANIFEST
            if not is_valid_name(artifact_dir.name) or not manifest_path.is_file():
                continue
            manifest = _read_json(manifest_path, index)
            if manifest is None:
                continue
            if not isinstance(manifest, dict):
                index.unreadable.append(f"{manifest_path}: not a JSON object")
                continue
            key = (kind_dir.name, artifact_dir.name)
            index.manifests[key] = manifest
            index.paths[key] = artifact_dir
            inputs = manifest.get("inputs")
            for item in inputs if isinstance(inputs, list) else []:
                if isinstance(item, dict) and isinstance(item.get("kind"), str) and isinstance(item.get("id"), str):
                    index.dependants.setdefault((item["kind"], item["id"]), []).append(key)
    for kind_dir in sorted(store.refs.iterdir()) if store.refs.is_dir() else []:
        if not is_valid_name(kind_dir.name) or not kind_dir.is_dir():
            continue
        for ref in sorted(kind_dir.glob("*.json")):
            if ref.name.startswith("."):  # a ref being replaced
                continue
            record = _read_json(ref, index)
            if isinstance(record, dict) and isinstance(record.get("id"), str):
                index.current.add((kind_dir.name, record["id"]))
    return index


def _kind_rank(kind: str) -> tuple[int, str]:
    return (GRAPH_ORDER.index(kind), "") if kind in GRAPH_ORDER else (len(GRAPH_ORDER), kind)


def _sequence(event: dict[str, Any]) -> int:
    value = event.get("sequence")
    return value if isinstance(value, int) else -1


def served_intervals(history: list[dict[str, Any]], bundle_id: str) -> list[dict[str, Any]]:
    """Each stretch of a pointer's applied history (oldest first) during which `bundle_id` was
    its current: `{from_time, from_sequence}` of the change that made it current, `{to_time,
    to_sequence}` of the change that replaced it, both None while it is still current."""
    intervals: list[dict[str, Any]] = []
    serving: dict[str, Any] | None = None
    for event in history:
        if serving is not None and event.get("to") != bundle_id:
            serving.update(to_time=event.get("time"), to_sequence=event.get("sequence"))
            serving = None
        elif serving is None and event.get("to") == bundle_id:
            serving = {
                "from_time": event.get("time"),
                "from_sequence": event.get("sequence"),
                "to_time": None,
                "to_sequence": None,
            }
            intervals.append(serving)
    return intervals


def _pointer_deployments(
    store: ArtifactStore, pointer: str, bundles: set[str], index: StoreIndex
) -> tuple[str | None, list[dict[str, Any]]]:
    """(the bundle `pointer` names now, the deployments on it of `bundles`). A damaged pointer
    other than production is reported in `index.unreadable`; production's raises."""
    try:
        current, history = Pointer(store.home, pointer).applied()
    except DeploymentStateError as exc:
        if pointer == PRODUCTION:
            raise
        index.unreadable.append(str(exc))
        return None, []
    serving = current["bundle_id"]
    deployments: list[dict[str, Any]] = []
    for bundle_id in bundles:
        events = [e for e in history if bundle_id in (e.get("to"), e.get("from"))]
        if events or bundle_id == serving:
            deployments.append(
                {
                    "pointer": pointer,
                    "bundle_id": bundle_id,
                    "serving_now": bundle_id == serving,
                    "events": events,
                    "intervals": served_intervals(history, bundle_id),
                }
            )
    # Serving now first, then the most recently deployed (the highest event sequence).
    deployments.sort(key=lambda d: d["bundle_id"])
    deployments.sort(key=lambda d: max((_sequence(e) for e in d["events"]), default=-1), reverse=True)
    deployments.sort(key=lambda d: not d["serving_now"])
    return serving, deployments


def _affected(store: ArtifactStore, index: StoreIndex, seeds: set[Key]) -> dict[str, Any]:
    """The artifacts downstream of `seeds` (seeds included) and the deployments (current or
    past, on every pointer: production first) of the bundles among them."""
    keys = index.downstream(seeds) & index.manifests.keys()
    bundles = {artifact_id for kind, artifact_id in keys if kind == asset_keys.SERVING_BUNDLE}
    deployments: list[dict[str, Any]] = []
    serving_on: dict[str, list[str]] = {}
    pointers = [PRODUCTION, *(name for name in pointer_names(store.home) if name != PRODUCTION)]
    for pointer in pointers:
        serving, found = _pointer_deployments(store, pointer, bundles, index)
        deployments += found
        if serving is not None:
            serving_on.setdefault(serving, []).append(pointer)
    artifacts = []
    for kind, artifact_id in sorted(
        keys, key=lambda k: (_kind_rank(k[0]), index.manifests[k].get("partition") or "", k[1])
    ):
        manifest = index.manifests[(kind, artifact_id)]
        artifacts.append(
            {
                "kind": kind,
                "id": artifact_id,
                "partition": manifest.get("partition"),
                "created_at": manifest.get("created_at"),
                # current: what the store's ref names (the newest build), not what serves;
                # serving_on: the pointers that name this bundle now (what their servers serve).
                "current": (kind, artifact_id) in index.current,
                "serving_on": serving_on.get(artifact_id, []) if kind == asset_keys.SERVING_BUNDLE else [],
                "path": str(index.paths[(kind, artifact_id)]),
            }
        )
    return {"artifacts": artifacts, "deployments": deployments, "unreadable": index.unreadable}


def affected_by_partition(store: ArtifactStore, partition: str, index: StoreIndex | None = None) -> dict[str, Any]:
    """Every artifact of `partition` (of any kind, current or not) and everything built from
    them, with the production deployments of the bundles among them. A partition that is not
    a YYYY-MM-DD date is a ValueError; one nothing was built from gives empty lists. `index`:
    an `index_store` of `store` the caller goes on to use (else one is made)."""
    parse_partition(partition)
    index = index if index is not None else index_store(store)
    seeds = {key for key, manifest in index.manifests.items() if manifest.get("partition") == partition}
    return {"affected_by": {"partition": partition}, **_affected(store, index, seeds)}


def affected_by_file(
    store: ArtifactStore, path: str | os.PathLike[str], index: StoreIndex | None = None
) -> dict[str, Any]:
    """Every raw_documents snapshot that read the landed file at `path`, and everything built
    from them. A source matches by its recorded path (compared resolved: links and `..`
    followed) and, while the file still exists, by its SHA-256 (the same bytes landed anywhere
    else); `affected_by.matches` says which sources matched and how."""
    given = Path(path).expanduser()
    if given.is_dir():
        raise ValueError(f"{given} is a directory: give one landed file, or a partition as YYYY-MM-DD")
    resolved = given.resolve()
    wanted = {readable(Path(os.path.abspath(given))), readable(resolved)}
    exists = resolved.is_file()
    sha256 = sha256_file(resolved) if exists else None
    index = index if index is not None else index_store(store)
    matches = []
    seeds: set[Key] = set()
    for key, manifest in index.manifests.items():
        sources = manifest.get("sources") if key[0] == asset_keys.RAW_DOCUMENTS else None
        for source in sources if isinstance(sources, list) else []:
            if not isinstance(source, dict):
                continue
            recorded = source.get("path")
            by = []
            if isinstance(recorded, str) and (recorded in wanted or readable(os.path.realpath(recorded)) in wanted):
                by.append("path")
            if sha256 is not None and source.get("sha256") == sha256:
                by.append("sha256")
            if by:
                seeds.add(key)
                matches.append(
                    {
                        "raw_documents": key[1],
                        "partition": manifest.get("partition"),
                        "path": recorded,
                        "size": source.get("size"),
                        "sha256": source.get("sha256"),
                        "by": by,
                    }
                )
    matches.sort(key=lambda m: (str(m["partition"]), m["raw_documents"], str(m["path"])))
    target = {"file": str(resolved), "exists": exists, "sha256": sha256, "matches": matches}
    return {"affected_by": target, **_affected(store, index, seeds)}


def affected_by(store: ArtifactStore, target: str, index: StoreIndex | None = None) -> dict[str, Any]:
    """`affected_by_partition` when `target` looks like a date (then it must be a valid
    YYYY-MM-DD), else `affected_by_file`."""
    if PARTITION_LIKE.fullmatch(target):
        return affected_by_partition(store, target, index)
    return affected_by_file(store, target, index)
