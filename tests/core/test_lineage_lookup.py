"""Lineage lookups for incidents: the whole chain of an artifact, the deployment state files,
and everything downstream of a partition or a landed file (aieng_core/store/lineage.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aieng_core import asset_keys
from aieng_core.data.clean_documents import build_clean_documents
from aieng_core.data.raw_documents import build_raw_documents
from aieng_core.deploy.deployments import DeploymentStateError
from aieng_core.hashing import sha256_file
from aieng_core.store import ArtifactNotFound, ArtifactStore
from aieng_core.store.lineage import (
    NothingDeployed,
    affected_by,
    affected_by_file,
    affected_by_partition,
    deployed_bundle,
    git_state,
    index_store,
    lineage_graph,
    served_intervals,
    upstream,
)
from tests.bundle_fixtures import BundledHome
from tests.conftest import DEMO_PARTITIONS, land
from tests.core.helpers import jsonl, sentences
from tests.core.lineage_helpers import (
    NODE_KEYS,
    all_artifacts,
    deploy_history,
    event,
    expected_downstream,
    keys,
    second_bundle,
    write_deployment,
)

# ---- the chain ------------------------------------------------------------------------------------


def test_git_state_reads_the_dirty_suffix_provenance_writes() -> None:
    assert git_state("49ba72001122334455667788990011aabbccddee") == ("49ba72001122334455667788990011aabbccddee", False)
    assert git_state("49ba7200-dirty") == ("49ba7200", True)
    assert git_state(None) == (None, None)
    assert git_state("") == (None, None)


def test_graph_is_the_root_and_its_upstream_with_paths(serving_bundle_artifact: BundledHome) -> None:
    store, bundle = serving_bundle_artifact.store, serving_bundle_artifact.bundle
    graph = lineage_graph(store, bundle)
    chain = upstream(store, bundle)
    assert graph["root"] == bundle.id
    assert len(graph["nodes"]) == 1 + len(chain) == 14
    for artifact in [bundle, *chain]:
        assert graph["nodes"][artifact.id] == {**artifact.manifest, "path": str(artifact.path)}
    for node in graph["nodes"].values():
        assert set(NODE_KEYS) <= node.keys(), node["id"]


# ---- deployment state -----------------------------------------------------------------------------


def test_deployed_bundle_follows_the_production_pointer(
    serving_bundle_artifact: BundledHome, copy_bundled_home
) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    bundle = serving_bundle_artifact.bundle
    with pytest.raises(NothingDeployed, match="does not exist.*aieng deploy promote BUNDLE_ID"):
        deployed_bundle(store)
    newer, events = deploy_history(store, bundle)
    found, state = deployed_bundle(store)
    assert (found.kind, found.id) == (asset_keys.SERVING_BUNDLE, newer)
    assert state["sequence"] == 3 and state["events"] == [events[2]]  # the event that put it there
    write_deployment(store, None, [*events, event(4, "rollback", newer, None)])
    with pytest.raises(NothingDeployed, match="names no bundle"):
        deployed_bundle(store)
    write_deployment(store, "aaaabbbbccccdddd", events)
    with pytest.raises(ArtifactNotFound, match="production deployment points at serving_bundle 'aaaabbbbccccdddd'"):
        deployed_bundle(store)


def test_damaged_deployment_state_is_an_error_naming_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "deployments" / "production"
    folder.mkdir(parents=True)
    (folder / "current.json").write_text("{", encoding="utf-8")
    with pytest.raises(DeploymentStateError, match="current.json"):
        deployed_bundle(ArtifactStore(tmp_path))


def test_a_history_line_that_never_reached_the_pointer_is_not_a_deployment(
    serving_bundle_artifact: BundledHome, copy_bundled_home
) -> None:
    """A crash between the history append and the pointer's replacement leaves a line for a
    change that never happened: lineage must not say that bundle served."""
    store = copy_bundled_home(serving_bundle_artifact)
    bundle = serving_bundle_artifact.bundle
    newer = second_bundle(store, bundle)
    applied = event(1, "promote", None, bundle.id)
    write_deployment(store, bundle.id, [applied])
    history = store.home / "deployments" / "production" / "history.jsonl"
    with history.open("a", encoding="utf-8") as out:
        out.write(json.dumps(event(2, "promote", bundle.id, newer)) + "\n")  # current.json still at 1
    found, state = deployed_bundle(store)
    assert found.id == bundle.id and state["events"] == [applied]
    deployments = affected_by_partition(store, DEMO_PARTITIONS[0])["deployments"]
    assert [(d["bundle_id"], d["serving_now"], [e["sequence"] for e in d["events"]]) for d in deployments] == [
        (bundle.id, True, [1])
    ]
    assert deployments[0]["intervals"] == [
        {"from_time": applied["time"], "from_sequence": 1, "to_time": None, "to_sequence": None}
    ]


def test_intervals_follow_every_change_of_a_pointer() -> None:
    """A bundle promoted, rolled back from, promoted again: two stretches, the last still open."""
    history = [
        event(1, "promote", None, "a"),
        event(2, "promote", "a", "b"),
        event(3, "rollback", "b", "a"),
        event(4, "promote", "a", "b"),
        event(5, "rollback", "b", None),
        event(6, "promote", None, "b"),
    ]

    def stretch(start: int, end: int | None) -> dict:
        return {
            "from_time": history[start - 1]["time"],
            "from_sequence": start,
            "to_time": history[end - 1]["time"] if end else None,
            "to_sequence": end,
        }

    assert served_intervals(history, "a") == [stretch(1, 2), stretch(3, 4)]
    assert served_intervals(history, "b") == [stretch(2, 3), stretch(4, 5), stretch(6, None)]
    assert served_intervals(history, "never") == []


def test_a_damaged_pointer_besides_production_is_reported_not_fatal(
    serving_bundle_artifact: BundledHome, copy_bundled_home
) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    deploy_history(store, serving_bundle_artifact.bundle)
    damaged = store.home / "deployments" / "drill" / "current.json"
    damaged.write_text("{", encoding="utf-8")
    result = affected_by_partition(store, DEMO_PARTITIONS[0])
    assert {d["pointer"] for d in result["deployments"]} == {"production"}
    (problem,) = result["unreadable"]
    assert problem.startswith(f"{damaged}: not valid JSON")
    (store.home / "deployments" / "production" / "current.json").write_text("{", encoding="utf-8")
    with pytest.raises(DeploymentStateError, match="production/current.json"):
        affected_by_partition(store, DEMO_PARTITIONS[0])


# ---- downstream ---------------------------------------------------------------------------------


def test_the_index_reads_every_manifest_once_and_knows_the_current_refs(serving_bundle_artifact: BundledHome) -> None:
    store = serving_bundle_artifact.store
    index = index_store(store)
    everything = all_artifacts(store)
    assert index.manifests == {(a.kind, a.id): a.manifest for a in everything}
    assert index.unreadable == []
    clean = store.require_current(asset_keys.CLEAN_DOCUMENTS, "2026-01-02")
    assert sorted(index.dependants[(clean.kind, clean.id)]) == sorted(
        (a.kind, a.id) for a in everything if {"kind": clean.kind, "id": clean.id} in a.manifest.get("inputs", [])
    )
    assert (asset_keys.SERVING_BUNDLE, serving_bundle_artifact.bundle.id) in index.current


def test_affected_by_a_partition_is_everything_built_from_it(
    serving_bundle_artifact: BundledHome, copy_bundled_home
) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    bundle = serving_bundle_artifact.bundle
    newer, events = deploy_history(store, bundle)
    partition = "2026-01-02"
    result = affected_by(store, partition)
    assert result["affected_by"] == {"partition": partition}

    seeds = {(a.kind, a.id) for a in all_artifacts(store) if a.manifest.get("partition") == partition}
    assert {kind for kind, _ in seeds} == {
        asset_keys.RAW_DOCUMENTS,
        asset_keys.CLEAN_DOCUMENTS,
        asset_keys.TOKENIZED_DOCUMENTS,
    }
    assert keys(result) == expected_downstream(store, seeds)
    # The tokenizer is trained on every partition's clean text, so it, and with it every
    # tokenized partition, is downstream of any one partition.
    kinds = sorted(a["kind"] for a in result["artifacts"])
    assert kinds == sorted(
        [asset_keys.RAW_DOCUMENTS, asset_keys.CLEAN_DOCUMENTS, asset_keys.BPE_TOKENIZER]
        + [asset_keys.TOKENIZED_DOCUMENTS] * 3
        + [asset_keys.DATASET_MANIFEST, asset_keys.MODEL_CHECKPOINT, asset_keys.BENCHMARK_REPORT]
        + [asset_keys.SERVING_BUNDLE] * 2
    )
    assert [a["partition"] for a in result["artifacts"] if a["kind"] == asset_keys.RAW_DOCUMENTS] == [partition]
    current = {(a["kind"], a["id"]): a["current"] for a in result["artifacts"]}
    assert current[(asset_keys.SERVING_BUNDLE, bundle.id)] is True
    assert current[(asset_keys.SERVING_BUNDLE, newer)] is False  # no ref points at the hand-made one
    assert all(a["created_at"] for a in result["artifacts"])

    # Every pointer, production first; on each, serving now first. Each stretch a bundle was
    # current, from the change that made it so to the one that replaced it (None: still is).
    drill_event = event(1, "promote", None, bundle.id, pointer="drill")

    def since(e: dict, until: dict | None = None) -> dict:
        return {
            "from_time": e["time"],
            "from_sequence": e["sequence"],
            "to_time": until["time"] if until else None,
            "to_sequence": until["sequence"] if until else None,
        }

    assert result["deployments"] == [
        {
            "pointer": "production",
            "bundle_id": newer,
            "serving_now": True,
            "events": [events[2]],
            "intervals": [since(events[2])],
        },
        {
            "pointer": "production",
            "bundle_id": bundle.id,
            "serving_now": False,
            "events": [events[1], events[2]],
            "intervals": [since(events[1], events[2])],
        },
        {
            "pointer": "drill",
            "bundle_id": bundle.id,
            "serving_now": True,
            "events": [drill_event],
            "intervals": [since(drill_event)],
        },
    ]
    # What serves now (a pointer names it) against what is current in the store (a ref names it).
    serving_on = {a["id"]: a["serving_on"] for a in result["artifacts"]}
    assert serving_on[newer] == ["production"] and serving_on[bundle.id] == ["drill"]
    assert not any(a["serving_on"] for a in result["artifacts"] if a["kind"] != asset_keys.SERVING_BUNDLE)


def test_a_partition_no_bundle_used_and_one_nothing_used(
    serving_bundle_artifact: BundledHome, copy_bundled_home
) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    deploy_history(store, serving_bundle_artifact.bundle)
    land(
        store.home, "2026-01-04", "late.jsonl", jsonl(*({"id": f"l{i}", "text": t} for i, t in enumerate(sentences(8))))
    )
    raw = build_raw_documents(store, serving_bundle_artifact.config, "2026-01-04")
    clean = build_clean_documents(store, serving_bundle_artifact.config, "2026-01-04")
    result = affected_by_partition(store, "2026-01-04")
    assert [(a["kind"], a["id"], a["current"]) for a in result["artifacts"]] == [
        (raw.kind, raw.id, True),
        (clean.kind, clean.id, True),
    ]
    assert result["deployments"] == []

    nothing = affected_by_partition(store, "2026-03-01")
    assert nothing == {"affected_by": {"partition": "2026-03-01"}, "artifacts": [], "deployments": [], "unreadable": []}
    for bad in ("2026-02-30", "2026-1-02"):
        with pytest.raises(ValueError, match="not a date in YYYY-MM-DD form"):
            affected_by(store, bad)


def test_affected_by_a_landed_file_matches_its_path_and_its_bytes(
    serving_bundle_artifact: BundledHome, copy_bundled_home
) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    deploy_history(store, serving_bundle_artifact.bundle)
    raw = store.require_current(asset_keys.RAW_DOCUMENTS, "2026-01-02")
    source = raw.manifest["sources"][0]
    # Where it landed (the session home: the copy's manifests record that path) ...
    original = Path(source["path"])
    assert original.is_absolute() and original.is_file()
    by_path = affected_by_file(store, original)
    assert by_path["affected_by"]["matches"] == [
        {
            "raw_documents": raw.id,
            "partition": "2026-01-02",
            "path": source["path"],
            "size": source["size"],
            "sha256": source["sha256"],
            "by": ["path", "sha256"],
        }
    ]
    assert by_path["affected_by"]["sha256"] == sha256_file(original)
    assert keys(by_path) == expected_downstream(store, {(raw.kind, raw.id)})
    assert [(d["pointer"], d["serving_now"]) for d in by_path["deployments"]] == [
        ("production", True),
        ("production", False),
        ("drill", True),
    ]
    # ... the same bytes landed elsewhere (this copy's landing folder), through a `..` ...
    copied = store.home / "raw" / "2026-01-02" / original.name
    roundabout = store.home / "raw" / "2026-01-01" / ".." / "2026-01-02" / original.name
    by_bytes = affected_by(store, str(roundabout))
    assert by_bytes["affected_by"]["file"] == str(copied.resolve())
    assert [m["by"] for m in by_bytes["affected_by"]["matches"]] == [["sha256"]]
    assert keys(by_bytes) == keys(by_path)
    # ... and a file nothing recorded.
    stray = store.home / "stray.jsonl"
    stray.write_bytes(b'{"id": "x", "text": "never landed in any partition"}\n')
    nothing = affected_by_file(store, stray)
    assert nothing["affected_by"]["matches"] == [] and nothing["artifacts"] == [] and nothing["deployments"] == []
    with pytest.raises(ValueError, match="is a directory"):
        affected_by_file(store, store.home / "raw" / "2026-01-02")


def test_a_landed_file_since_deleted_still_matches_by_its_recorded_path(
    serving_bundle_artifact: BundledHome, copy_bundled_home
) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    landed = land(
        store.home,
        "2026-01-04",
        "gone.jsonl",
        jsonl(*({"id": f"g{i}", "text": t} for i, t in enumerate(sentences(6, seed=3)))),
    )
    raw = build_raw_documents(store, serving_bundle_artifact.config, "2026-01-04")
    landed.unlink()
    result = affected_by_file(store, landed)
    assert result["affected_by"]["exists"] is False and result["affected_by"]["sha256"] is None
    assert [(m["raw_documents"], m["by"]) for m in result["affected_by"]["matches"]] == [(raw.id, ["path"])]
    assert keys(result) == {(raw.kind, raw.id)}


def test_an_unreadable_manifest_is_reported_not_skipped_silently(
    serving_bundle_artifact: BundledHome, copy_bundled_home
) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    model = store.require_current(asset_keys.MODEL_CHECKPOINT)
    (model.path / "manifest.json").write_text("{not json", encoding="utf-8")
    result = affected_by_partition(store, DEMO_PARTITIONS[0])
    assert len(result["unreadable"]) == 1 and str(model.path / "manifest.json") in result["unreadable"][0]
    # The model is unreadable, so the walk stops there; the benchmark report read the dataset
    # itself, so it (and the bundle built from it) is still reached through the dataset.
    assert {a["kind"] for a in result["artifacts"]} == {
        asset_keys.RAW_DOCUMENTS,
        asset_keys.CLEAN_DOCUMENTS,
        asset_keys.BPE_TOKENIZER,
        asset_keys.TOKENIZED_DOCUMENTS,
        asset_keys.DATASET_MANIFEST,
        asset_keys.BENCHMARK_REPORT,
        asset_keys.SERVING_BUNDLE,
    }
