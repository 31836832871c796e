"""`aieng lineage --affected-by` through the pinned tokenizer: every tokenized partition names
the tokenizer as an input, so one partition (or landed file) it was trained on reaches every
token id; the output says so, and says when the tokenizer was trained on a replaced version."""

from __future__ import annotations

from pathlib import Path

import pytest

from aieng_core import asset_keys
from aieng_core.data.clean_documents import build_clean_documents
from aieng_core.data.raw_documents import build_raw_documents
from aieng_core.dataset.dataset_manifest import build_dataset_manifest
from aieng_core.hashing import sha256_file
from aieng_core.store import ArtifactStore
from aieng_core.tokenizer.bpe_tokenizer import build_bpe_tokenizer
from aieng_core.tokenizer.tokenized_documents import build_tokenized_documents
from tests.bundle_fixtures import BundledHome
from tests.core.test_lineage_cli import lineage, lineage_json

PARTITION = "2026-01-02"
CLEAN, RAW = asset_keys.CLEAN_DOCUMENTS, asset_keys.RAW_DOCUMENTS
COMMAND = (
    "dagster asset materialize -m orchestration.definitions --select bpe_tokenizer,tokenized_documents,"
    "dataset_manifest --partition-range 2026-01-01...2026-01-03 --config-json "
    """'{"ops": {"bpe_tokenizer": {"config": {"retrain": true}}}}'"""
)
CONSEQUENCE = (
    "retraining changes every token id: every partition is re-tokenized, and the dataset_manifest, model and "
    "serving bundles built after it are all new"
)


def test_a_partition_reaches_every_token_id_through_the_tokenizer(
    serving_bundle_artifact: BundledHome, copy_bundled_home, capsys: pytest.CaptureFixture[str]
) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    tokenizer = store.require_current(asset_keys.BPE_TOKENIZER)
    bundle = serving_bundle_artifact.bundle
    clean, raw = store.require_current(CLEAN, PARTITION), store.require_current(RAW, PARTITION)
    result = lineage_json(store, capsys, "--affected-by", PARTITION)
    ids = {(clean.kind, clean.id), (raw.kind, raw.id)}
    assert result["via_tokenizer"] == [
        {
            "bpe_tokenizer": tokenizer.id,
            "current": True,
            "trained_on": [
                {
                    "partition": PARTITION,
                    "state": "unchanged",
                    "trained_on": {CLEAN: clean.id, RAW: raw.id},
                    "current": {CLEAN: clean.id, RAW: raw.id},
                    "files": [],
                    "why": f"clean_documents {clean.id} is still current",
                }
            ],
            "replaced": False,
            # tokenized_documents x3, dataset_manifest, model_checkpoint, benchmark_report, serving_bundle
            "built_with_it": 7,
            "serving_bundle": [bundle.id],
            "retrain": [],
        }
    ]
    # Every other day's tokens are downstream of this day only through the tokenizer.
    others = [a for a in result["artifacts"] if a["kind"] == asset_keys.TOKENIZED_DOCUMENTS]
    assert sorted(a["partition"] for a in others) == ["2026-01-01", PARTITION, "2026-01-03"]
    assert ids <= {(a["kind"], a["id"]) for a in result["artifacts"]}

    lines = lineage(store, capsys, "--affected-by", PARTITION).splitlines()
    via = lines.index(
        f"via bpe_tokenizer {tokenizer.id} (current; trained on this partition): every token id of every partition "
        f"depends on it; 7 artifacts were built with it, serving bundles {bundle.id}"
    )
    assert lines[via + 1] == "none of them was ever deployed to production"  # nothing was replaced: no more


def _reland_and_rebuild(store: ArtifactStore, bundled: BundledHome) -> Path:
    """Re-land a corrected legacy_gbk.csv for PARTITION in `store`'s landing folder and ingest it,
    the tokenizer staying pinned; the day is re-tokenized and the dataset refreshed with it."""
    config = bundled.config
    landed = store.home / "raw" / PARTITION / "legacy_gbk.csv"
    with open(landed, "ab") as handle:
        handle.write(
            "legacy-gbk-late,迟到的一行更正文本，补在原来的文件后面。,legacy-gbk,zh,2026-01-02\n".encode("gbk")
        )
    build_raw_documents(store, config, PARTITION)
    build_clean_documents(store, config, PARTITION)
    assert build_bpe_tokenizer(store, config).reused
    build_tokenized_documents(store, config, PARTITION)
    build_dataset_manifest(store, config)
    return landed


