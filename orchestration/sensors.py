"""A new serving bundle goes to the promotion gate: one run of production_deployment per bundle.

The sensor reads the serving_bundle materializations recorded since its cursor (their
`artifact_id` metadata is the bundle id, orchestration/metadata.py) and requests one run per
distinct bundle with run_key = the bundle id: Dagster never launches two runs with the same
run key from one sensor, so a bundle is gated once, whatever happens to the cursor (a reset,
a bundle materialized again and reused). The gate itself gates the current serving bundle
(and refuses nothing twice: a bundle production already serves is not gated again). A bundle a
rollback withdrew gets no run at all: the sensor logs the rollback that withdrew it and moves
on. The retrain schedule reaches the gate only through this sensor, so a retrain that produces
a withdrawn bundle again (same recipe, same id) is never re-gated by it.

`deployment_pointer_sensor` keeps the Dagster instance in step with the production pointer:
every applied change of its history that the instance has not recorded (a promote or rollback
made with `aieng deploy` while the webserver was unreachable, or with AIENG_DAGSTER_URL unset)
becomes a runless materialization of production_deployment, the same metadata the CLI reports
(aieng_core/deploy/dagster_events.py).
"""

import datetime as dt
from typing import Any

import dagster as dg

from aieng_core import asset_keys
from aieng_core.deploy import dagster_events
from aieng_core.deploy.deployments import Deployments
from aieng_core.deploy.withdrawn import withdrawn_refusal
from aieng_core.store.pointers import PRODUCTION, Pointer
from orchestration.assets.deployment import BUNDLE_ID_TAG, production_deployment
from orchestration.resources import AiengResource

# Read per evaluation; the rest wait for the next tick (the cursor stops at the last one read).
PAGE = 100

deploy_job = dg.define_asset_job(
    "deploy",
    selection=[production_deployment],
    description="The promotion gate on the current serving bundle (verify, warmup, compare, stress, drill), "
    "then promote; then the rollback_target_ready check of what a rollback would go back to.",
)


@dg.sensor(
    name="serving_bundle_sensor",
    job=deploy_job,
    minimum_interval_seconds=30,
    description=(
        "Requests one run of production_deployment per new serving_bundle (run_key = bundle id: never twice); "
        "a bundle a rollback withdrew gets no run."
    ),
)
def serving_bundle_sensor(context: dg.SensorEvaluationContext, aieng: AiengResource) -> dg.SensorResult:
    after = int(context.cursor) if context.cursor else None
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset_keys.SERVING_BUNDLE), after_storage_id=after),
        limit=PAGE,
        ascending=True,
    ).records
    if not records:
        return dg.SensorResult(skip_reason="no new serving_bundle materialization", cursor=context.cursor)
    withdrawn = Deployments(aieng.store().home).withdrawn()
    requests: dict[str, dg.RunRequest] = {}
    refused: set[str] = set()
    for record in records:
        materialization = record.asset_materialization
        entry = materialization.metadata.get("artifact_id") if materialization is not None else None
        bundle_id = entry.value if entry is not None else None
        if not isinstance(bundle_id, str):
            context.log.warning(f"serving_bundle materialization {record.storage_id} names no artifact_id; skipped")
            continue
        if bundle_id in withdrawn:
            if bundle_id not in refused:
                refused.add(bundle_id)
                context.log.info(f"no gate run: {withdrawn_refusal(bundle_id, withdrawn[bundle_id], PRODUCTION)}")
            continue
        requests.setdefault(bundle_id, dg.RunRequest(run_key=bundle_id, tags={BUNDLE_ID_TAG: bundle_id}))
    cursor = str(records[-1].storage_id)
    if not requests:
        skipped = f"withdrawn: {', '.join(sorted(refused))}" if refused else "no artifact_id"
        return dg.SensorResult(skip_reason=f"no serving_bundle to gate ({skipped})", cursor=cursor)
    return dg.SensorResult(run_requests=list(requests.values()), cursor=cursor)


