"""The five data assets materialized by Dagster into a test instance, on the demo data."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest

from aieng_core.data import clean_documents as clean_core
from aieng_core.data import raw_documents as raw_core
from aieng_core.data.demo_data import land_demo_data
from aieng_core.data.reasons import ALL_REASONS
from aieng_core.data.tables import CLEAN_FILE
from aieng_core.dataset import dataset_manifest as manifest_core
from aieng_core.hashing import sha256_file, sha256_json
from aieng_core.store import ArtifactStore
from aieng_core.tokenizer import bpe_tokenizer as tokenizer_core
from aieng_core.tokenizer import tokenized_documents as tokenized_core
from orchestration.assets.data import clean_documents, raw_documents
from orchestration.assets.dataset import dataset_manifest
from orchestration.assets.tokenizer import bpe_tokenizer, tokenized_documents, tokenizer_round_trips
from tests.conftest import DEMO_PARTITIONS, land
from tests.core.helpers import jsonl, lowercasing_tokenizer, sentences
from tests.orchestration.helpers import (
    ALL_DEMO_DAYS,
    ASSETS,
    CHECK_NAMES,
    PARTITIONED_KEYS,
    check_outcomes,
    expected_counts,
    latest,
    materializations,
    meta,
    range_tags,
    resources,
    run_materializations,
    started_steps,
    step_failure_messages,
)

CODE_VERSIONS = {
    module.KIND: module.CODE_VERSION for module in (raw_core, clean_core, tokenizer_core, tokenized_core, manifest_core)
}
RETRAIN = {"ops": {"bpe_tokenizer": {"config": {"retrain": True}}}}


@dataclass
class Materialized:
    home: Path
    instance: dg.DagsterInstance
    results: dict[str, dg.ExecuteInProcessResult]

    @property
    def store(self) -> ArtifactStore:
        return ArtifactStore(self.home)


@pytest.fixture(scope="module")
def daily(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Materialized]:
    """The demo days materialized one partition per run, as the daily schedule would.

    Shared by the read-only tests below; tests that change state use their own home.
    """
    home = tmp_path_factory.mktemp("daily") / "aieng-home"
    home.mkdir()
    land_demo_data(home)
    with dg.instance_for_test() as instance:
        results = {
            partition: dg.materialize(ASSETS, instance=instance, resources=resources(home), partition_key=partition)
            for partition in DEMO_PARTITIONS
        }
        yield Materialized(home, instance, results)


# ---- one partition per run ----------------------------------------------------------------


@pytest.mark.parametrize("partition", DEMO_PARTITIONS)
def test_single_partition_run_succeeds_and_every_check_passes(daily: Materialized, partition: str) -> None:
    result = daily.results[partition]
    assert result.success
    assert check_outcomes(result) == {name: True for name in CHECK_NAMES}
    made = run_materializations(result)
    assert set(made) == {(key, partition) for key in PARTITIONED_KEYS} | {
        ("bpe_tokenizer", None),
        ("dataset_manifest", None),
    }


@pytest.mark.parametrize("partition", DEMO_PARTITIONS)
def test_clean_documents_metadata_counts_every_planted_dirty_row(daily: Materialized, partition: str) -> None:
    values = meta(latest(daily.instance, "clean_documents", partition))
    expected = expected_counts(partition)
    assert values["rows_in"] == expected["rows_in"]
    assert values["rows_clean"] == expected["rows_clean"]
    assert values["rows_quarantined"] == expected["rows_quarantined"]
    assert values["rows_in"] == values["rows_clean"] + values["rows_quarantined"]
    for reason in ALL_REASONS:
        assert values[f"quarantined_{reason}"] == expected["reasons"][reason], reason

    clean_sample = values["clean_sample"]
    assert len(clean_sample.records) == 5
    assert [column.name for column in clean_sample.schema.columns] == ["id", "text", "source_file", "line"]
    assert all(record.data["id"] and record.data["text"] for record in clean_sample.records)

    quarantine_sample = values["quarantine_sample"]
    assert [column.name for column in quarantine_sample.schema.columns] == [
        "reason",
        "detail",
        "source_file",
        "line",
        "raw",
    ]
    sampled = [record.data["reason"] for record in quarantine_sample.records]
    # Up to two rows of every reason that occurred, and no other reason.
    assert set(sampled) == {reason for reason, count in expected["reasons"].items() if count}
    assert all(sampled.count(reason) == min(2, expected["reasons"][reason]) for reason in set(sampled))


@pytest.mark.parametrize("key", PARTITIONED_KEYS)
@pytest.mark.parametrize("partition", DEMO_PARTITIONS)
def test_partition_materialization_names_its_artifact(daily: Materialized, key: str, partition: str) -> None:
    materialization = latest(daily.instance, key, partition)
    values = meta(materialization)
    artifact = daily.store.require_current(key, partition)
    assert values["artifact_id"] == artifact.id
    assert values["content_sha256"] == artifact.content_sha256
    assert Path(values["artifact_path"]) == artifact.path and artifact.path.is_dir()
    assert values["reused"] is False  # each partition was built once
    assert json.loads(json.dumps(values["inputs"])) == artifact.manifest["inputs"]
    # A single-partition run's data version is exactly that partition's content hash.
    assert materialization.tags["dagster/data_version"] == artifact.content_sha256
    assert materialization.tags["dagster/code_version"] == CODE_VERSIONS[key]
    assert artifact.manifest["code_version"] == CODE_VERSIONS[key]
    assert artifact.manifest["dagster_run_id"] == daily.results[partition].run_id


@pytest.mark.parametrize("partition", DEMO_PARTITIONS)
def test_input_ids_name_the_upstream_artifacts(daily: Materialized, partition: str) -> None:
    instance = daily.instance
    raw = meta(latest(instance, "raw_documents", partition))
    clean = meta(latest(instance, "clean_documents", partition))
    tokenized = meta(latest(instance, "tokenized_documents", partition))
    tokenizer_id = daily.store.require_current("bpe_tokenizer").id

    assert raw["input_ids"] == "none"
    assert raw["files"] >= 1 and raw["bytes"] > 0
    assert clean["input_ids"] == raw["artifact_id"]
    assert tokenized["input_ids"] == f"{clean['artifact_id']}, {tokenizer_id}"
    assert tokenized["tokenizer_id"] == tokenizer_id
    assert tokenized["rows"] == clean["rows_clean"]

    # Dagster's own lineage points at the raw materialization of the same partition. (Its
    # input_data_version tag of a partitioned upstream is a hash over partition versions, not
    # the upstream data version itself, so our manifests carry the lineage.)
    raw_record = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("raw_documents"), asset_partitions=[partition]), limit=1
    ).records[0]
    clean_tags = latest(instance, "clean_documents", partition).tags
    assert clean_tags["dagster/input_event_pointer/raw_documents"] == str(raw_record.storage_id)


def test_tokenizer_is_trained_once_then_pinned_across_days(daily: Materialized) -> None:
    runs = [meta(m) for m in materializations(daily.instance, "bpe_tokenizer")]
    assert len(runs) == len(DEMO_PARTITIONS)
    assert len({run["artifact_id"] for run in runs}) == 1
    assert [run["reused"] for run in runs] == [False, True, True]
    first_clean = daily.store.require_current("clean_documents", DEMO_PARTITIONS[0]).id
    # Trained when only the first day existed, and kept for the days after.
    assert runs[-1]["input_ids"] == first_clean
    assert runs[-1]["training_partitions"] == DEMO_PARTITIONS[0]
    assert runs[-1]["vocab_size"] <= 512
    materialization = latest(daily.instance, "bpe_tokenizer")
    assert materialization.tags["dagster/data_version"] == runs[-1]["content_sha256"]
    assert materialization.tags["dagster/code_version"] == tokenizer_core.CODE_VERSION


def test_dataset_manifest_covers_every_partition(daily: Materialized) -> None:
    runs = [meta(m) for m in materializations(daily.instance, "dataset_manifest")]
    assert [run["partitions"] for run in runs] == [1, 2, 3]
    values = runs[-1]
    store = daily.store
    artifact = store.require_current("dataset_manifest")
    tokenizer = store.require_current("bpe_tokenizer")
    tokenized = [store.require_current("tokenized_documents", p) for p in DEMO_PARTITIONS]
    assert values["artifact_id"] == artifact.id
    assert values["content_sha256"] == artifact.content_sha256
    assert values["input_ids"] == ", ".join([tokenizer.id, *(t.id for t in tokenized)])
    assert values["tokenizer_id"] == tokenizer.id
    assert values["rows"] == sum(expected_counts(p)["rows_clean"] for p in DEMO_PARTITIONS)
    assert values["tokens"] == sum(t.metrics["tokens"] for t in tokenized)
    assert values["train_tokens"] + values["validation_tokens"] == values["tokens"]
    assert values["validation_tokens"] > 0 and values["train_tokens"] > values["validation_tokens"]
    assert [record.data["partition"] for record in values["partition_table"].records] == DEMO_PARTITIONS
    materialization = latest(daily.instance, "dataset_manifest")
    assert materialization.tags["dagster/data_version"] == artifact.content_sha256
    assert materialization.tags["dagster/code_version"] == manifest_core.CODE_VERSION


# ---- a partition range in one run, and reuse -----------------------------------------------


def test_range_run_then_rerun_reuses_every_artifact(demo_home: Path, daily: Materialized) -> None:
    store = ArtifactStore(demo_home)
    with dg.instance_for_test() as instance:
        first = dg.materialize(ASSETS, instance=instance, resources=resources(demo_home), tags=ALL_DEMO_DAYS)
        assert first.success
        assert check_outcomes(first) == {name: True for name in CHECK_NAMES}
        made = run_materializations(first)
        assert set(made) == {(k, p) for k in PARTITIONED_KEYS for p in DEMO_PARTITIONS} | {
            ("bpe_tokenizer", None),
            ("dataset_manifest", None),
        }
        for key in PARTITIONED_KEYS:
            hashes = [meta(made[(key, p)])["content_sha256"] for p in DEMO_PARTITIONS]
            assert len(set(hashes)) == 3  # each partition carries its own metadata
            for partition, content_sha256 in zip(DEMO_PARTITIONS, hashes):
                values = meta(made[(key, partition)])
                assert values["artifact_id"] == store.require_current(key, partition).id
                assert values["artifact_id"].startswith(partition)
                assert content_sha256 == store.require_current(key, partition).content_sha256
                assert values["reused"] is False
            # One data version for the whole step: the hash of the partitions' content hashes.
            step_version = sha256_json([[p, h] for p, h in zip(DEMO_PARTITIONS, hashes)])
            assert {made[(key, p)].tags["dagster/data_version"] for p in DEMO_PARTITIONS} == {step_version}
        for key in ("raw_documents", "clean_documents"):
            # Same landed bytes, other home, other run shape: same artifacts, same content.
            for partition in DEMO_PARTITIONS:
                assert meta(made[(key, partition)])["artifact_id"] == daily.store.require_current(key, partition).id
                assert (
                    meta(made[(key, partition)])["content_sha256"]
                    == daily.store.require_current(key, partition).content_sha256
                )
        tokenizer = meta(made[("bpe_tokenizer", None)])
        assert tokenizer["training_partitions"] == ", ".join(DEMO_PARTITIONS)

        before = sorted(p.relative_to(store.root).as_posix() for p in store.root.glob("*/*"))
        again = dg.materialize(ASSETS, instance=instance, resources=resources(demo_home), tags=ALL_DEMO_DAYS)
        assert again.success
        assert check_outcomes(again) == {name: True for name in CHECK_NAMES}
        rerun = run_materializations(again)
        assert set(rerun) == set(made)
        for (key, partition), materialization in rerun.items():
            values = meta(materialization)
            assert values["reused"] is True, (key, partition)
            assert values["artifact_id"] == meta(made[(key, partition)])["artifact_id"]
            assert values["content_sha256"] == meta(made[(key, partition)])["content_sha256"]
            assert materialization.tags["dagster/data_version"] == made[(key, partition)].tags["dagster/data_version"]
        after = sorted(p.relative_to(store.root).as_posix() for p in store.root.glob("*/*"))
        assert after == before  # nothing new written, nothing set aside


def test_single_partition_rerun_reports_reused(demo_home: Path) -> None:
    selection = [raw_documents, clean_documents]
    with dg.instance_for_test() as instance:
        runs = [
            dg.materialize(
                ASSETS,
                selection=selection,
                instance=instance,
                resources=resources(demo_home),
                partition_key="2026-01-01",
            )
            for _ in range(2)
        ]
        assert all(run.success for run in runs)
        first, second = (run_materializations(run) for run in runs)
        assert set(second) == {("raw_documents", "2026-01-01"), ("clean_documents", "2026-01-01")}
        for key in second:
            assert meta(first[key])["reused"] is False and meta(second[key])["reused"] is True
            assert meta(second[key])["artifact_id"] == meta(first[key])["artifact_id"]
            assert second[key].tags["dagster/data_version"] == first[key].tags["dagster/data_version"]
        assert check_outcomes(runs[1]) == {"raw_snapshot_intact": True, "rows_accounted_for": True}


# ---- failures -------------------------------------------------------------------------------


def test_missing_raw_partition_fails_naming_the_folder(demo_home: Path) -> None:
    """Asked for alone, a day without a landing folder is refused (an empty folder is an empty
    day: tests/orchestration/test_empty_days.py)."""
    partition, phrase = "2026-01-05", "does not exist"
    folder = demo_home / "raw" / partition
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            ASSETS, instance=instance, resources=resources(demo_home), partition_key=partition, raise_on_error=False
        )
        assert not result.success
        failures = step_failure_messages(result)
        assert set(failures) == {"raw_documents"}
        assert str(folder) in failures["raw_documents"]
        assert phrase in failures["raw_documents"]
        assert started_steps(result) == {"raw_documents"}  # nothing downstream ran
        assert instance.fetch_materializations(dg.AssetKey("raw_documents"), limit=1).records == []
    assert ArtifactStore(demo_home).current("raw_documents", partition) is None


def test_missing_partition_inside_a_range_is_a_day_without_data(demo_home: Path) -> None:
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            ASSETS,
            instance=instance,
            resources=resources(demo_home),
            tags=range_tags("2026-01-03", "2026-01-04"),
            raise_on_error=False,
        )
        assert result.success
        missing = meta(latest(instance, "raw_documents", "2026-01-04"))
        assert (missing["no_data"], missing["landing_folder"], missing["files"]) == (True, "absent", 0)
        assert meta(latest(instance, "raw_documents", "2026-01-03"))["no_data"] is False
    assert ArtifactStore(demo_home).require_current("raw_documents", "2026-01-04").metrics["no_data"] is True


def _drop_last_clean_row(store: ArtifactStore, partition: str) -> int:
    """Rewrite a clean artifact's clean.parquet without its last row and re-sign the file in its
    manifest, so the artifact still verifies and only the row accounting is off."""
    artifact = store.require_current("clean_documents", partition)
    path = artifact.file(CLEAN_FILE)
    table = pq.read_table(path)
    pq.write_table(table.slice(0, table.num_rows - 1), path)
    manifest_path = artifact.path / "manifest.json"
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    manifest["files"][CLEAN_FILE] = sha256_file(path)
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True), encoding="utf-8")
    assert store.verify(store.require_current("clean_documents", partition)) == []
    return table.num_rows - 1


def test_failing_blocking_check_stops_downstream_steps(demo_home: Path) -> None:
    store = ArtifactStore(demo_home)
    partition = "2026-01-01"
    with dg.instance_for_test() as instance:
        assert dg.materialize(
            ASSETS, instance=instance, resources=resources(demo_home), partition_key=partition
        ).success
        tokenized_before = store.require_current("tokenized_documents", partition).id
        rows_left = _drop_last_clean_row(store, partition)

        result = dg.materialize(
            ASSETS,
            selection=[clean_documents, tokenized_documents],
            instance=instance,
            resources=resources(demo_home),
            partition_key=partition,
            raise_on_error=False,
        )
        assert not result.success
        # clean_documents re-verifies the artifact (it still matches its manifest) and reuses it...
        clean = meta(run_materializations(result)[("clean_documents", partition)])
        assert clean["reused"] is True
        assert clean["rows_clean"] == expected_counts(partition)["rows_clean"]  # the manifest's claim
        # ...but the check counts the rows in the Parquet files themselves.
        evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
        accounting = evaluations["rows_accounted_for"]
        assert accounting.passed is False
        assert accounting.severity == dg.AssetCheckSeverity.ERROR
        assert partition in accounting.description
        values = {k: v.value for k, v in accounting.metadata.items()}
        assert values["failed_partitions"] == partition
        assert values["counts"][partition]["rows_clean"] == rows_left
        assert values["counts"][partition]["passed"] is False
        # The blocking check stopped the downstream step of the same run.
        assert "tokenized_documents" not in started_steps(result)
        assert ("tokenized_documents", partition) not in run_materializations(result)
        assert len(materializations(instance, "tokenized_documents", partition)) == 1
    assert store.require_current("tokenized_documents", partition).id == tokenized_before


# ---- the tokenizer: pinned, and retrained on request ----------------------------------------


def test_tokenizer_is_pinned_until_retrain_is_requested(demo_home: Path) -> None:
    store = ArtifactStore(demo_home)
    res = resources(demo_home)
    old_day, new_day = DEMO_PARTITIONS[0], DEMO_PARTITIONS[1]
    with dg.instance_for_test() as instance:
        # One day through the whole graph, then the next day's clean data only.
        assert dg.materialize(ASSETS, instance=instance, resources=res, partition_key=old_day).success
        first = store.require_current("bpe_tokenizer")
        assert first.metrics["training_partitions"] == [old_day]
        assert dg.materialize(
            ASSETS, selection=[raw_documents, clean_documents], instance=instance, resources=res, partition_key=new_day
        ).success

        pinned = dg.materialize(ASSETS, selection=[bpe_tokenizer], instance=instance, resources=res)
        assert pinned.success
        values = meta(run_materializations(pinned)[("bpe_tokenizer", None)])
        assert values["artifact_id"] == first.id and values["reused"] is True
        assert values["training_partitions"] == old_day

        retrained = dg.materialize(
            ASSETS, selection=[bpe_tokenizer], instance=instance, resources=res, run_config=RETRAIN
        )
        assert retrained.success
        assert check_outcomes(retrained) == {"tokenizer_round_trips": True, "tokenizer_inputs_current": True}
        materialization = run_materializations(retrained)[("bpe_tokenizer", None)]
        values = meta(materialization)
        assert values["artifact_id"] != first.id and values["reused"] is False
        assert values["training_partitions"] == f"{old_day}, {new_day}"
        assert values["input_ids"] == ", ".join(
            store.require_current("clean_documents", p).id for p in (old_day, new_day)
        )
        assert store.require_current("bpe_tokenizer").id == values["artifact_id"]
        assert materialization.tags["dagster/data_version"] == values["content_sha256"]
        assert (store.root / "bpe_tokenizer" / first.id).is_dir()  # the old tokenizer is kept

        # Retraining over unchanged inputs finds the identical artifact.
        again = dg.materialize(ASSETS, selection=[bpe_tokenizer], instance=instance, resources=res, run_config=RETRAIN)
        again_values = meta(run_materializations(again)[("bpe_tokenizer", None)])
        assert again_values["artifact_id"] == values["artifact_id"] and again_values["reused"] is True

        # The old day was tokenized with the old tokenizer: the dataset refuses to mix them.
        stale = dg.materialize(
            ASSETS, selection=[dataset_manifest], instance=instance, resources=res, raise_on_error=False
        )
        assert not stale.success
        message = step_failure_messages(stale)["dataset_manifest"]
        assert old_day in message and values["artifact_id"] in message

        # Re-tokenizing the range brings everything onto the new tokenizer.
        fixed = dg.materialize(
            ASSETS,
            selection=[tokenized_documents, dataset_manifest],
            instance=instance,
            resources=res,
            tags=range_tags(old_day, new_day),
        )
        assert fixed.success
        assert check_outcomes(fixed) == {"tokenized_matches_clean": True, "dataset_manifest_intact": True}
        manifest = meta(run_materializations(fixed)[("dataset_manifest", None)])
        assert manifest["partitions"] == 2 and manifest["tokenizer_id"] == values["artifact_id"]


def test_round_trip_check_reads_every_clean_row(tmp_path: Path) -> None:
    """Row 250 of 300 is the only one the tokenizer cannot give back: a check that samples
    the first rows of each partition would pass."""
    home = tmp_path / "aieng-home"
    texts = [text.lower() for text in sentences(300, seed=5)]
    texts[250] = "Only this one document has Capital letters in it."
    land(home, "2026-01-01", "docs.jsonl", jsonl(*[{"id": f"doc-{i}", "text": t} for i, t in enumerate(texts)]))
    res = resources(home)
    with dg.instance_for_test() as instance:
        assert dg.materialize(
            ASSETS,
            selection=[raw_documents, clean_documents],
            instance=instance,
            resources=res,
            partition_key="2026-01-01",
        ).success
        lowercasing_tokenizer(ArtifactStore(home), texts)
        result = dg.materialize(
            ASSETS,
            selection=dg.AssetSelection.checks(tokenizer_round_trips),
            instance=instance,
            resources=res,
            raise_on_error=False,
        )
    [evaluation] = result.get_asset_check_evaluations()
    assert evaluation.check_name == "tokenizer_round_trips" and evaluation.passed is False
    values = {key: value.value for key, value in evaluation.metadata.items()}
    assert values == {"partitions_checked": 1, "texts_checked": 300, "failures": 1, "failing_ids": "2026-01-01/doc-250"}
    assert evaluation.description == "1 of 300 clean rows do not round-trip"
