"""`aieng lineage`: the command's parser, JSON documents and human output
(aieng_core/cli/lineage.py), driven through a parser built as aieng's own is."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from aieng_core import asset_keys
from aieng_core.cli.lineage import add_parsers as add_lineage_parser
from aieng_core.hashing import sha256_file
from aieng_core.store import ArtifactNotFound, ArtifactStore
from aieng_core.store.lineage import NothingDeployed, upstream
from tests.bundle_fixtures import BundledHome
from tests.conftest import DEMO_PARTITIONS
from tests.core.lineage_helpers import NODE_KEYS, deploy_history, expected_downstream


def lineage(store: ArtifactStore, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run `aieng --home HOME lineage ARGV...`; returns stdout (the handler must exit 0)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--home")
    parser.add_argument("--config")
    commands = parser.add_subparsers(dest="command", required=True)
    add_lineage_parser(commands)
    args = parser.parse_args(["--home", str(store.home), "lineage", *argv])
    assert args.handler(args) == 0
    return capsys.readouterr().out


def lineage_json(store: ArtifactStore, capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    return json.loads(lineage(store, capsys, *argv, "--json"))


def test_json_chain_of_a_bundle_reaches_every_raw_file(
    serving_bundle_artifact: BundledHome, capsys: pytest.CaptureFixture[str]
) -> None:
    store, bundle = serving_bundle_artifact.store, serving_bundle_artifact.bundle
    result = lineage_json(store, capsys, bundle.id)
    assert set(result) == {"root", "nodes"}  # no deployment: the root was named, not `current`
    assert result["root"] == bundle.id
    assert len(result["nodes"]) == 1 + len(upstream(store, bundle)) == 14
    for artifact_id, node in result["nodes"].items():
        assert node["id"] == artifact_id
        assert set(NODE_KEYS) <= node.keys(), artifact_id
        assert node == {**store.get(node["kind"], artifact_id).manifest, "path": node["path"]}
        assert Path(node["path"]) == store.artifact_dir(node["kind"], artifact_id)
    dataset = store.require_current(asset_keys.DATASET_MANIFEST)
    raw = [n for n in result["nodes"].values() if n["kind"] == asset_keys.RAW_DOCUMENTS]
    assert sorted(n["id"] for n in raw) == sorted(
        a.id for a in upstream(store, dataset) if a.kind == asset_keys.RAW_DOCUMENTS
    )
    assert sorted(n["partition"] for n in raw) == DEMO_PARTITIONS
    landed = sorted((serving_bundle_artifact.home / "raw").glob("*/*"))
    recorded = {s["path"]: s for n in raw for s in n["sources"]}
    assert sorted(recorded) == sorted(str(p) for p in landed) and len(landed) == 5
    for path in landed:
        assert recorded[str(path)]["sha256"] == sha256_file(path)
        assert recorded[str(path)]["size"] == path.stat().st_size


def test_current_follows_the_production_pointer(
    serving_bundle_artifact: BundledHome, copy_bundled_home, capsys: pytest.CaptureFixture[str]
) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    bundle = serving_bundle_artifact.bundle
    newer, events = deploy_history(store, bundle)
    for argv in ([], ["current"]):
        result = lineage_json(store, capsys, *argv)
        assert result["root"] == newer
        assert len(result["nodes"]) == 14 and bundle.id not in result["nodes"]
        assert result["deployment"]["bundle_id"] == newer
        assert result["deployment"]["pointer"] == "production" and result["deployment"]["sequence"] == 3
        assert result["deployment"]["events"] == [events[2]]
    text = lineage(store, capsys)
    assert text.startswith(f"lineage of serving_bundle {newer}: 14 artifacts, 3 raw snapshots of 5 landed files\n")
    assert "deployed to production: sequence 3, updated 2026-02-03T10:00:00+00:00\n" in text
    assert "\n  promote #3 at 2026-02-03T10:00:00+00:00 by alice: change 3\n" in text


def test_current_with_nothing_deployed_says_what_to_do(
    serving_bundle_artifact: BundledHome, copy_bundled_home, capsys: pytest.CaptureFixture[str]
) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    with pytest.raises(NothingDeployed, match=r"aieng deploy promote BUNDLE_ID.*aieng lineage ARTIFACT_ID"):
        lineage(store, capsys, "current", "--json")
    assert capsys.readouterr().out == ""


def test_unknown_id_and_a_hole_in_the_chain_are_errors(
    serving_bundle_artifact: BundledHome, copy_bundled_home, capsys: pytest.CaptureFixture[str]
) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    with pytest.raises(ArtifactNotFound, match="no artifact with id '0000000000000000'"):
        lineage(store, capsys, "0000000000000000")
    with pytest.raises(ArtifactNotFound, match="invalid artifact id"):
        lineage(store, capsys, "../refs")
    clean = store.require_current(asset_keys.CLEAN_DOCUMENTS, "2026-01-03")
    shutil.rmtree(clean.path)
    with pytest.raises(ArtifactNotFound, match=f"no clean_documents artifact '{clean.id}'"):
        lineage(store, capsys, serving_bundle_artifact.bundle.id, "--json")
    assert capsys.readouterr().out == ""


def test_human_tree_names_the_root_every_node_and_the_raw_files(
    serving_bundle_artifact: BundledHome, copy_bundled_home, capsys: pytest.CaptureFixture[str]
) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    bundle = store.get(asset_keys.SERVING_BUNDLE, serving_bundle_artifact.bundle.id)
    manifest = {**bundle.manifest, "git_commit": "49ba72001122334455667788990011aabbccddee-dirty"}
    (bundle.path / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    text = lineage(store, capsys, bundle.id)
    lines = text.splitlines()
    assert lines[0] == f"lineage of serving_bundle {bundle.id}: 14 artifacts, 3 raw snapshots of 5 landed files"
    assert lines[2] == f"serving_bundle {bundle.id}"
    assert lines[3].startswith(
        f"    code {bundle.manifest['code_version']}, config {bundle.manifest['config_sha256'][:12]}"
    )
    assert "git 49ba72001122 (uncommitted changes)" in lines[3]
    assert lines[5] == f"  model_checkpoint {serving_bundle_artifact.model.id}"  # nearest first, indented
    for artifact in upstream(store, bundle):
        assert sum(line.lstrip().startswith(f"{artifact.kind} {artifact.id}") for line in lines) >= 1
        assert sum(line.strip() == str(artifact.path) for line in lines) == 1  # expanded once
    for path in sorted((serving_bundle_artifact.home / "raw").glob("*/*")):
        [line] = [line for line in lines if f"file {path} " in line]
        assert line.endswith(f"bytes  sha256 {sha256_file(path)}")
        assert line.startswith(" " * 10)  # under its raw_documents node
    assert "(shown above)" in text  # clean partitions reached again through tokenized_documents


def test_affected_by_partition_json_and_text(
    serving_bundle_artifact: BundledHome, copy_bundled_home, capsys: pytest.CaptureFixture[str]
) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    bundle = serving_bundle_artifact.bundle
    newer, events = deploy_history(store, bundle)
    result = lineage_json(store, capsys, "--affected-by", "2026-01-02")
    assert set(result) == {"affected_by", "artifacts", "deployments", "unreadable"}
    seeds = {
        (kind, store.require_current(kind, "2026-01-02").id)
        for kind in (asset_keys.RAW_DOCUMENTS, asset_keys.CLEAN_DOCUMENTS, asset_keys.TOKENIZED_DOCUMENTS)
    }
    assert {(a["kind"], a["id"]) for a in result["artifacts"]} == expected_downstream(store, seeds)
    assert len(result["artifacts"]) == 11
    for item in result["artifacts"]:
        assert set(item) == {"kind", "id", "partition", "created_at", "current", "path"}
    assert [
        (d["bundle_id"], d["serving_now"], [e["sequence"] for e in d["events"]]) for d in result["deployments"]
    ] == [
        (newer, True, [3]),
        (bundle.id, False, [2, 3]),
    ]
    text = lineage(store, capsys, "--affected-by", "2026-01-02")
    assert text.startswith("affected by partition 2026-01-02: 11 artifacts (* = current)\n")
    assert f"  * serving_bundle {bundle.id}  created " in text
    assert f"  serving_bundle {newer}  SERVING NOW" in text
    assert f"  serving_bundle {bundle.id}  not serving" in text
    assert f"#2 2026-02-02T10:00:00+00:00 promote {events[1]['from']} -> {bundle.id} by alice: change 2" in text

    empty = lineage(store, capsys, "--affected-by", "2025-12-31")
    assert empty == "nothing is affected by partition 2025-12-31: no artifact in the store was built from it\n"
    with pytest.raises(ValueError, match="'2026-02-30' is not a date"):
        lineage(store, capsys, "--affected-by", "2026-02-30")
    with pytest.raises(ValueError, match="not both"):
        lineage(store, capsys, bundle.id, "--affected-by", "2026-01-02")


def test_affected_by_a_landed_file(
    serving_bundle_artifact: BundledHome, copy_bundled_home, capsys: pytest.CaptureFixture[str]
) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    raw = store.require_current(asset_keys.RAW_DOCUMENTS, "2026-01-03")
    landed = Path(raw.manifest["sources"][0]["path"])
    result = lineage_json(store, capsys, "--affected-by", str(landed))
    assert result["affected_by"]["file"] == str(landed) and result["affected_by"]["exists"] is True
    assert [(m["raw_documents"], m["by"]) for m in result["affected_by"]["matches"]] == [(raw.id, ["path", "sha256"])]
    assert {(a["kind"], a["id"]) for a in result["artifacts"]} == expected_downstream(store, {(raw.kind, raw.id)})
    assert result["deployments"] == []  # nothing deployed in this home
    text = lineage(store, capsys, "--affected-by", str(landed))
    assert text.startswith(
        f"file {landed} (sha256 {sha256_file(landed)}): 1 recorded source matches\n"
        f"  raw_documents {raw.id}  partition 2026-01-03: {landed} (by path and sha256)\n"
        f"affected by file {landed}"
    )
    assert "none of them was ever deployed to production" in text
    missing = store.home / "raw" / "2026-01-03" / "never-landed.jsonl"
    text = lineage(store, capsys, "--affected-by", str(missing))
    assert text == (
        f"file {missing} (not found: matched by its recorded path only): 0 recorded sources match\n"
        f"nothing is affected by file {missing} (not found: matched by its recorded path only): "
        "no raw_documents snapshot records that path\n"
    )
