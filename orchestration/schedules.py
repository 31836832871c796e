"""The daily ingest: at 01:00 UTC, the previous day's partition, through the data half.

The retrain: on `gate.retrain_cron` (UTC) of the code location's config, dataset_manifest ->
model_checkpoint -> benchmark_report -> serving_bundle, with their checks; a new bundle then
reaches the promotion gate through serving_bundle_sensor (orchestration/sensors.py).
Unchanged inputs are reused, so a week without new data retrains nothing.
"""

from pathlib import Path

import dagster as dg

from aieng_core.config import AiengConfig, ConfigError, load_config
from orchestration.assets.benchmark import benchmark_report
from orchestration.assets.data import clean_documents, raw_documents
from orchestration.assets.dataset import dataset_manifest
from orchestration.assets.model import model_checkpoint
from orchestration.assets.serving import serving_bundle
from orchestration.assets.tokenizer import bpe_tokenizer, tokenized_documents
from orchestration.partitions import CONFIG_PATH

daily_ingest_job = dg.define_asset_job(
    "daily_ingest",
    selection=[raw_documents, clean_documents, bpe_tokenizer, tokenized_documents, dataset_manifest],
    description="Snapshot, clean and tokenize one day, then refresh the dataset manifest (the tokenizer stays pinned).",
)

# A daily-partitioned job's schedule requests the partition of the day that just ended.
daily_ingest_schedule = dg.build_schedule_from_partitioned_job(daily_ingest_job, hour_of_day=1, minute_of_hour=0)

# Exactly these assets (and their checks): the data half stays with the daily ingest.
RETRAIN_ASSETS = [dataset_manifest, model_checkpoint, benchmark_report, serving_bundle]

retrain_job = dg.define_asset_job(
    "retrain",
    selection=RETRAIN_ASSETS,
    description=(
        "Refresh the dataset manifest, train the model on it, benchmark it and bundle it (each reused when its "
        "inputs are unchanged); the sensor sends a new bundle to the promotion gate."
    ),
)


def retrain_schedule_for(config: AiengConfig, config_path: Path | str = CONFIG_PATH) -> dg.ScheduleDefinition:
    """The retrain job on `config.gate.retrain_cron` (UTC); an invalid cron stops the code
    location with one error naming the file and the key."""
    try:
        return dg.ScheduleDefinition(
            name="retrain_schedule",
            job=retrain_job,
            cron_schedule=config.gate.retrain_cron,
            execution_timezone="UTC",
            description=f"retrain on gate.retrain_cron ({config.gate.retrain_cron}, UTC) of {config_path}",
        )
    except dg.DagsterInvalidDefinitionError:
        raise ConfigError(
            f"{config_path}: invalid config: gate.retrain_cron: {config.gate.retrain_cron!r} is not a cron expression "
            "of 5 fields (minute hour day-of-month month day-of-week)"
        ) from None


retrain_schedule = retrain_schedule_for(load_config(CONFIG_PATH))
