"""The pinned tokenizer's inputs against what is current (aieng_core/tokenizer/tokenizer_inputs.py),
on copies of the demo home built through dataset_manifest."""

from __future__ import annotations

import pytest

from aieng_core import asset_keys
from aieng_core.data.clean_documents import build_clean_documents
from aieng_core.data.raw_documents import build_raw_documents
from aieng_core.hashing import sha256_file
from aieng_core.store import ArtifactNotFound, ArtifactStore
from aieng_core.tokenizer.bpe_tokenizer import build_bpe_tokenizer
from aieng_core.tokenizer.tokenizer_inputs import retrain_commands, summary, tokenizer_inputs_report
from tests.conftest import DEMO_PARTITIONS, land
from tests.core.helpers import BuiltHome, build_data, jsonl, sentences

CLEAN, RAW = asset_keys.CLEAN_DOCUMENTS, asset_keys.RAW_DOCUMENTS
MATERIALIZE = "dagster asset materialize -m orchestration.definitions"
RETRAIN = """--config-json '{"ops": {"bpe_tokenizer": {"config": {"retrain": true}}}}'"""
ALL_DAYS_COMMAND = (
    f"{MATERIALIZE} --select bpe_tokenizer,tokenized_documents,dataset_manifest "
    f"--partition-range 2026-01-01...2026-01-03 {RETRAIN}"
)


@pytest.fixture
def copied(built_demo: BuiltHome, copy_home) -> ArtifactStore:
    return ArtifactStore(copy_home(built_demo))


def ids(store: ArtifactStore, partition: str) -> dict[str, str | None]:
    return {kind: (a.id if (a := store.current(kind, partition)) else None) for kind in (CLEAN, RAW)}


def states(report: dict) -> dict[str, str]:
    return {entry["partition"]: entry["state"] for entry in report["partitions"]}


def test_nothing_changed_passes(built_demo: BuiltHome) -> None:
    report = tokenizer_inputs_report(built_demo.store)
    assert report["passed"] is True
    assert report["bpe_tokenizer"] == built_demo.tokenizer.id
    assert report["counts"] == {"unchanged": 3, "changed": 0, "gone": 0, "new": 0}
    for entry, partition in zip(report["partitions"], DEMO_PARTITIONS):
        clean = built_demo.clean[partition]
        expected = {CLEAN: clean.id, RAW: built_demo.raw[partition].id}
        assert entry == {
            "partition": partition,
            "state": "unchanged",
            "trained_on": expected,
            "current": expected,
            "files": [],
            "why": f"clean_documents {clean.id} is still current",
        }
    assert report["retrain"] == [ALL_DAYS_COMMAND]
    assert summary(report) == (
        f"bpe_tokenizer {built_demo.tokenizer.id}: the 3 partitions it was trained on are unchanged"
    )


def test_a_relanded_changed_file_is_named(built_demo: BuiltHome, copied: ArtifactStore) -> None:
    partition = "2026-01-01"
    landed = copied.home / "raw" / partition / "documents.jsonl"
    before = sha256_file(landed)
    with open(landed, "ab") as handle:  # a late correction to the day's file
        handle.write(jsonl({"id": "late-1", "text": sentences(1, seed=9)[0]}))
    raw = build_raw_documents(copied, built_demo.config, partition)
    clean = build_clean_documents(copied, built_demo.config, partition)
    assert build_bpe_tokenizer(copied, built_demo.config).reused  # pinned: still the old one

    report = tokenizer_inputs_report(copied)
    assert report["passed"] is False
    assert report["counts"] == {"unchanged": 2, "changed": 1, "gone": 0, "new": 0}
    [entry] = [e for e in report["partitions"] if e["state"] == "changed"]
    old_clean, old_raw = built_demo.clean[partition].id, built_demo.raw[partition].id
    assert entry["trained_on"] == {CLEAN: old_clean, RAW: old_raw}
    assert entry["current"] == {CLEAN: clean.id, RAW: raw.id} and clean.id != old_clean
    assert entry["files"] == [
        {
            "name": "documents.jsonl",
            "path": str(landed),
            "trained_sha256": before,
            "current_sha256": sha256_file(landed),
        }
    ]
    assert entry["why"] == (
        f"clean_documents is now {clean.id}, trained on {old_clean}; raw_documents is now {raw.id}, trained on "
        f"{old_raw}; landed files that differ: documents.jsonl"
    )
    assert report["retrain"] == [ALL_DAYS_COMMAND]
    assert summary(report) == (
        f"bpe_tokenizer {built_demo.tokenizer.id} was trained on partitions that have since changed (2026-01-01). "
        f"Retrain it: `{ALL_DAYS_COMMAND}`. Not blocking: retraining changes every token id: every partition is "
        "re-tokenized, and the dataset_manifest, model and serving bundles built after it are all new"
    )

    # Retrained on what is current now, it passes again.
    build_bpe_tokenizer(copied, built_demo.config, retrain=True)
    assert tokenizer_inputs_report(copied)["counts"] == {"unchanged": 3, "changed": 0, "gone": 0, "new": 0}


def test_the_cleaning_alone_changing_is_a_change_with_no_file(built_demo: BuiltHome, copied: ArtifactStore) -> None:
    stricter = built_demo.config.model_copy(
        update={"data": built_demo.config.data.model_copy(update={"min_chars": built_demo.config.data.min_chars + 5})}
    )
    clean = build_clean_documents(copied, stricter, "2026-01-02")
    [entry] = [e for e in tokenizer_inputs_report(copied)["partitions"] if e["partition"] == "2026-01-02"]
    assert entry["state"] == "changed" and entry["files"] == []
    assert entry["why"] == (
        f"clean_documents is now {clean.id}, trained on {built_demo.clean['2026-01-02'].id}; same raw snapshot: "
        "the cleaning changed (its code version or config)"
    )


