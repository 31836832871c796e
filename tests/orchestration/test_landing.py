"""The landing sensor requests one ingest run per changed, settled landing, and the daily
schedule skips a day nothing landed for, saying so."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg

from aieng_core.data.clean_documents import build_clean_documents
from aieng_core.data.landing import landing_folder
from aieng_core.data.raw_documents import build_raw_documents
from aieng_core.status import pipeline_status
from aieng_core.store import ArtifactStore
from orchestration.definitions import defs
from orchestration.landing import landing_requests, read_cursor
from orchestration.resources import AiengResource
from tests.conftest import TINY_CONFIG, land
from tests.core.helpers import jsonl
from tests.orchestration.helpers import resources

DAY, OTHER = "2026-01-05", "2026-01-06"
DOC = {"id": "a", "text": "A landed document of some length."}
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SETTLED = dt.timedelta(seconds=61)  # tiny.yaml keeps the default landing.settle_seconds, 60
LOG = logging.getLogger("test.landing")


class Sensor:
    """The sensor's logic tick by tick on a clock of the test's (its cursor carried over)."""

    def __init__(self, home: Path) -> None:
        self.aieng = AiengResource(home=str(home), config_path=str(TINY_CONFIG))
        self.cursor = read_cursor(None, LOG)
        self.now = T0

    def tick(self, after: dt.timedelta = dt.timedelta(0)) -> tuple[list[dg.RunRequest], list[str]]:
        self.now += after
        requests, self.cursor, reasons = landing_requests(self.aieng, self.cursor, self.now, LOG)
        return requests, reasons

    def settled(self) -> tuple[list[dg.RunRequest], list[str]]:
        """Look once (the listing is seen), then again once it has stayed the same long enough."""
        self.tick()
        return self.tick(SETTLED)


def keys(requests: list[dg.RunRequest]) -> list[tuple[str | None, str | None]]:
    return [(request.partition_key, request.run_key) for request in requests]


def test_a_settled_landing_is_ingested_once(home: Path) -> None:
    land(home, DAY, "a.jsonl", jsonl(DOC))
    sensor = Sensor(home)
    waiting, reasons = sensor.tick()
    assert waiting == [] and reasons == [f"waiting 60 s for landing to settle: {DAY} (unchanged for 0 s)"]
    requests, _ = sensor.tick(SETTLED)
    digest = landing_folder(home, DAY).digest
    assert keys(requests) == [(DAY, f"{DAY}:{digest}:none:none")]
    assert requests[0].tags["aieng/landing"] == "not ingested"
    assert sensor.tick(SETTLED) == ([], [])  # handled: nothing more to say


def test_a_landing_still_changing_waits_and_a_changed_one_runs_again(home: Path) -> None:
    land(home, DAY, "a.jsonl", jsonl(DOC))
    sensor = Sensor(home)
    [first], _ = sensor.settled()
    # A second file lands: the digest changes, so it waits again, then runs with a new key.
    land(home, DAY, "b.jsonl", jsonl({"id": "b", "text": "Another landed document, later."}))
    assert sensor.tick()[0] == []
    [second], _ = sensor.tick(SETTLED)
    assert second.partition_key == DAY and second.run_key != first.run_key


def test_a_file_still_growing_never_settles(home: Path) -> None:
    path = land(home, DAY, "a.jsonl", jsonl(DOC))
    sensor = Sensor(home)
    for _ in range(3):  # written to between every look, whatever its mtime says
        with path.open("ab") as out:
            out.write(jsonl({"id": f"x{out.tell()}", "text": "More of the same landed file."}))
        os.utime(path, (1_000_000_000, 1_000_000_000))  # a writer's clock far behind
        requests, reasons = sensor.tick(SETTLED)
        assert requests == [] and reasons[0].startswith(f"waiting 60 s for landing to settle: {DAY}")


def test_what_a_snapshot_ignores_changes_nothing(home: Path) -> None:
    land(home, DAY, "a.jsonl", jsonl(DOC))
    before = landing_folder(home, DAY).digest
    land(home, DAY, ".a.jsonl.tmp", b"partial")
    land(home, DAY, "b.jsonl.part", b"partial")
    land(home, DAY, "notes.txt", b"not data")
    assert landing_folder(home, DAY).digest == before
    assert [f.name for f in landing_folder(home, DAY).files] == ["a.jsonl"]


def test_an_ingested_landing_starts_nothing_until_its_data_changes(home: Path, tiny_config) -> None:
    store = ArtifactStore(home)
    path = land(home, DAY, "a.jsonl", jsonl(DOC))
    build_raw_documents(store, tiny_config, DAY)  # snapshotted by hand, not cleaned yet
    sensor = Sensor(home)
    [partly], _ = sensor.settled()
    assert partly.tags["aieng/landing"] == "partly ingested"
    build_clean_documents(store, tiny_config, DAY)  # what that run would have done (no tokenizer yet)
    sensor = Sensor(home)  # a fresh cursor: it looks again
    assert sensor.settled() == ([], [f"already ingested as landed: {DAY}"])
    # Touched, same bytes (mtime differs from the snapshot's): re-read, still the same data.
    os.utime(path, (1_700_000_000, 1_700_000_000))
    assert sensor.settled() == ([], [f"already ingested as landed: {DAY}"])
    # Rewritten with other bytes of the same size: new data.
    data = jsonl(DOC)
    path.write_bytes(data.replace(b"some", b"SOME"))
    assert len(path.read_bytes()) == len(data)
    [changed], _ = sensor.settled()
    assert changed.tags["aieng/landing"] == "changed since ingested"


def test_an_emptied_folder_keeps_its_day_and_restored_files_run_again(home: Path, tiny_config) -> None:
    store = ArtifactStore(home)
    path = land(home, DAY, "a.jsonl", jsonl(DOC))
    first = build_raw_documents(store, tiny_config, DAY)
    build_clean_documents(store, tiny_config, DAY)
    kept = path.read_bytes()
    stat = path.stat()
    path.unlink()  # the landing folder cleaned up after ingest
    sensor = Sensor(home)
    assert sensor.settled() == (
        [],
        [f"emptied since ingested (the snapshot keeps the day's data): {DAY}"],
    )
    # Asked to snapshot the emptied day anyway, the day's data stays.
    assert build_raw_documents(store, tiny_config, DAY).id == first.id
    assert store.require_current("raw_documents", DAY).id == first.id
    # Landed again exactly as it was (same name, size, mtime: the same digest as the first time).
    path.write_bytes(kept)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert sensor.settled() == ([], [f"already ingested as landed: {DAY}"])


def test_empty_days_run_and_days_that_are_not_partitions_do_not(home: Path) -> None:
    (home / "raw" / DAY).mkdir(parents=True)
    today = T0.date().isoformat()
    land(home, today, "a.jsonl", jsonl(DOC))
    land(home, "2025-12-31", "a.jsonl", jsonl(DOC))
    land(home, "not-a-day", "a.jsonl", jsonl(DOC))
    requests, reasons = Sensor(home).settled()
    assert [r.partition_key for r in requests] == [DAY]  # the empty day: ingested as empty
    assert requests[0].tags["aieng/landed_files"] == "0"
    assert reasons == [
        f"not a partition until the day ends (UTC): {today}",
        "before data.start_date 2026-01-01: 2025-12-31",
        "not YYYY-MM-DD folders, never ingested: not-a-day",
    ]
    # `aieng data status` says the same of each folder, on the same day.
    landing = pipeline_status(ArtifactStore(home), dt.date(2026, 1, 1), T0.date())["landing"]
    assert {p: entry["state"] for p, entry in landing["partitions"].items()} == {
        "2025-12-31": "before data.start_date",
        DAY: "not ingested",
        today: "not a partition until the day ends (UTC)",
    }
    assert landing["other_entries"] == ["not-a-day"]


def test_a_folder_removed_and_landed_again_is_looked_at_again(home: Path) -> None:
    land(home, DAY, "a.jsonl", jsonl(DOC))
    sensor = Sensor(home)
    [first], _ = sensor.settled()
    for entry in (home / "raw" / DAY).iterdir():
        entry.unlink()
    (home / "raw" / DAY).rmdir()
    sensor.tick()
    assert DAY not in sensor.cursor["handled"]  # forgotten
    land(home, DAY, "a.jsonl", jsonl(DOC))
    [again], _ = sensor.settled()
    assert again.partition_key == DAY


def test_the_sensor_wiring_and_an_unreadable_cursor(home: Path) -> None:
    land(home, DAY, "a.jsonl", jsonl(DOC))
    sensor = defs.resolve_sensor_def("landing_sensor")
    with dg.instance_for_test() as instance:
        context = dg.build_sensor_context(
            instance=instance, cursor="not json", resources=resources(home), definitions=defs
        )
        result = sensor.evaluate_tick(context)
    assert list(result.run_requests or []) == []
    assert result.skip_message.startswith(f"waiting 60 s for landing to settle: {DAY} (unchanged for ")
    cursor = json.loads(result.cursor)
    assert cursor["handled"] == {} and cursor["seen"][DAY][0] == landing_folder(home, DAY).digest


def schedule_tick(home: Path, when: datetime):
    schedule = defs.resolve_schedule_def("daily_ingest_schedule")
    with dg.instance_for_test() as instance:
        context = dg.build_schedule_context(
            instance=instance,
            scheduled_execution_time=when,
            resources=resources(home),
            repository_def=defs.get_repository_def(),
        )
        return schedule.evaluate_tick(context)


def test_the_schedule_skips_a_day_nothing_landed_for(home: Path) -> None:
    result = schedule_tick(home, datetime(2026, 1, 6, 1, 0, tzinfo=UTC))
    assert list(result.run_requests or []) == []
    assert result.skip_message == f"nothing landed for {DAY}: no landing folder {home / 'raw' / DAY}"
    (home / "raw" / DAY).mkdir(parents=True)  # an empty day is a day: ingested
    result = schedule_tick(home, datetime(2026, 1, 6, 1, 0, tzinfo=UTC))
    assert [request.partition_key for request in result.run_requests] == [DAY]


def test_an_empty_first_day_is_finished_once_a_tokenizer_exists(home: Path, tiny_config) -> None:
    """Ingested before any tokenizer existed, the empty day was never tokenized: once a later
    day's run trains the first tokenizer, the sensor asks for that day again."""
    from aieng_core.data.demo_data import land_demo_data
    from aieng_core.tokenizer.bpe_tokenizer import build_bpe_tokenizer

    store = ArtifactStore(home)
    (home / "raw" / DAY).mkdir(parents=True)
    build_raw_documents(store, tiny_config, DAY)
    build_clean_documents(store, tiny_config, DAY)
    sensor = Sensor(home)
    assert sensor.settled() == ([], [f"already ingested as landed: {DAY}"])  # nothing more it can do yet
    land_demo_data(home, start_date=dt.date(2026, 1, 6), days=1)
    build_raw_documents(store, tiny_config, OTHER)
    build_clean_documents(store, tiny_config, OTHER)
    build_bpe_tokenizer(store, tiny_config)  # the first tokenizer: the other day's run trained it
    requests, reasons = sensor.tick(SETTLED)
    assert [(r.partition_key, r.tags["aieng/landing"]) for r in requests] == [(DAY, "partly ingested")]
    assert reasons == [f"waiting 60 s for landing to settle: {OTHER} (unchanged for 0 s)"]  # seen just now
