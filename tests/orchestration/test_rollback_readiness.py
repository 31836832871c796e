"""rollback_target_ready, the asset check on production_deployment, run by the
`rollback_readiness` job (the check alone) on its schedule, against a real instance.

Bundles A and B are real (tests/core/deploy). Nothing to roll back to passes and says so; A
under B passes with its goldens replayed; one byte changed in A fails the check (severity
ERROR) naming the file, and every outcome is the one rollback-check.json records.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from aieng_core.config import ConfigError, load_config
from aieng_core.deploy.deployments import Deployments
from aieng_core.store.rollback_check import check_path, read_check
from orchestration.assets.deployment import production_deployment, rollback_target_ready
from orchestration.assets.serving import serving_bundle
from orchestration.resources import AiengResource
from orchestration.schedules import rollback_readiness_job, rollback_readiness_schedule, rollback_readiness_schedule_for
from tests.conftest import TINY_CONFIG
from tests.core.deploy import BundlePair
from tests.orchestration.helpers import flip_a_byte


def check_job(home: Path) -> dg.JobDefinition:
    defs = dg.Definitions(
        assets=[serving_bundle, production_deployment],
        asset_checks=[rollback_target_ready],
        jobs=[rollback_readiness_job],
        resources={"aieng": AiengResource(home=str(home), config_path=str(TINY_CONFIG))},
    )
    return defs.resolve_job_def("rollback_readiness")


def run_check(home: Path) -> tuple[dg.ExecuteInProcessResult, Any]:
    """The job as the schedule runs it: (the run, its one check evaluation)."""
    with dg.instance_for_test() as instance:
        result = check_job(home).execute_in_process(instance=instance, raise_on_error=False)
        assert result.success, "a failed check is a result, not a failed run"
        [evaluation] = result.get_asset_check_evaluations()
        # The job runs the check alone: production_deployment (the gate) is not materialized.
        assert result.get_asset_materialization_events() == []
        assert instance.fetch_materializations(production_deployment.key, limit=5).records == []
    return result, evaluation


def values(evaluation: Any) -> dict[str, Any]:
    return {key: value.value for key, value in evaluation.metadata.items()}


def test_the_job_is_the_check_alone() -> None:
    job = check_job(Path("unused"))
    assert [node.name for node in job.graph.node_defs] == ["production_deployment_rollback_target_ready"]
    assert job.asset_layer.selected_asset_keys == set()


def test_nothing_to_roll_back_to_passes_and_says_so(deploy_home: Path, pair: BundlePair) -> None:
    Deployments(deploy_home).promote(pair.a.id, verify=False)
    _, evaluation = run_check(deploy_home)
    assert evaluation.passed and evaluation.check_name == "rollback_target_ready"
    found = values(evaluation)
    assert (found["bundle_id"], found["goldens_checked"], found["problems"], found["sequence"]) == ("none", 0, [], 1)
    assert found["note"] == "nothing to roll back to: production (sequence 1) has no earlier bundle left"
    assert read_check(deploy_home)["ok"] is None


def test_a_ready_target_passes_with_its_goldens_replayed(deploy_home: Path, pair: BundlePair) -> None:
    production = Deployments(deploy_home)
    production.promote(pair.a.id, verify=False)
    production.promote(pair.b.id, verify=False)
    _, evaluation = run_check(deploy_home)
    assert evaluation.passed
    found = values(evaluation)
    recorded = read_check(deploy_home)
    assert recorded["ok"] is True and recorded["bundle_id"] == pair.a.id
    recipe = load_config(TINY_CONFIG).bundle
    goldens = len(recipe.golden_prompts) + len(recipe.golden_conversations)
    assert (found["bundle_id"], found["goldens_checked"], found["problems"]) == (pair.a.id, goldens, [])
    assert (found["checked_at"], found["seconds"], found["sequence"]) == (
        recorded["checked_at"],
        recorded["seconds"],
        2,
    )
    assert found["result_file"] == str(check_path(deploy_home))
    assert evaluation.description.startswith(f"rollback target {pair.a.id} is ready: re-hashed, loaded, {goldens}")


def test_a_damaged_target_fails_the_check_naming_the_file(deploy_home: Path, pair: BundlePair) -> None:
    production = Deployments(deploy_home)
    production.promote(pair.a.id, verify=False)
    production.promote(pair.b.id, verify=False)
    a = production.store.get("serving_bundle", pair.a.id)
    damaged = next(path for path in sorted(a.path.iterdir()) if path.suffix == ".safetensors")
    flip_a_byte(damaged)
    _, evaluation = run_check(deploy_home)
    assert not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.ERROR
    found = values(evaluation)
    assert found["bundle_id"] == pair.a.id and found["problems"] == read_check(deploy_home)["problems"]
    assert found["problems"] and damaged.name in found["problems"][0]
    assert evaluation.description.startswith(f"rollback target {pair.a.id} is not ready: ")
    assert damaged.name in evaluation.description
    assert read_check(deploy_home)["ok"] is False


def test_damaged_pointer_files_fail_the_check_naming_them(deploy_home: Path, pair: BundlePair) -> None:
    production = Deployments(deploy_home)
    production.promote(pair.a.id, verify=False)
    production.current_path.write_text("{not json", encoding="utf-8")
    _, evaluation = run_check(deploy_home)
    assert not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.ERROR
    assert evaluation.description.startswith(f"{production.current_path}: not valid JSON")
    assert values(evaluation)["problems"] == [evaluation.description]


def test_the_schedule_runs_the_job_on_the_configured_cron(tmp_path: Path) -> None:
    schedule = rollback_readiness_schedule
    assert schedule.cron_schedule == load_config(TINY_CONFIG).gate.rollback_check_cron
    assert (schedule.execution_timezone, schedule.job_name) == ("UTC", "rollback_readiness")
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING  # the retrain's starts stopped
    context = dg.build_schedule_context(scheduled_execution_time=datetime(2026, 1, 5, 3, 23, tzinfo=UTC))
    [request] = list(schedule.evaluate_tick(context).run_requests or [])
    assert request.job_name in (None, "rollback_readiness")

    config = load_config(TINY_CONFIG)
    other = config.model_copy(update={"gate": config.gate.model_copy(update={"rollback_check_cron": "*/5 * * * *"})})
    assert rollback_readiness_schedule_for(other).cron_schedule == "*/5 * * * *"
    bad = config.model_copy(update={"gate": config.gate.model_copy(update={"rollback_check_cron": "every hour"})})
    with pytest.raises(ConfigError) as refused:
        rollback_readiness_schedule_for(bad, "some.yaml")
    assert str(refused.value) == (
        "some.yaml: invalid config: gate.rollback_check_cron: 'every hour' is not a cron expression of 5 fields "
        "(minute hour day-of-month month day-of-week)"
    )