@pytest.mark.parametrize("removed", [(CLEAN, RAW), (RAW,)])
def test_a_partition_whose_refs_were_removed_is_gone(
    built_demo: BuiltHome, copied: ArtifactStore, removed: tuple[str, ...]
) -> None:
    for kind in removed:
        (copied.refs / kind / "2026-01-03.json").unlink()
    report = tokenizer_inputs_report(copied)
    assert report["passed"] is False
    assert states(report) == {"2026-01-01": "unchanged", "2026-01-02": "unchanged", "2026-01-03": "gone"}
    [entry] = [e for e in report["partitions"] if e["state"] == "gone"]
    assert entry["why"] == f"no current {removed[0]} for 2026-01-03: the partition was removed"
    assert entry["current"] == ids(copied, "2026-01-03")
    assert "that have since gone (2026-01-03)" in summary(report)
    # The retrain trains on the partitions whose clean text is current.
    days = "2026-01-03" if removed == (RAW,) else "2026-01-02"
    assert report["retrain"] == [
        f"{MATERIALIZE} --select bpe_tokenizer,tokenized_documents,dataset_manifest "
        f"--partition-range 2026-01-01...{days} {RETRAIN}"
    ]


def test_a_landing_folder_emptied_after_ingest_changes_nothing(built_demo: BuiltHome, copied: ArtifactStore) -> None:
    """Cleaning up a landing folder loses nothing: the day keeps its snapshot (raw_documents),
    so what the tokenizer was trained on is unchanged."""
    before = copied.require_current("raw_documents", "2026-01-02").id
    for path in (copied.home / "raw" / "2026-01-02").iterdir():
        path.unlink()
    raw = build_raw_documents(copied, built_demo.config, "2026-01-02")
    build_clean_documents(copied, built_demo.config, "2026-01-02")
    assert raw.id == before and raw.reused
    [entry] = [e for e in tokenizer_inputs_report(copied)["partitions"] if e["partition"] == "2026-01-02"]
    assert entry["state"] == "unchanged"


def test_a_new_partition_is_listed_and_still_passes(built_demo: BuiltHome, copied: ArtifactStore) -> None:
    # 2026-01-05: a day after a gap, so re-tokenizing takes a second range.
    land(
        copied.home,
        "2026-01-05",
        "late.jsonl",
        jsonl(*({"id": f"n{i}", "text": t} for i, t in enumerate(sentences(20)))),
    )
    clean = build_data(copied, built_demo.config, ["2026-01-05"])["2026-01-05"]
    report = tokenizer_inputs_report(copied)
    assert report["passed"] is True
    assert report["counts"] == {"unchanged": 3, "changed": 0, "gone": 0, "new": 1}
    assert report["partitions"][-1] == {
        "partition": "2026-01-05",
        "state": "new",
        "trained_on": {CLEAN: None, RAW: None},
        "current": ids(copied, "2026-01-05"),
        "files": [],
        "why": f"current clean_documents {clean.id}; the pinned tokenizer never saw it",
    }
    assert summary(report) == (
        f"bpe_tokenizer {built_demo.tokenizer.id}: the 3 partitions it was trained on are unchanged; 1 new "
        "partitions it never saw (2026-01-05): expected, it is pinned"
    )
    assert report["retrain"] == [
        f"{MATERIALIZE} --select bpe_tokenizer,tokenized_documents --partition-range 2026-01-01...2026-01-03 {RETRAIN}",
        f"{MATERIALIZE} --select tokenized_documents,dataset_manifest --partition 2026-01-05",
    ]


def test_retrain_commands_cover_each_run_of_days() -> None:
    assert retrain_commands([]) == [f"{MATERIALIZE} --select bpe_tokenizer {RETRAIN}"]
    assert retrain_commands(["2026-01-07"]) == [
        f"{MATERIALIZE} --select bpe_tokenizer,tokenized_documents,dataset_manifest --partition 2026-01-07 {RETRAIN}"
    ]
    # Unsorted input, a month boundary inside a run, then a gap: two runs of days.
    assert retrain_commands(["2026-02-01", "2026-01-31", "2026-01-29", "2026-03-01", "2026-01-30"]) == [
        f"{MATERIALIZE} --select bpe_tokenizer,tokenized_documents --partition-range 2026-01-29...2026-02-01 {RETRAIN}",
        f"{MATERIALIZE} --select tokenized_documents,dataset_manifest --partition 2026-03-01",
    ]


def test_no_tokenizer_is_an_error_naming_it(store: ArtifactStore) -> None:
    with pytest.raises(ArtifactNotFound, match="bpe_tokenizer has not been materialized"):
        tokenizer_inputs_report(store)


def test_the_report_reads_the_refs_not_the_landing_folder(built_demo: BuiltHome, copied: ArtifactStore) -> None:
    # A file landed but not yet ingested changes nothing the tokenizer was trained on.
    land(copied.home, "2026-01-02", "unread.jsonl", jsonl({"id": "u1", "text": sentences(1, seed=5)[0]}))
    report = tokenizer_inputs_report(copied)
    assert report["passed"] is True
    assert report["counts"] == {"unchanged": 3, "changed": 0, "gone": 0, "new": 0}
