"""The daily ingest: the schedule asks for yesterday's partition, and a new day leaves the
tokenizer and the old days' artifacts alone while the dataset grows."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path

import dagster as dg
import pytest

from aieng_core.data.demo_data import EXPECTED_DIRTY, land_demo_data
from aieng_core.data.reasons import ALL_REASONS
from aieng_core.store import ArtifactStore
from orchestration.definitions import defs
from orchestration.resources import AiengResource
from tests.conftest import DEMO_PARTITIONS
from tests.orchestration.helpers import (
    ALL_DEMO_DAYS,
    CHECK_NAMES,
    PARTITIONED_KEYS,
    check_outcomes,
    meta,
    run_materializations,
)

NEW_DAY = "2026-01-04"


def tick(instance: dg.DagsterInstance, when: datetime) -> list[dg.RunRequest]:
    context = dg.build_schedule_context(
        instance=instance,
        scheduled_execution_time=when,
        repository_def=defs.get_repository_def(),
        resources={"aieng": AiengResource()},  # $AIENG_HOME, $AIENG_CONFIG
    )
    schedule = defs.resolve_schedule_def("daily_ingest_schedule")
    return list(schedule.evaluate_tick(context).run_requests or [])


@pytest.mark.parametrize(
    ("when", "partition"),
    [
        (datetime(2026, 1, 5, 1, 0, tzinfo=UTC), "2026-01-04"),
        (datetime(2026, 1, 2, 1, 0, tzinfo=UTC), "2026-01-01"),
        (datetime(2026, 3, 1, 1, 0, tzinfo=UTC), "2026-02-28"),
    ],
)
def test_schedule_requests_the_previous_day(home: Path, when: datetime, partition: str) -> None:
    assert defs.resolve_schedule_def("daily_ingest_schedule").job_name == "daily_ingest"
    (home / "raw" / partition).mkdir(parents=True)  # the day has a landing folder ($AIENG_HOME)
    with dg.instance_for_test() as instance:
        requests = tick(instance, when)
    assert [request.partition_key for request in requests] == [partition]
    assert requests[0].job_name in (None, "daily_ingest")


def test_new_day_keeps_the_tokenizer_and_old_partitions(demo_home: Path) -> None:
    """Backfill the demo days through the job, land a fourth day, run what the schedule asks."""
    store = ArtifactStore(demo_home)
    job = defs.resolve_job_def("daily_ingest")  # resources from AIENG_HOME / AIENG_CONFIG
    with dg.instance_for_test() as instance:
        backfill = job.execute_in_process(instance=instance, tags=ALL_DEMO_DAYS)
        assert backfill.success
        tokenizer_before = store.require_current("bpe_tokenizer")
        tokenized_before = {p: store.require_current("tokenized_documents", p).id for p in DEMO_PARTITIONS}
        clean_before = {p: store.require_current("clean_documents", p).id for p in DEMO_PARTITIONS}
        manifest_before = store.require_current("dataset_manifest")

        land_demo_data(demo_home, start_date=date(2026, 1, 4), days=1)
        [request] = tick(instance, datetime(2026, 1, 5, 1, 0, tzinfo=UTC))
        assert request.partition_key == NEW_DAY
        result = job.execute_in_process(instance=instance, partition_key=request.partition_key, tags=request.tags)

        assert result.success
        assert result.dagster_run.tags["dagster/partition"] == NEW_DAY
        assert check_outcomes(result) == {name: True for name in CHECK_NAMES}
        made = run_materializations(result)
        assert set(made) == {(key, NEW_DAY) for key in PARTITIONED_KEYS} | {
            ("bpe_tokenizer", None),
            ("dataset_manifest", None),
        }

        # The tokenizer stays pinned: same artifact, reused, still trained on the first three days.
        tokenizer = meta(made[("bpe_tokenizer", None)])
        assert tokenizer["artifact_id"] == tokenizer_before.id and tokenizer["reused"] is True
        assert tokenizer["training_partitions"] == ", ".join(DEMO_PARTITIONS)
        assert store.require_current("bpe_tokenizer").id == tokenizer_before.id
        assert store.list_ids("bpe_tokenizer") == [tokenizer_before.id]

        # Old days are neither re-cleaned nor re-tokenized.
        assert {p: store.require_current("tokenized_documents", p).id for p in DEMO_PARTITIONS} == tokenized_before
        assert {p: store.require_current("clean_documents", p).id for p in DEMO_PARTITIONS} == clean_before
        assert sorted(store.list_ids("tokenized_documents")) == sorted(
            [*tokenized_before.values(), meta(made[("tokenized_documents", NEW_DAY)])["artifact_id"]]
        )
        for partition in DEMO_PARTITIONS:
            records = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey("tokenized_documents"), asset_partitions=[partition]),
                limit=10,
            ).records
            assert [record.run_id for record in records] == [backfill.run_id]

        # The new day: landed like day 1 (JSONL with its planted dirty rows), tokenized with the pinned tokenizer.
        clean = meta(made[("clean_documents", NEW_DAY)])
        for reason in ALL_REASONS:
            assert clean[f"quarantined_{reason}"] == EXPECTED_DIRTY["day1"].get(reason, 0), reason
        tokenized = meta(made[("tokenized_documents", NEW_DAY)])
        assert tokenized["tokenizer_id"] == tokenizer_before.id
        assert tokenized["input_ids"] == f"{clean['artifact_id']}, {tokenizer_before.id}"

        # The dataset now covers four partitions, the old three unchanged.
        manifest = meta(made[("dataset_manifest", None)])
        assert manifest["partitions"] == 4
        assert manifest["tokenizer_id"] == tokenizer_before.id
        assert manifest["input_ids"] == ", ".join(
            [tokenizer_before.id, *tokenized_before.values(), tokenized["artifact_id"]]
        )
        assert manifest["rows"] == manifest_before.metrics["rows"] + tokenized["rows"]
        assert manifest["content_sha256"] != manifest_before.content_sha256
        assert [record.data["partition"] for record in manifest["partition_table"].records] == [
            *DEMO_PARTITIONS,
            NEW_DAY,
        ]
        assert made[("dataset_manifest", None)].tags["dagster/data_version"] == manifest["content_sha256"]
