"""The code location: `dagster dev -w workspace.yaml` or `dagster ... -m orchestration.definitions`."""

import dagster as dg

from orchestration.load_errors import config_errors_end_cli_commands

# Loading reads the config (partitions.py, schedules.py): a bad file ends a CLI command with its
# one line, and reaches the UI as the code location's load error (load_errors.py says which where).
with config_errors_end_cli_commands():
    from orchestration.assets import data, dataset, deployment, model, serving, tokenizer
    from orchestration.assets.benchmark import benchmark_report
    from orchestration.assets.data import clean_documents, raw_documents
    from orchestration.assets.dataset import dataset_manifest
    from orchestration.assets.deployment import production_deployment
    from orchestration.assets.model import model_checkpoint
    from orchestration.assets.serving import serving_bundle
    from orchestration.assets.tokenizer import bpe_tokenizer, tokenized_documents
    from orchestration.executor import selected_executor
    from orchestration.landing import daily_ingest_schedule, landing_sensor
    from orchestration.partitions import CONFIG_PATH
    from orchestration.resources import AiengResource
    from orchestration.retrain import retrain_chain_automation, retrain_sensor, train_job
    from orchestration.schedules import (
        daily_ingest_job,
        retrain_job,
        retrain_schedule,
        rollback_readiness_job,
        rollback_readiness_schedule,
    )
    from orchestration.sensors import deploy_job, deployment_pointer_sensor, serving_bundle_sensor

    EXECUTOR = selected_executor()

# Each asset module keeps the checks of its assets beside them.
ALL_CHECKS = [*data.CHECKS, *tokenizer.CHECKS, *dataset.CHECKS, *model.CHECKS, *serving.CHECKS, *deployment.CHECKS]

defs = dg.Definitions(
    assets=[
        raw_documents,
        clean_documents,
        bpe_tokenizer,
        tokenized_documents,
        dataset_manifest,
        model_checkpoint,
        benchmark_report,
        serving_bundle,
        production_deployment,
    ],
    asset_checks=ALL_CHECKS,
    jobs=[daily_ingest_job, train_job, retrain_job, deploy_job, rollback_readiness_job],
    schedules=[daily_ingest_schedule, retrain_schedule, rollback_readiness_schedule],
    sensors=[
        landing_sensor,
        retrain_sensor,
        retrain_chain_automation,
        serving_bundle_sensor,
        deployment_pointer_sensor,
    ],
    # The config path is spelled out so the UI shows which file this code location runs with.
    resources={"aieng": AiengResource(config_path=str(CONFIG_PATH))},
    # In the run's own process unless AIENG_EXECUTOR=celery (orchestration/executor.py). A bad
    # value is a load error, as a bad config file is.
    executor=EXECUTOR,
)
