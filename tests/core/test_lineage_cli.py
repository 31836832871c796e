"""`aieng lineage`: the command's parser, JSON documents and human output
(aieng_core/cli/lineage.py), driven through a parser built as aieng's own is."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from aieng_core import asset_keys
from aieng_core.cli.lineage import add_parsers as add_lineage_parser
from aieng_core.hashing import sha256_file
from aieng_core.store import ArtifactNotFound, ArtifactStore
from aieng_core.store.lineage import NothingDeployed, lineage_graph, upstream
from aieng_core.store.request_log import RequestNotLogged, default_request_log, encode_line
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
    # via_tokenizer: tests/core/test_lineage_tokenizer.py
    assert set(result) == {"affected_by", "artifacts", "deployments", "unreadable", "via_tokenizer"}
    seeds = {
        (kind, store.require_current(kind, "2026-01-02").id)
        for kind in (asset_keys.RAW_DOCUMENTS, asset_keys.CLEAN_DOCUMENTS, asset_keys.TOKENIZED_DOCUMENTS)
    }
    assert {(a["kind"], a["id"]) for a in result["artifacts"]} == expected_downstream(store, seeds)
    assert len(result["artifacts"]) == 11
    for item in result["artifacts"]:
        assert set(item) == {"kind", "id", "partition", "created_at", "current", "serving_on", "path"}
    assert [
        (d["pointer"], d["bundle_id"], d["serving_now"], [e["sequence"] for e in d["events"]])
        for d in result["deployments"]
    ] == [
        ("production", newer, True, [3]),
        ("production", bundle.id, False, [2, 3]),
        ("drill", bundle.id, True, [1]),
    ]
    text = lineage(store, capsys, "--affected-by", "2026-01-02")
    assert text.startswith(
        "affected by partition 2026-01-02: 11 artifacts (* = current in the store: its newest build, not "
        "necessarily what serves; SERVING NOW = what the production pointer names)\n"
    )
    lines = text.splitlines()
    # The store's newest bundle is not what serves; the hand-made one the pointer names is.
    (current_line,) = [line for line in lines if line.startswith(f"  * serving_bundle {bundle.id}  created ")]
    assert current_line.endswith("  (named by drill now)") and "SERVING NOW" not in current_line
    (serving_line,) = [line for line in lines if line.startswith(f"    serving_bundle {newer}  created ")]
    assert serving_line.endswith("  SERVING NOW")
    production = lines.index("deployed to production (2 bundles):")
    assert lines[production + 1 : production + 9] == [
        f"  serving_bundle {newer}  SERVING NOW",
        "    served from #3 2026-02-03T10:00:00+00:00 until now (still current)",
        f"    #3 2026-02-03T10:00:00+00:00 promote {bundle.id} -> {newer} by alice: change 3",
        f"  serving_bundle {bundle.id}  not serving",
        "    served from #2 2026-02-02T10:00:00+00:00 until #3 2026-02-03T10:00:00+00:00",
        f"    #2 2026-02-02T10:00:00+00:00 promote {events[1]['from']} -> {bundle.id} by alice: change 2",
        f"    #3 2026-02-03T10:00:00+00:00 promote {bundle.id} -> {newer} by alice: change 3",
        "deployed to drill (1 bundle):",
    ]
    assert lines[production + 9 : production + 12] == [
        f"  serving_bundle {bundle.id}  named by drill now",
        "    served from #1 2026-02-01T10:00:00+00:00 until now (still current)",
        f"    #1 2026-02-01T10:00:00+00:00 promote none -> {bundle.id} by alice: change 1",
    ]

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


# ---- --request: what answered a logged request ----------------------------------------------------


def logged(request_id: str, bundle_id: str, data_version: str = "d" * 64, **extra: object) -> dict[str, object]:
    return {
        "time": "2026-02-03T11:00:00.000+00:00",
        "request_id": request_id,
        "method": "POST",
        "path": "/v1/completions",
        "status": 200,
        "bundle_id": bundle_id,
        "data_version": data_version,
        "latency_ms": 41.5,
        **extra,
    }


def test_request_names_the_bundle_that_answered_and_its_chain(
    serving_bundle_artifact: BundledHome, copy_bundled_home, capsys: pytest.CaptureFixture[str]
) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    bundle = serving_bundle_artifact.bundle
    newer, _events = deploy_history(store, bundle)  # production serves `newer` now
    dataset = store.require_current(asset_keys.DATASET_MANIFEST)
    log = default_request_log(store.home)
    log.parent.mkdir(parents=True)
    records = [
        logged("rid-1", newer, dataset.content_sha256),
        logged("rid-2", bundle.id, dataset.content_sha256, finish_reason="stop", completion_tokens=7),
        logged("rid-1", bundle.id, dataset.content_sha256),  # the id reused: its last answer counts
    ]
    log.write_bytes(b"".join(encode_line(r) for r in records))
    result = lineage_json(store, capsys, "--request", "rid-1")
    assert set(result) == {"request", "request_log", "chain_data_version", "root", "nodes"}
    assert result["request"] == records[2] and result["request_log"] == str(log)
    assert result["root"] == bundle.id  # the bundle that answered, not the one serving now
    assert result["nodes"] == lineage_graph(store, store.get(asset_keys.SERVING_BUNDLE, bundle.id))["nodes"]
    assert result["chain_data_version"] == dataset.content_sha256
    raw = [n for n in result["nodes"].values() if n["kind"] == asset_keys.RAW_DOCUMENTS]
    assert sum(len(n["sources"]) for n in raw) == 5

    text = lineage(store, capsys, "--request", "rid-2")
    lines = text.splitlines()
    assert lines[:3] == [
        "request rid-2: POST /v1/completions 200 at 2026-02-03T11:00:00.000+00:00 "
        "(41.5 ms, finish stop, 7 tokens generated)",
        f"answered by serving_bundle {bundle.id}, data version {dataset.content_sha256}",
        f"  (from the request log {log})",
    ]
    assert lines[4] == f"lineage of serving_bundle {bundle.id}: 14 artifacts, 3 raw snapshots of 5 landed files"
    assert "WARNING" not in text

    elsewhere = store.home / "elsewhere.jsonl"
    elsewhere.write_bytes(encode_line(logged("rid-3", bundle.id, "e" * 64)))
    text = lineage(store, capsys, "--request", "rid-3", "--request-log", str(elsewhere))
    assert f"WARNING: the bundle's chain has the data version {dataset.content_sha256}" in text


def test_request_refusals_name_what_is_missing(
    serving_bundle_artifact: BundledHome, copy_bundled_home, capsys: pytest.CaptureFixture[str]
) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    log = default_request_log(store.home)
    with pytest.raises(RequestNotLogged, match=f"there is no request log at {log}"):
        lineage(store, capsys, "--request", "rid-1")
    log.parent.mkdir(parents=True)
    log.write_bytes(
        encode_line(logged("early", "none", "none", path="/generate", status=503))
        + encode_line(logged("gone", "0123456789abcdef"))
    )
    with pytest.raises(RequestNotLogged, match=rf"request 'rid-1' is not in the request log {log}"):
        lineage(store, capsys, "--request", "rid-1")
    with pytest.raises(ValueError, match=r"request early \(POST /generate 503 at .*\) was answered while no bundle"):
        lineage(store, capsys, "--request", "early")
    with pytest.raises(ArtifactNotFound, match="was answered by serving_bundle 0123456789abcdef, but: no serving"):
        lineage(store, capsys, "--request", "gone")
    with pytest.raises(ValueError, match="use it with --request REQUEST_ID"):
        lineage(store, capsys, "--request-log", str(log))
    with pytest.raises(ValueError, match="not both --affected-by and --request"):
        lineage(store, capsys, "--affected-by", "2026-01-02", "--request", "early")
    assert capsys.readouterr().out == ""


def test_request_lookup_imports_no_torch(serving_bundle_artifact: BundledHome, copy_bundled_home) -> None:
    """`aieng lineage --request` answers during an incident in well under a second: it loads no
    model code (torch alone takes seconds to import)."""
    store = copy_bundled_home(serving_bundle_artifact)
    log = default_request_log(store.home)
    log.parent.mkdir(parents=True)
    log.write_bytes(encode_line(logged("rid", serving_bundle_artifact.bundle.id)))
    code = (
        "import sys\n"
        "from aieng_core import cli\n"
        f"assert cli.main(['--home', {str(store.home)!r}, 'lineage', '--request', 'rid', '--json']) == 0\n"
        "heavy = ('torch', 'transformers', 'fastapi', 'dagster')\n"
        "print(sorted(m for m in heavy if m in sys.modules), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(done.stdout)["root"] == serving_bundle_artifact.bundle.id
    assert done.stderr.strip().splitlines()[-1] == "[]"
