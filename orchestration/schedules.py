"""The daily ingest job (its schedule and the landing sensor that also run it are in
orchestration/landing.py): one day's partition through the data half.

The retrain: on `gate.retrain_cron` (UTC) of the code location's config, dataset_manifest ->
model_checkpoint -> benchmark_report -> serving_bundle, with their checks; a new bundle then
reaches the promotion gate through serving_bundle_sensor (orchestration/sensors.py).
Unchanged inputs are reused, so a week without new data retrains nothing. The retrain never
runs the gate itself: a bundle reaches it only through that sensor, which requests no gate run
for a bundle a rollback withdrew (a retrain that rebuilds it makes the same id).

The rollback readiness check: on `gate.rollback_check_cron` (UTC), the `rollback_readiness`
job runs the asset check rollback_target_ready alone (no asset is materialized): what a
rollback of production would make current is re-hashed, loaded and its goldens replayed.
"""

from pathlib import Path
from typing import Any

import dagster as dg

from aieng_core.config import AiengConfig, ConfigError, load_config
from orchestration.assets.benchmark import benchmark_report
from orchestration.assets.data import clean_documents, raw_documents
from orchestration.assets.dataset import dataset_manifest
from orchestration.assets.deployment import rollback_target_ready
from orchestration.assets.model import model_checkpoint
from orchestration.assets.serving import serving_bundle
from orchestration.assets.tokenizer import bpe_tokenizer, tokenized_documents
from orchestration.partitions import CONFIG_PATH, LOCATION_CONFIG

# Every run of a job that builds the dataset manifest carries this tag, and the run queue of the
# shipped instance configs (configs/dagster*.yaml, `tag_concurrency_limits`) runs one at a time.
WRITES_DATASET = {"aieng/writes": "dataset"}

daily_ingest_job = dg.define_asset_job(
    "daily_ingest",
    selection=[raw_documents, clean_documents, bpe_tokenizer, tokenized_documents, dataset_manifest],
    description="Snapshot, clean and tokenize one day, then refresh the dataset manifest (the tokenizer stays pinned).",
    tags=WRITES_DATASET,
)

# Exactly these assets (and their checks): the data half stays with the daily ingest.
RETRAIN_ASSETS = [dataset_manifest, model_checkpoint, benchmark_report, serving_bundle]

retrain_job = dg.define_asset_job(
    "retrain",
    selection=RETRAIN_ASSETS,
    description=(
        "Refresh the dataset manifest, train the model on it, benchmark it and bundle it (each reused when its "
        "inputs are unchanged); the sensor sends a new bundle to the promotion gate."
    ),
    tags=WRITES_DATASET,
)


rollback_readiness_job = dg.define_asset_job(
    "rollback_readiness",
    selection=dg.AssetSelection.checks(rollback_target_ready),
    description=(
        "The asset check rollback_target_ready alone: re-hash, load and replay the goldens of what a rollback of "
        "production would make current (nothing is materialized)."
    ),
)

CRON_FIELDS = "of 5 fields (minute hour day-of-month month day-of-week)"


def _cron_schedule(
    name: str,
    job: Any,
    key: str,
    cron: str,
    config_path: Path | str,
    what: str,
    status: dg.DefaultScheduleStatus = dg.DefaultScheduleStatus.STOPPED,
    execution_fn: Any = None,
) -> dg.ScheduleDefinition:
    """`job` on the cron of config key `gate.<key>` (UTC); an invalid cron stops the code
    location with one error naming the file and the key."""
    try:
        return dg.ScheduleDefinition(
            name=name,
            job=job,
            cron_schedule=cron,
            execution_timezone="UTC",
            description=f"{what} on gate.{key} ({cron}, UTC) of {config_path}",
            default_status=status,
            execution_fn=execution_fn,
        )
    except dg.DagsterInvalidDefinitionError:
        raise ConfigError(
            f"{config_path}: invalid config: gate.{key}: {cron!r} is not a cron expression {CRON_FIELDS}"
        ) from None


def retrain_schedule_for(config: AiengConfig, config_path: Path | str = CONFIG_PATH) -> dg.ScheduleDefinition:
    """The retrain job on `config.gate.retrain_cron` (UTC); an invalid cron stops the code
    location with one error naming the file and the key."""

    def tick(context: dg.ScheduleEvaluationContext) -> dg.RunRequest | dg.SkipReason:
        # The policy as the file says now (the sensor reads it live too): one switch for both.
        policy = load_config(config_path).gate.retrain
        if policy != "cron":
            return dg.SkipReason(f"gate.retrain is {policy}, not cron: this schedule trains nothing")
        return dg.RunRequest()

    return _cron_schedule(
        "retrain_schedule",
        retrain_job,
        "retrain_cron",
        config.gate.retrain_cron,
        config_path,
        "retrain, when gate.retrain is cron,",
        execution_fn=tick,
    )


def rollback_readiness_schedule_for(
    config: AiengConfig, config_path: Path | str = CONFIG_PATH
) -> dg.ScheduleDefinition:
    """The rollback_readiness job on `config.gate.rollback_check_cron` (UTC); an invalid cron
    stops the code location with one error naming the file and the key."""
    return _cron_schedule(
        "rollback_readiness_schedule",
        rollback_readiness_job,
        "rollback_check_cron",
        config.gate.rollback_check_cron,
        config_path,
        "check the rollback target",
        # On from the start (with the daemon running): it only reads, and a rollback target
        # nobody checks is the failure it exists to find.
        dg.DefaultScheduleStatus.RUNNING,
    )


retrain_schedule = retrain_schedule_for(LOCATION_CONFIG)
rollback_readiness_schedule = rollback_readiness_schedule_for(LOCATION_CONFIG)