def test_the_old_file_of_a_replaced_partition_still_reaches_the_bundles_through_the_tokenizer(
    serving_bundle_artifact: BundledHome, copy_bundled_home, capsys: pytest.CaptureFixture[str]
) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    old_raw, old_clean = store.require_current(RAW, PARTITION), store.require_current(CLEAN, PARTITION)
    # Where it first landed (the session home, which this copy's old manifests name), unchanged.
    [source] = [s for s in old_raw.manifest["sources"] if s["name"] == "legacy_gbk.csv"]
    old_file = Path(source["path"])
    assert sha256_file(old_file) == source["sha256"]
    landed = _reland_and_rebuild(store, serving_bundle_artifact)
    new_raw, new_clean = store.require_current(RAW, PARTITION), store.require_current(CLEAN, PARTITION)
    tokenizer = store.require_current(asset_keys.BPE_TOKENIZER)
    bundle = serving_bundle_artifact.bundle

    result = lineage_json(store, capsys, "--affected-by", str(old_file))
    assert [m["raw_documents"] for m in result["affected_by"]["matches"]] == [old_raw.id]
    why = (
        f"clean_documents is now {new_clean.id}, trained on {old_clean.id}; raw_documents is now {new_raw.id}, "
        f"trained on {old_raw.id}; landed files that differ: legacy_gbk.csv"
    )
    [via] = result["via_tokenizer"]
    assert via == {
        "bpe_tokenizer": tokenizer.id,
        "current": True,
        "trained_on": [
            {
                "partition": PARTITION,
                "state": "changed",
                "trained_on": {CLEAN: old_clean.id, RAW: old_raw.id},
                "current": {CLEAN: new_clean.id, RAW: new_raw.id},
                "files": [
                    {
                        "name": "legacy_gbk.csv",
                        "path": str(landed),
                        "trained_sha256": source["sha256"],
                        "current_sha256": sha256_file(landed),
                    }
                ],
                "why": why,
            }
        ],
        "replaced": True,
        # tokenized x4 (the day's new one too), both dataset_manifests, the model, its report, its bundle
        "built_with_it": 9,
        "serving_bundle": [bundle.id],
        "retrain": [COMMAND],
    }
    # The day's new tokens and the new dataset read none of the old file's rows, yet depend on it.
    current_tokens = store.require_current(asset_keys.TOKENIZED_DOCUMENTS, PARTITION)
    affected = {(a["kind"], a["id"]) for a in result["artifacts"]}
    assert (current_tokens.kind, current_tokens.id) in affected
    assert (asset_keys.DATASET_MANIFEST, store.require_current(asset_keys.DATASET_MANIFEST).id) in affected

    text = lineage(store, capsys, "--affected-by", str(old_file))
    assert (
        f"via bpe_tokenizer {tokenizer.id} (current; trained on partition {PARTITION}, which read this file): every "
        f"token id of every partition depends on it; 9 artifacts were built with it, serving bundles {bundle.id}\n"
        f"  it was trained on a replaced version of partition {PARTITION}: {why}\n"
        f"  retrain it ({CONSEQUENCE}):\n"
        f"    {COMMAND}\n"
        "none of them was ever deployed to production\n"
    ) in text

    # The partition itself: the old and the new versions are seeds; the tokenizer saw the old one.
    text = lineage(store, capsys, "--affected-by", PARTITION)
    assert f"  it was trained on a replaced version of partition {PARTITION}: {why}\n" in text
    assert f"via bpe_tokenizer {tokenizer.id} (current; trained on this partition): " in text


def test_a_retired_tokenizer_is_shown_without_a_retrain(
    serving_bundle_artifact: BundledHome, copy_bundled_home, capsys: pytest.CaptureFixture[str]
) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    old_tokenizer = store.require_current(asset_keys.BPE_TOKENIZER)
    _reland_and_rebuild(store, serving_bundle_artifact)
    retrained = build_bpe_tokenizer(store, serving_bundle_artifact.config, retrain=True)
    result = lineage_json(store, capsys, "--affected-by", PARTITION)
    vias = {via["bpe_tokenizer"]: via for via in result["via_tokenizer"]}
    assert sorted(vias) == sorted([old_tokenizer.id, retrained.id])
    old, new = vias[old_tokenizer.id], vias[retrained.id]
    assert (old["current"], old["replaced"], old["retrain"]) == (False, True, [])
    assert [entry["state"] for entry in old["trained_on"]] == ["changed"]
    # The retrained one learned from the day's new version, and nothing was built with it yet.
    assert (new["current"], new["replaced"], new["built_with_it"], new["serving_bundle"]) == (True, False, 0, [])
    assert [entry["trained_on"][CLEAN] for entry in new["trained_on"]] == [store.require_current(CLEAN, PARTITION).id]
    text = lineage(store, capsys, "--affected-by", PARTITION)
    assert f"via bpe_tokenizer {old_tokenizer.id} (no longer current; trained on this partition): " in text
    assert "retrain it" not in text


def test_a_removed_partition_is_said_gone_with_a_command_per_run_of_days(
    serving_bundle_artifact: BundledHome, copy_bundled_home, capsys: pytest.CaptureFixture[str]
) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    tokenizer = store.require_current(asset_keys.BPE_TOKENIZER)
    for kind in (CLEAN, RAW):
        (store.refs / kind / f"{PARTITION}.json").unlink()
    text = lineage(store, capsys, "--affected-by", PARTITION)
    start = text.index(f"via bpe_tokenizer {tokenizer.id} (current; trained on this partition): ")
    lines = text[start:].splitlines()
    retrain = """--config-json '{"ops": {"bpe_tokenizer": {"config": {"retrain": true}}}}'"""
    assert lines[1:5] == [
        f"  it was trained on partition {PARTITION}, since gone: no current clean_documents for {PARTITION}: the "
        "partition was removed",
        f"  retrain it ({CONSEQUENCE}):",
        "    dagster asset materialize -m orchestration.definitions --select bpe_tokenizer,tokenized_documents "
        f"--partition 2026-01-01 {retrain}",
        "    dagster asset materialize -m orchestration.definitions --select tokenized_documents,dataset_manifest "
        "--partition 2026-01-03",
    ]
