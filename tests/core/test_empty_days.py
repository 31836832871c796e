"""Empty days are ordinary: an empty landing folder, or a day without one inside a range,
goes through the data half as an empty partition that the dataset manifest records and
training ignores; `aieng data status` tells them apart from days never ingested."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from aieng_core.data.clean_documents import build_clean_documents
from aieng_core.data.demo_data import land_demo_data
from aieng_core.data.raw_documents import MissingPartitionData, build_raw_documents
from aieng_core.dataset.dataset_manifest import build_dataset_manifest, read_dataset
from aieng_core.status import format_status, pipeline_status
from aieng_core.store import ArtifactStore
from aieng_core.tokenizer.bpe_tokenizer import NoCleanText, build_bpe_tokenizer
from aieng_core.tokenizer.tokenized_documents import build_tokenized_documents
from tests.conftest import land
from tests.core.helpers import jsonl

START = dt.date(2026, 1, 1)  # data.start_date of the test configs

DATA, EMPTY, ABSENT, LANDED_ONLY = "2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04"


def ingest(store: ArtifactStore, config, partition: str, absent_ok: bool = False) -> None:
    build_raw_documents(store, config, partition, absent_ok=absent_ok)
    build_clean_documents(store, config, partition)


def test_empty_and_absent_days_flow_through_and_are_told_apart(home: Path, tiny_config) -> None:
    store = ArtifactStore(home)
    land_demo_data(home, start_date=dt.date(2026, 1, 1), days=1)
    (home / "raw" / EMPTY).mkdir()
    with pytest.raises(MissingPartitionData, match=f"raw partition folder {home / 'raw' / ABSENT} does not exist"):
        build_raw_documents(store, tiny_config, ABSENT)  # asked for alone: most likely a mistyped date
    for partition, absent_ok in ((DATA, False), (EMPTY, False), (ABSENT, True)):
        ingest(store, tiny_config, partition, absent_ok)
    tokenizer = build_bpe_tokenizer(store, tiny_config)
    assert tokenizer.metrics["training_partitions"] == [DATA]  # nothing to learn from an empty day
    tokenized = {p: build_tokenized_documents(store, tiny_config, p) for p in (DATA, EMPTY, ABSENT)}
    assert [(t.metrics["rows"], t.metrics["tokens"], t.metrics["no_data"]) for t in tokenized.values()][1:] == [
        (0, 0, True),
        (0, 0, True),
    ]
    manifest = build_dataset_manifest(store, tiny_config)
    dataset = read_dataset(manifest)
    entries = {entry["partition"]: entry for entry in dataset["partitions"]}
    assert sorted(entries) == [DATA, EMPTY, ABSENT]
    assert [entries[p].get("no_data") for p in (DATA, EMPTY, ABSENT)] == [None, True, True]
    assert (entries[EMPTY]["rows"], entries[EMPTY]["tokens"], entries[EMPTY]["train_tokens"]) == (0, 0, 0)
    assert manifest.metrics["partitions_without_data"] == [EMPTY, ABSENT]
    assert dataset["totals"]["tokens"] == tokenized[DATA].metrics["tokens"]  # training reads only day 1's tokens

    land(home, LANDED_ONLY, "a.jsonl", jsonl({"id": "a", "text": "Landed, never ingested, a whole document."}))
    status = pipeline_status(store, START)
    assert {p: item["no_data"] for p, item in status["assets"]["clean_documents"].items()} == {
        DATA: False,
        EMPTY: True,
        ABSENT: True,
    }
    assert status["landing"]["partitions"] == {
        DATA: {"files": 1, "state": "ingested"},
        EMPTY: {"files": 0, "state": "ingested"},
        LANDED_ONLY: {"files": 1, "state": "not ingested"},
    }
    text = format_status(status).splitlines()
    raw_id, absent_id = (store.require_current("raw_documents", p).id for p in (EMPTY, ABSENT))
    assert f"  {EMPTY}  {raw_id}  no data: empty landing folder" in text
    assert f"  {ABSENT}  {absent_id}  no data: no landing folder (ingested in a range)" in text
    assert "landing folders (3, $AIENG_HOME/raw/): 1 not ingested as landed" in text
    assert f"  {LANDED_ONLY}  1 data files  not ingested" in text
    json.dumps(status)


def test_a_changed_landing_reads_changed_until_ingested_again(home: Path, tiny_config) -> None:
    store = ArtifactStore(home)
    path = land(home, DATA, "a.jsonl", jsonl({"id": "a", "text": "The first version of a landed document."}))
    ingest(store, tiny_config, DATA)
    path.write_bytes(jsonl({"id": "a", "text": "The second version of that landed document!"}))
    assert pipeline_status(store, START)["landing"]["partitions"][DATA]["state"] == "changed since ingested"
    ingest(store, tiny_config, DATA)
    assert pipeline_status(store, START)["landing"]["partitions"][DATA]["state"] == "ingested"


def test_only_empty_days_train_no_tokenizer(home: Path, tiny_config) -> None:
    store = ArtifactStore(home)
    (home / "raw" / EMPTY).mkdir(parents=True)
    ingest(store, tiny_config, EMPTY)
    with pytest.raises(NoCleanText, match="at least one partition with data"):
        build_bpe_tokenizer(store, tiny_config)
