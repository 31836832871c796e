"""New data starts its own ingest: the landing sensor, and the daily schedule that skips a day
nothing landed for.

`landing_sensor` looks at $AIENG_HOME/raw/*/ every `landing.interval_seconds` and requests a
`daily_ingest` run for each partition whose listing (aieng_core/data/landing.py: data files'
names, sizes and modification times) changed since it last looked, once this sensor has seen
the same listing for `landing.settle_seconds` by its own clock. The run key is
`<partition>:<digest of the listing>:<current snapshot id>:<current tokenizer id>`: Dagster
never launches two runs with one run key from one sensor, so the same landing over the same
store is ingested once, and a changed one (or files restored to what they were before) always
again. A listing
the store already holds, snapshotted, cleaned and tokenized (by the schedule or by hand),
starts nothing; a folder emptied after its day was ingested starts nothing either (the
snapshot keeps the day's data). The cursor (`handled`: the last run key per partition, `seen`:
when the current digest was first seen) only saves looking again; the run key is what
guarantees once.

An empty landing folder is an empty day and is ingested like any other (zero rows,
`no_data: true`); a day with no folder is not ingested by the sensor (it never sees one) nor
by the schedule, which skips it with the reason on its tick.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import dagster as dg

from aieng_core import asset_keys
from aieng_core.data.landing import (
    BEFORE_START,
    EMPTIED,
    INGESTED,
    NOT_YET,
    LandingFolder,
    calendar_state,
    ingest_state,
    landing_folders,
)
from aieng_core.home import raw_partition_dir
from orchestration.partitions import LOCATION_CONFIG, START_DATE
from orchestration.resources import AiengResource
from orchestration.schedules import daily_ingest_job

PARTITION_TAG = "dagster/partition"
LISTING_TAG = "aieng/landing_digest"
SETTLING = "still settling"  # seen unchanged for less than landing.settle_seconds
STRAYS = "not YYYY-MM-DD folders, never ingested"
# A tick's skip reason says a bit more than the state's own words.
REASON_WORDING = {
    INGESTED: "already ingested as landed",
    EMPTIED: "emptied since ingested (the snapshot keeps the day's data)",
    BEFORE_START: f"before data.start_date {START_DATE}",
}
REASON_ORDER = (SETTLING, INGESTED, EMPTIED, NOT_YET, BEFORE_START, STRAYS)


def read_cursor(raw: str | None, log: Any) -> dict[str, dict[str, Any]]:
    """`{handled: {partition: run key}, seen: {partition: [digest, first seen (epoch s)]}}`; a
    cursor this code cannot read (an older format, an edit by hand) starts afresh, which costs
    at most one look at every folder: the run keys still keep anything from running twice."""
    try:
        cursor = json.loads(raw) if raw else {}
        if not isinstance(cursor, dict):
            raise ValueError("not an object")
        handled, seen = cursor.get("handled", {}), cursor.get("seen", {})
        if not isinstance(handled, dict) or not isinstance(seen, dict):
            raise ValueError("handled and seen must be objects")
        return {"handled": handled, "seen": seen}
    except ValueError as exc:
        log.warning(f"landing_sensor: unreadable cursor ({exc}); looking at every landing folder afresh")
        return {"handled": {}, "seen": {}}


def landing_requests(
    aieng: AiengResource, cursor: dict[str, dict[str, Any]], now: dt.datetime, log: Any
) -> tuple[list[dg.RunRequest], dict[str, dict[str, Any]], list[str]]:
    """(run requests, the new cursor, what was not requested and why) for one look at raw/."""
    config = aieng.settings()
    store = aieng.store()
    folders, strays = landing_folders(store.home)
    today = now.astimezone(dt.UTC).date()  # today's folder becomes a partition when the day ends
    requests: list[dg.RunRequest] = []
    # What was not requested, by reason, in the words `aieng data status` uses (landing.py).
    not_requested: dict[str, list[str]] = {}
    present = {folder.partition for folder in folders}
    # Folders gone since the last look are forgotten: landing them again is new data again.
    handled = {p: key for p, key in cursor["handled"].items() if p in present}
    seen = {p: mark for p, mark in cursor["seen"].items() if p in present}
    tokenizer = _id(store.current(asset_keys.BPE_TOKENIZER))
    for folder in folders:
        if calendar := calendar_state(folder.partition, today, START_DATE):
            not_requested.setdefault(calendar, []).append(folder.partition)
            continue
        current = store.current(asset_keys.RAW_DOCUMENTS, folder.partition)
        # The snapshot it would replace is part of the key: files restored as they were before
        # (A, then B, then A again) are new to the store, though not to the folder. So is the
        # tokenizer: a day ingested before the first one existed (an empty first day) is looked
        # at again once one does, and its tokenizing finished.
        key = f"{folder.partition}:{folder.digest}:{_id(current)}:{tokenizer}"
        if handled.get(folder.partition) == key:
            continue
        # Settled by this sensor's clock: the same digest for settle_seconds (a writer's clock
        # may be ahead or behind).
        mark = seen.get(folder.partition)
        if not (isinstance(mark, list) and len(mark) == 2 and mark[0] == folder.digest):
            seen[folder.partition] = mark = [folder.digest, now.timestamp()]
        unchanged_for = now.timestamp() - float(mark[1])
        if unchanged_for < config.landing.settle_seconds:
            not_requested.setdefault(SETTLING, []).append(f"{folder.partition} (unchanged for {unchanged_for:.0f} s)")
            continue
        handled[folder.partition] = key
        state = ingest_state(store, folder)
        if state in (INGESTED, EMPTIED):
            not_requested.setdefault(state, []).append(folder.partition)
        else:
            requests.append(ingest_request(folder, key, state))
    if strays:
        not_requested[STRAYS] = strays[:10]
    wording = {SETTLING: f"waiting {config.landing.settle_seconds:g} s for landing to settle", **REASON_WORDING}
    reasons = [
        f"{wording.get(why, why)}: {', '.join(not_requested[why])}" for why in REASON_ORDER if why in not_requested
    ]
    return requests, {"handled": handled, "seen": seen}, reasons


def _id(artifact: Any) -> str:
    return artifact.id if artifact is not None else "none"


def ingest_request(folder: LandingFolder, key: str, state: str) -> dg.RunRequest:
    return dg.RunRequest(
        run_key=key,
        partition_key=folder.partition,
        tags={LISTING_TAG: folder.digest, "aieng/landed_files": str(len(folder.files)), "aieng/landing": state},
    )


@dg.sensor(
    name="landing_sensor",
    job=daily_ingest_job,
    minimum_interval_seconds=LOCATION_CONFIG.landing.interval_seconds,
    description=(
        "Requests a daily_ingest run for each partition whose landed files ($AIENG_HOME/raw/YYYY-MM-DD/) changed, "
        "once they have settled for landing.settle_seconds (run_key = partition:digest of names, sizes, mtimes: "
        "the same landing never runs twice). An empty folder is an empty day; a listing already snapshotted "
        "starts nothing."
    ),
)
def landing_sensor(context: dg.SensorEvaluationContext, aieng: AiengResource) -> dg.SensorResult:
    cursor = read_cursor(context.cursor, context.log)
    requests, new_cursor, reasons = landing_requests(aieng, cursor, dt.datetime.now(dt.UTC), context.log)
    encoded = json.dumps(new_cursor, sort_keys=True)
    if not requests:
        return dg.SensorResult(skip_reason="; ".join(reasons) or "no landing folder changed", cursor=encoded)
    if reasons:
        context.log.info("; ".join(reasons))
    context.log.info(
        "ingesting " + ", ".join(f"{r.partition_key} ({r.tags['aieng/landed_files']} files)" for r in requests)
    )
    return dg.SensorResult(run_requests=requests, cursor=encoded)


@dg.schedule(
    name="daily_ingest_schedule",
    job=daily_ingest_job,
    cron_schedule="0 1 * * *",
    execution_timezone="UTC",
    description=(
        "At 01:00 UTC, the daily_ingest job for the day that just ended; a day with no landing folder is skipped "
        "with the reason on the tick (an empty folder is an empty day and is ingested)."
    ),
)
def daily_ingest_schedule(context: dg.ScheduleEvaluationContext, aieng: AiengResource) -> Any:
    day = (context.scheduled_execution_time.astimezone(dt.UTC) - dt.timedelta(days=1)).date()
    if day < START_DATE:
        return dg.SkipReason(f"{day} is before data.start_date {START_DATE}: not a partition")
    folder = raw_partition_dir(aieng.store().home, day.isoformat())
    if not folder.is_dir():
        return dg.SkipReason(f"nothing landed for {day}: no landing folder {folder}")
    return dg.RunRequest(run_key=day.isoformat(), partition_key=day.isoformat())
