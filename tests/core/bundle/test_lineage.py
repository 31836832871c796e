"""The bundle's inputs chain reaches every upstream artifact, down to the raw file hashes."""

from __future__ import annotations

import shutil

import pytest

from aieng_core import asset_keys
from aieng_core.hashing import sha256_file
from aieng_core.serving.chat_template import template_sha256
from aieng_core.store import ArtifactNotFound
from aieng_core.store.lineage import lineage_summary, upstream
from tests.bundle_fixtures import BundledHome
from tests.conftest import DEMO_PARTITIONS


def test_upstream_walks_down_to_the_raw_snapshots(serving_bundle_artifact: BundledHome) -> None:
    store, bundle = serving_bundle_artifact.store, serving_bundle_artifact.bundle
    chain = upstream(store, bundle)
    kinds = [a.kind for a in chain]
    # Nearest first: the model and its benchmark report, then the dataset and tokenizer, then
    # partitions, then raw.
    assert kinds[:4] == [
        asset_keys.MODEL_CHECKPOINT,
        asset_keys.BENCHMARK_REPORT,
        asset_keys.DATASET_MANIFEST,
        asset_keys.BPE_TOKENIZER,
    ]
    assert sorted(kinds) == sorted(
        [
            asset_keys.MODEL_CHECKPOINT,
            asset_keys.BENCHMARK_REPORT,
            asset_keys.DATASET_MANIFEST,
            asset_keys.BPE_TOKENIZER,
        ]
        + [asset_keys.TOKENIZED_DOCUMENTS, asset_keys.CLEAN_DOCUMENTS, asset_keys.RAW_DOCUMENTS] * 3
    )
    assert len({(a.kind, a.id) for a in chain}) == len(chain)  # each once, though two paths reach clean
    assert chain[0].id == serving_bundle_artifact.model.id
    raw = [a for a in chain if a.kind == asset_keys.RAW_DOCUMENTS]
    assert sorted(a.manifest["partition"] for a in raw) == DEMO_PARTITIONS
    # Every landed file's hash is in the chain, and matches the file still landed.
    landed = sorted((serving_bundle_artifact.home / "raw").glob("*/*"))
    recorded = {source["path"]: source["sha256"] for a in raw for source in a.manifest["sources"]}
    assert len(recorded) == len(landed) == 5
    for path in landed:
        assert recorded[str(path)] == sha256_file(path), path


def test_the_manifest_carries_the_lineage_summary(serving_bundle_artifact: BundledHome) -> None:
    store, bundle = serving_bundle_artifact.store, serving_bundle_artifact.bundle
    model = serving_bundle_artifact.model
    report = store.get(asset_keys.BENCHMARK_REPORT, bundle.metrics["benchmark_report_id"])
    dataset = store.require_current(asset_keys.DATASET_MANIFEST)
    summary = bundle.manifest["lineage"]
    assert summary == {
        "model_checkpoint": model.id,
        "dataset_manifest": dataset.id,
        "bpe_tokenizer": dataset.manifest["tokenizer_id"],
        "partitions": DEMO_PARTITIONS,
        "raw_documents": sorted(store.require_current(asset_keys.RAW_DOCUMENTS, p).id for p in DEMO_PARTITIONS),
        "raw_source_files": 5,
        "artifacts": 13,  # the report, model, dataset, tokenizer, and 3 x (tokenized, clean, raw)
        # The bundle's own part: what renders a chat's prompt.
        "chat_template_sha256": template_sha256(serving_bundle_artifact.config.bundle.chat_template),
    }
    assert {**lineage_summary(store, report), "chat_template_sha256": bundle.metrics["chat_template_sha256"]} == summary


def test_a_missing_upstream_artifact_is_named(serving_bundle_artifact: BundledHome, copy_bundled_home) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    tokenizer = store.require_current(asset_keys.BPE_TOKENIZER)
    shutil.rmtree(tokenizer.path)
    with pytest.raises(ArtifactNotFound, match=f"no bpe_tokenizer artifact '{tokenizer.id}'"):
        upstream(store, store.require_current(asset_keys.SERVING_BUNDLE))
