"""Through Dagster: a range over a day with data, an empty day and a day without a landing
folder succeeds, each partition saying what it held; a first day that is empty succeeds too,
training no tokenizer."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import dagster as dg

from aieng_core.data.demo_data import land_demo_data
from aieng_core.status import pipeline_status
from aieng_core.store import ArtifactStore
from orchestration.definitions import defs
from tests.orchestration.helpers import check_outcomes, materializations, meta, range_tags, run_materializations

START = dt.date(2026, 1, 1)  # data.start_date of the test configs

DATA, EMPTY, ABSENT = "2026-01-01", "2026-01-02", "2026-01-03"


def test_a_range_over_data_empty_and_missing_days_succeeds(home: Path) -> None:
    land_demo_data(home, start_date=dt.date(2026, 1, 1), days=1)
    (home / "raw" / EMPTY).mkdir()
    job = defs.resolve_job_def("daily_ingest")  # resources from AIENG_HOME / AIENG_CONFIG
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(instance=instance, tags=range_tags(DATA, ABSENT))
        assert result.success
        assert set(check_outcomes(result).values()) == {True}
        made = run_materializations(result)
        raw = {p: meta(made[("raw_documents", p)]) for p in (DATA, EMPTY, ABSENT)}
        assert [(raw[p]["no_data"], raw[p]["landing_folder"], raw[p]["files"]) for p in (DATA, EMPTY, ABSENT)] == [
            (False, "landed", 1),
            (True, "empty", 0),
            (True, "absent", 0),
        ]
        clean = {p: meta(made[("clean_documents", p)]) for p in (DATA, EMPTY, ABSENT)}
        assert [clean[p]["rows_in"] == 0 for p in (DATA, EMPTY, ABSENT)] == [False, True, True]
        tokenized = meta(made[("tokenized_documents", EMPTY)])
        assert (tokenized["rows"], tokenized["tokens"], tokenized["no_data"]) == (0, 0, True)
        # Every partition of the range is materialized once, none failed.
        for partition in (DATA, EMPTY, ABSENT):
            assert len(materializations(instance, "clean_documents", partition)) == 1
        assert instance.get_materialized_partitions(dg.AssetKey("raw_documents")) == {DATA, EMPTY, ABSENT}
    # The store says the same as the UI.
    status = pipeline_status(ArtifactStore(home), START)
    assert {p: item["no_data"] for p, item in status["assets"]["raw_documents"].items()} == {
        DATA: False,
        EMPTY: True,
        ABSENT: True,
    }


def test_a_first_day_without_data_succeeds_and_trains_nothing(home: Path) -> None:
    (home / "raw" / EMPTY).mkdir(parents=True)
    job = defs.resolve_job_def("daily_ingest")
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(instance=instance, partition_key=EMPTY)
        assert result.success
        made = run_materializations(result)
        assert set(made) == {("raw_documents", EMPTY), ("clean_documents", EMPTY)}
        assert meta(made[("raw_documents", EMPTY)])["no_data"] is True
    assert ArtifactStore(home).current("bpe_tokenizer") is None
