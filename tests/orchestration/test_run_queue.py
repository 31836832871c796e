"""Runs that build the dataset manifest run one at a time: the jobs carry the tag, and the run
queue of every shipped instance config limits it to one run in progress (Dagster's own counter
decides, as the daemon's dequeue does)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import yaml
from dagster._core.run_coordinator import QueuedRunCoordinator
from dagster._utils.tags import TagConcurrencyLimitsCounter

from aieng_core import asset_keys
from orchestration.definitions import defs
from orchestration.schedules import WRITES_DATASET

REPO_ROOT = Path(__file__).resolve().parents[2]
LIMIT = {"key": "aieng/writes", "value": "dataset", "limit": 1}


def test_every_job_that_builds_the_dataset_manifest_carries_the_tag() -> None:
    repository = defs.get_repository_def()
    writers = sorted(
        job.name
        for job in repository.get_all_jobs()
        if not job.name.startswith("__")
        and dg.AssetKey(asset_keys.DATASET_MANIFEST) in job.asset_layer.selected_asset_keys
    )
    assert writers == ["daily_ingest", "retrain"]
    for name in writers:
        assert dict(repository.get_job(name).tags).items() >= WRITES_DATASET.items()


def test_a_second_dataset_run_waits_while_one_is_in_progress(tmp_path: Path) -> None:
    (tmp_path / "dagster.yaml").write_bytes((REPO_ROOT / "configs" / "dagster.yaml").read_bytes())
    instance = dg.DagsterInstance.from_config(str(tmp_path))
    try:
        coordinator = instance.run_coordinator
        assert isinstance(coordinator, QueuedRunCoordinator)
        limits = coordinator.get_run_queue_config().tag_concurrency_limits
        assert [dict(limit) for limit in limits] == [LIMIT]
        repository = defs.get_repository_def()

        def run(job: str) -> dg.DagsterRun:
            job_def = repository.get_job(job)
            return instance.create_run_for_job(job_def, tags=dict(job_def.tags))

        ingest_a, ingest_b, retrain, train = run("daily_ingest"), run("daily_ingest"), run("retrain"), run("train")
        counter = TagConcurrencyLimitsCounter(limits, [ingest_a])
        assert counter.is_blocked(ingest_b) and counter.is_blocked(retrain)
        assert not counter.is_blocked(train)  # training reads the manifest; it never waits on ingest
        assert not TagConcurrencyLimitsCounter(limits, [train]).is_blocked(ingest_b)
    finally:
        instance.dispose()


def test_the_other_instance_configs_have_the_same_limit() -> None:
    # They need a database or a cluster to load: the same key, as Dagster's schema reads it.
    for name in ("dagster-postgres.yaml", "dagster-k8s.yaml"):
        config = yaml.safe_load((REPO_ROOT / "configs" / name).read_text(encoding="utf-8"))
        assert config["run_queue"]["tag_concurrency_limits"] == [LIMIT], name
