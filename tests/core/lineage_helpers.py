"""Helpers of the lineage tests (test_lineage_lookup.py, test_lineage_cli.py): a deployment
history written in its documented on-disk format, and what lies downstream of an artifact
found independently of the reverse index."""

from __future__ import annotations

import json
from typing import Any

from aieng_core import asset_keys
from aieng_core.store import Artifact, ArtifactStore
from aieng_core.store.lineage import upstream

NODE_KEYS = ("kind", "id", "code_version", "config_sha256", "git_commit", "dagster_run_id", "created_at", "path")
UNRELATED_BUNDLE = "0123456789abcdef"  # deployed once, never in the store


def event(sequence: int, action: str, source: str | None, target: str | None, pointer: str = "production") -> dict:
    return {
        "sequence": sequence,
        "time": f"2026-02-{sequence:02d}T10:00:00+00:00",
        "pointer": pointer,
        "action": action,
        "from": source,
        "to": target,
        "actor": "alice",
        "reason": f"change {sequence}",
        "figures": {"p50_ms": 10 + sequence},
        "dagster_run_id": f"run-{sequence}",
    }


def write_deployment(store: ArtifactStore, bundle_id: str | None, events: list[dict], pointer: str = "production"):
    """Deployment state in its documented on-disk format, as aieng_core.deploy writes it."""
    folder = store.home / "deployments" / pointer
    folder.mkdir(parents=True, exist_ok=True)
    current = {
        "pointer": pointer,
        "bundle_id": bundle_id,
        "bundle_path": str(store.artifact_dir(asset_keys.SERVING_BUNDLE, bundle_id)) if bundle_id else None,
        "sequence": len(events),
        "updated_at": events[-1]["time"] if events else "2026-02-01T00:00:00+00:00",
        "stack": [e["from"] for e in events if e["from"]],
    }
    (folder / "current.json").write_text(json.dumps(current), encoding="utf-8")
    (folder / "history.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")


def second_bundle(store: ArtifactStore, bundle: Artifact) -> str:
    """Another serving_bundle of the same model (a manifest only: lineage never reads files)."""
    other_id = "fedcba9876543210"
    folder = store.artifact_dir(asset_keys.SERVING_BUNDLE, other_id)
    folder.mkdir()
    manifest = {**bundle.manifest, "id": other_id, "created_at": "2026-02-02T00:00:00+00:00"}
    (folder / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return other_id


def deploy_history(store: ArtifactStore, bundle: Artifact) -> tuple[str, list[dict]]:
    """Production served an unrelated bundle, then `bundle`, then a second bundle of the same
    model (serving now); the rollback drill's pointer served `bundle` too."""
    newer = second_bundle(store, bundle)
    events = [
        event(1, "promote", None, UNRELATED_BUNDLE),
        event(2, "promote", UNRELATED_BUNDLE, bundle.id),
        event(3, "promote", bundle.id, newer),
    ]
    write_deployment(store, newer, events)
    write_deployment(store, bundle.id, [event(1, "promote", None, bundle.id, pointer="drill")], pointer="drill")
    return newer, events


def all_artifacts(store: ArtifactStore) -> list[Artifact]:
    return [
        store.get(kind_dir.name, artifact_id)
        for kind_dir in sorted(store.root.iterdir())
        for artifact_id in store.list_ids(kind_dir.name)
    ]


def expected_downstream(store: ArtifactStore, seeds: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """Independently of the reverse index: each artifact whose own upstream walk meets a seed."""
    return {
        (a.kind, a.id)
        for a in all_artifacts(store)
        if (a.kind, a.id) in seeds or seeds & {(u.kind, u.id) for u in upstream(store, a)}
    }


def keys(result: dict[str, Any]) -> set[tuple[str, str]]:
    return {(a["kind"], a["id"]) for a in result["artifacts"]}
