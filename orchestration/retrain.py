"""New data retrains by itself, under `gate.retrain` of the code location's config.

Two halves, each with the tool that fits it:

- *When to train* is `retrain_sensor`. With `gate.retrain: on_new_data` it requests a run
  of `train` (model_checkpoint alone) when the current dataset manifest is not the one the
  current model was trained on, no training is in progress, and the last training started
  at least `gate.retrain_min_interval_minutes` ago. Declarative automation cannot say that
  last part: an AutomationCondition sees updates, requests and cron ticks, not how long ago
  something ran, and a cron window is no minimum spacing (a tick at 10:00 lets a 09:50
  training be followed at 10:05). The run key is `train:<dataset manifest id>`: one training
  per data version, whatever the cursor does. With `cron` the `retrain_schedule` trains; with
  `manual` nothing does; the sensor's skip reason says which.
- *What follows a new model* is declarative: benchmark_report and serving_bundle carry
  `AutomationCondition.eager()` (unless `gate.retrain: manual`), so a model trained by this
  sensor, by the schedule or by hand in the UI is benchmarked and bundled once, with nothing
  to wire: `retrain_chain_automation` evaluates those conditions. A bundle then reaches the
  gate through serving_bundle_sensor, as every bundle does.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import dagster as dg

from aieng_core import asset_keys
from aieng_core.dataset.dataset_manifest import read_dataset
from aieng_core.store import ArtifactIntegrityError, ArtifactNotFound
from orchestration.assets.benchmark import benchmark_report
from orchestration.assets.model import model_checkpoint
from orchestration.assets.serving import serving_bundle
from orchestration.resources import AiengResource

train_job = dg.define_asset_job(
    "train",
    selection=[model_checkpoint],
    description=(
        "Train the model on the current dataset manifest (reused when unchanged); the benchmark and the bundle "
        "follow by declarative automation."
    ),
)

UNFINISHED = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]
DATASET_TAG = "aieng/dataset_manifest_id"


def retrain_decision(
    aieng: AiengResource, instance: dg.DagsterInstance, cursor: dict[str, Any], now: dt.datetime
) -> tuple[dg.RunRequest | None, str]:
    """(the run to request or None, why): see the module docstring."""
    config = aieng.settings().gate
    if config.retrain != "on_new_data":
        where = (
            "retrain_schedule trains on gate.retrain_cron, once it is started"
            if config.retrain == "cron"
            else ("trainings start by hand")
        )
        return None, f"gate.retrain is {config.retrain}: {where}"
    store = aieng.store()
    dataset = store.current(asset_keys.DATASET_MANIFEST)
    if dataset is None:
        return None, "no dataset manifest yet: ingest a day with data first"
    if not dataset.metrics.get("train_tokens"):
        return None, f"dataset manifest {dataset.id} holds no training tokens (only empty days so far)"
    model = store.current(asset_keys.MODEL_CHECKPOINT)
    trained_on = model.input_ids(asset_keys.DATASET_MANIFEST) if model is not None else []
    partial = model is not None and bool(model.metrics.get("partial"))
    if model is not None and not partial and _same_tokens(store, trained_on, dataset):
        why = (
            "was trained on it"
            if dataset.id in trained_on
            else "was trained on the same tokens (empty days only since)"
        )
        return None, f"the current model {model.id} {why}: dataset manifest {dataset.id}"
    # A partial model (stopped by training.max_minutes) of this data resumes: its steps are in
    # the key, so each resume is a new request and a finished model ends them.
    key = f"train:{dataset.id}" + (
        f":from-step-{model.metrics.get('steps')}" if partial and trained_on == [dataset.id] else ""
    )
    earlier = instance.get_runs(dg.RunsFilter(tags={"dagster/run_key": key}), limit=1)
    if earlier and earlier[0].status == dg.DagsterRunStatus.FAILURE:
        return None, (
            f"the training of dataset manifest {dataset.id} failed in run {earlier[0].run_id}: see its logs, then "
            "train by hand (`dg launch --assets model_checkpoint`); the sensor does not retry a failed training"
        )
    running = instance.get_runs(dg.RunsFilter(job_name=train_job.name, statuses=UNFINISHED), limit=1)
    if running:
        return None, f"a training is in progress (run {running[0].run_id}); dataset manifest {dataset.id} waits"
    if earlier:
        return None, f"run {earlier[0].run_id} already trains dataset manifest {dataset.id} ({earlier[0].status.value})"
    last = _last_training_start(instance, cursor)
    wait = dt.timedelta(minutes=config.retrain_min_interval_minutes)
    if last is not None and now - last < wait:
        ready = (last + wait).isoformat(timespec="seconds")
        return None, (
            f"dataset manifest {dataset.id} is new, but the last training started at "
            f"{last.isoformat(timespec='seconds')}: gate.retrain_min_interval_minutes "
            f"{config.retrain_min_interval_minutes} lets the next start at {ready}"
        )
    request = dg.RunRequest(run_key=key, tags={DATASET_TAG: dataset.id})
    if partial:
        return request, f"resuming the partial model {model.id} at step {model.metrics.get('steps')} on {dataset.id}"
    return (
        request,
        f"training on dataset manifest {dataset.id} (the current model's: {', '.join(trained_on) or 'none'})",
    )


def _same_tokens(store: Any, trained_on: list[str], dataset: Any) -> bool:
    """Whether the model's dataset manifest holds exactly the token streams `dataset` holds: an
    empty day makes a new manifest (it lists the day) with the very same tokens to train on."""
    if trained_on == [dataset.id]:
        return True
    if len(trained_on) != 1:
        return False
    try:
        before = read_dataset(store.get(asset_keys.DATASET_MANIFEST, trained_on[0]))["token_files"]
    except (ArtifactNotFound, ArtifactIntegrityError, OSError, ValueError, KeyError):
        return False
    now = read_dataset(dataset)["token_files"]
    return {side: f["sha256"] for side, f in before.items()} == {side: f["sha256"] for side, f in now.items()}


def _last_training_start(instance: dg.DagsterInstance, cursor: dict[str, Any]) -> dt.datetime | None:
    """The latest start of a training: this sensor's last request, or the last run that
    materialized model_checkpoint (a training by hand or by the schedule counts too)."""
    starts = []
    try:
        requested = dt.datetime.fromisoformat(cursor["requested_at"]) if cursor.get("requested_at") else None
    except (TypeError, ValueError):
        requested = None  # a cursor edited by hand: the materializations still say
    if requested is not None:
        starts.append(requested if requested.tzinfo else requested.replace(tzinfo=dt.UTC))
    records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=model_checkpoint.key), limit=1).records
    if records:
        run = instance.get_run_record_by_id(records[0].run_id)
        started = run.start_time if run is not None and run.start_time is not None else records[0].timestamp
        starts.append(dt.datetime.fromtimestamp(started, dt.UTC))
    return max(starts) if starts else None


@dg.sensor(
    name="retrain_sensor",
    job=train_job,
    minimum_interval_seconds=60,
    description=(
        "gate.retrain on_new_data: requests a training when the current dataset manifest is newer than the current "
        "model's, none is running and the last started gate.retrain_min_interval_minutes ago (run_key = "
        "train:<dataset manifest id>); benchmark_report and serving_bundle follow by declarative automation."
    ),
)
def retrain_sensor(context: dg.SensorEvaluationContext, aieng: AiengResource) -> dg.SensorResult:
    try:
        cursor = json.loads(context.cursor) if context.cursor else {}
    except ValueError:
        cursor = {}
    if not isinstance(cursor, dict):
        cursor = {}
    now = dt.datetime.now(dt.UTC)
    request, why = retrain_decision(aieng, context.instance, cursor, now)
    if request is None:
        return dg.SensorResult(skip_reason=why, cursor=context.cursor)
    context.log.info(why)
    cursor = {"requested_at": now.isoformat(), "dataset_manifest_id": request.tags[DATASET_TAG]}
    return dg.SensorResult(run_requests=[request], cursor=json.dumps(cursor, sort_keys=True))


# Evaluates the eager conditions of benchmark_report and serving_bundle (assets/benchmark.py,
# assets/serving.py); started with the other sensors that launch runs.
retrain_chain_automation = dg.AutomationConditionSensorDefinition(
    "retrain_chain_automation",
    target=[benchmark_report, serving_bundle],
    minimum_interval_seconds=30,
    description="Declarative automation of benchmark_report and serving_bundle: each runs once its input is new.",
)
