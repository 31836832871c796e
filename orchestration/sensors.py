"""A new serving bundle goes to the promotion gate: one run of production_deployment per bundle.

The sensor reads the serving_bundle materializations recorded since its cursor (their
`artifact_id` metadata is the bundle id, orchestration/metadata.py) and requests one run per
distinct bundle with run_key = the bundle id: Dagster never launches two runs with the same
run key from one sensor, so a bundle is gated once, whatever happens to the cursor (a reset,
a bundle materialized again and reused). The gate itself gates the current serving bundle
(and refuses nothing twice: a bundle production already serves is not gated again).
"""

import dagster as dg

from aieng_core import asset_keys
from orchestration.assets.deployment import BUNDLE_ID_TAG, production_deployment

# Read per evaluation; the rest wait for the next tick (the cursor stops at the last one read).
PAGE = 100

deploy_job = dg.define_asset_job(
    "deploy",
    selection=[production_deployment],
    description="The promotion gate on the current serving bundle (verify, warmup, compare, stress, drill), "
    "then promote.",
)


@dg.sensor(
    name="serving_bundle_sensor",
    job=deploy_job,
    minimum_interval_seconds=30,
    description=(
        "Requests one run of production_deployment per new serving_bundle (run_key = bundle id: never twice)."
    ),
)
def serving_bundle_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    after = int(context.cursor) if context.cursor else None
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset_keys.SERVING_BUNDLE), after_storage_id=after),
        limit=PAGE,
        ascending=True,
    ).records
    if not records:
        return dg.SensorResult(skip_reason="no new serving_bundle materialization", cursor=context.cursor)
    requests: dict[str, dg.RunRequest] = {}
    for record in records:
        materialization = record.asset_materialization
        entry = materialization.metadata.get("artifact_id") if materialization is not None else None
        bundle_id = entry.value if entry is not None else None
        if not isinstance(bundle_id, str):
            context.log.warning(f"serving_bundle materialization {record.storage_id} names no artifact_id; skipped")
            continue
        requests.setdefault(bundle_id, dg.RunRequest(run_key=bundle_id, tags={BUNDLE_ID_TAG: bundle_id}))
    return dg.SensorResult(run_requests=list(requests.values()), cursor=str(records[-1].storage_id))