# Run states after which a gate run's materialization is recorded, if it ever will be.
FINISHED = (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
# A gate run records the sequence it promoted a moment after the promote; one still unfinished
# this long after its promote is taken to have died without saying so.
RUN_GRACE_S = 600


def recorded_change(instance: dg.DagsterInstance) -> tuple[int, str | None] | None:
    """(`sequence`, `bundle_id`) of production_deployment's latest materialization (gate runs,
    CLI reports and this sensor all record both), or None when there is none or it names no
    sequence."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=production_deployment.key), limit=1
    ).records
    materialization = records[0].asset_materialization if records else None
    if materialization is None:
        return None
    sequence, bundle = (materialization.metadata.get(key) for key in ("sequence", "bundle_id"))
    value = sequence.value if sequence is not None else None
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    return value, (bundle.value if bundle is not None and isinstance(bundle.value, str) else None)


def pointer_materialization(event: dict[str, Any]) -> dg.AssetMaterialization:
    """production_deployment as `event` (an applied production history event) left it."""
    return dg.AssetMaterialization(
        asset_key=production_deployment.key,
        description=dagster_events.event_description(event, dagster_events.SENSOR),
        metadata=dagster_events.event_metadata(event, dagster_events.SENSOR),
        # What MaterializeResult(data_version=...) records: the asset's own `<bundle_id>:<sequence>`.
        tags={
            "dagster/data_version": dagster_events.data_version(event),
            "dagster/data_version_is_user_provided": "true",
        },
    )


def unfinished_gate_run(instance: dg.DagsterInstance, event: dict[str, Any]) -> str | None:
    """The id of the unfinished gate run of this instance that made `event` (it records the
    sequence itself when it finishes), or None."""
    run_id = event.get("dagster_run_id")
    run = instance.get_run_by_id(run_id) if run_id else None
    if run is None or run.status in FINISHED:
        return None
    age = (dt.datetime.now(dt.UTC) - dt.datetime.fromisoformat(event["time"])).total_seconds()
    return run_id if age < RUN_GRACE_S else None


@dg.sensor(
    name="deployment_pointer_sensor",
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Records every change of the production pointer the instance has not recorded (a CLI promote or "
        "rollback Dagster was not told of) as a materialization of production_deployment, so its latest "
        "names what production serves. Never records a sequence twice."
    ),
)
def deployment_pointer_sensor(context: dg.SensorEvaluationContext, aieng: AiengResource) -> dg.SensorResult:
    current, applied = Pointer(aieng.store().home, PRODUCTION).applied()
    latest = recorded_change(context.instance)
    recorded = latest[0] if latest is not None else None
    if latest is not None:
        made = next((event for event in applied if event["sequence"] == latest[0]), None)
        if made is None or (made["to"] or "none") != latest[1]:
            # The latest names a change this pointer never made (another home reported to this
            # instance, or its history was replaced): what the UI shows must be what serves here.
            if not applied:
                return dg.SensorResult(skip_reason="production has no history to record", cursor=context.cursor)
            last_event = applied[-1]
            context.log.warning(
                f"production_deployment's latest materialization names sequence {latest[0]} ({latest[1]}), which "
                f"production's history here does not hold; recording what it serves now: sequence "
                f"{last_event['sequence']} ({last_event['to'] or 'none'})"
            )
            return dg.SensorResult(
                asset_events=[pointer_materialization(last_event)], cursor=str(last_event["sequence"])
            )
    # What the instance has is what its latest materialization names. The cursor (the last
    # sequence this sensor recorded) decides only when that names no sequence (a materialization
    # reported by hand), so what the sensor recorded once is never recorded again.
    known = recorded if recorded is not None else int(context.cursor or 0)
    events: list[dg.AssetMaterialization] = []
    last = None
    for event in applied:
        if event["sequence"] <= known:
            continue
        run_id = unfinished_gate_run(context.instance, event)
        if run_id is not None:
            context.log.info(f"production sequence {event['sequence']}: its gate run {run_id} records it")
            break
        events.append(pointer_materialization(event))
        last = event["sequence"]
        if len(events) == PAGE:
            break
    if last is None:
        return dg.SensorResult(
            skip_reason=f"production_deployment names production's sequence {current['sequence']} already",
            cursor=context.cursor,
        )
    context.log.info(
        f"recording {len(events)} change(s) of production not in the instance yet: sequence "
        + ", ".join(str(event.metadata["sequence"].value) for event in events)
    )
    return dg.SensorResult(asset_events=events, cursor=str(last))
