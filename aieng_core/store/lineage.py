"""Walking an artifact's manifest `inputs` down to the raw snapshots it was built from.

Every manifest names its inputs by (kind, id); following them recursively reaches every
artifact that decided its bytes, down to raw_documents, whose manifests list the landed
files' hashes. `aieng lineage` and the serving bundle's lineage summary both start here.
"""

from __future__ import annotations

from typing import Any

from aieng_core import asset_keys
from aieng_core.store.artifacts import Artifact, ArtifactStore


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
