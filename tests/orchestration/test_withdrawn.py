"""A bundle a rollback withdrew stays withdrawn in Dagster: production_deployment refuses it
(naming the rollback) unless the run says `aieng/allow_withdrawn=true`, and
serving_bundle_sensor requests no gate run for it, so the retrain schedule (whose bundles reach
the gate only through that sensor) never re-gates it when it rebuilds the same bundle id.

Bundles A and B are real (tests/core/deploy); production: A promoted, B promoted, rolled back
to A (B withdrawn). Real Dagster instance; the sensor reads real serving_bundle
materialization records, as a retrain writes them (`artifact_id` metadata).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from aieng_core.asset_keys import SERVING_BUNDLE
from aieng_core.deploy.deployments import Deployments
from aieng_core.deploy.withdrawn import withdrawn_refusal
from aieng_core.gate import reports_dir
from aieng_core.store import ArtifactStore
from orchestration.assets.deployment import ALLOW_WITHDRAWN_TAG, production_deployment
from orchestration.assets.serving import serving_bundle
from orchestration.resources import AiengResource
from orchestration.schedules import RETRAIN_ASSETS, retrain_job
from orchestration.sensors import serving_bundle_sensor
from tests.conftest import TINY_CONFIG
from tests.core.deploy import BundlePair
from tests.orchestration.helpers import flip_a_byte, step_failure_messages


def resources(home: Path) -> dict[str, AiengResource]:
    return {"aieng": AiengResource(home=str(home), config_path=str(TINY_CONFIG))}


def withdraw_b(home: Path, pair: BundlePair) -> dict[str, Any]:
    """A, then B, then a rollback to A: B is withdrawn. Returns the rollback event."""
    production = Deployments(home)
    production.promote(pair.a.id, verify=False)
    production.promote(pair.b.id, verify=False)
    return production.rollback(reason="answers got worse", verify=False)


def bundle_built(instance: dg.DagsterInstance, bundle_id: str) -> None:
    """A serving_bundle materialization as a retrain records it."""
    instance.report_runless_asset_event(
        dg.AssetMaterialization(asset_key=SERVING_BUNDLE, metadata={"artifact_id": bundle_id})
    )


def tick(instance: dg.DagsterInstance, home: Path, cursor: str | None) -> Any:
    context = dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources(home))
    return serving_bundle_sensor.evaluate_tick(context)


def test_a_retrain_that_rebuilds_a_withdrawn_bundle_requests_no_gate_run(
    deploy_home: Path, pair: BundlePair, capfd: pytest.CaptureFixture[str]
) -> None:
    rollback = withdraw_b(deploy_home, pair)
    with dg.instance_for_test() as instance:
        bundle_built(instance, pair.b.id)
        bundle_built(instance, pair.b.id)  # retrained twice: the same recipe, the same id
        capfd.readouterr()
        data = tick(instance, deploy_home, None)
        logged = capfd.readouterr().err  # the sensor's log lines (dagster's handler writes them to stderr)
        assert list(data.run_requests) == []
        assert data.skip_message == f"no serving_bundle to gate (withdrawn: {pair.b.id})"
        last = instance.fetch_materializations(dg.AssetKey(SERVING_BUNDLE), limit=1).records[0].storage_id
        assert data.cursor == str(last)  # the cursor moves on: B is not asked about again
        lines = [line for line in logged.splitlines() if "no gate run" in line]
        assert len(lines) == 1, lines
        assert lines[0].endswith(f"no gate run: {withdrawn_refusal(pair.b.id, rollback, 'production')}")
        assert f"sequence {rollback['sequence']}" in lines[0] and "'answers got worse'" in lines[0]

        # A bundle that is not withdrawn still gets its run, beside a withdrawn one.
        bundle_built(instance, pair.b.id)
        bundle_built(instance, pair.a.id)
        later = tick(instance, deploy_home, data.cursor)
        assert [r.run_key for r in later.run_requests] == [pair.a.id]


def test_the_retrain_job_never_runs_the_gate() -> None:
    defs = dg.Definitions(
        assets=[*RETRAIN_ASSETS, production_deployment], jobs=[retrain_job], resources=resources(Path("unused"))
    )
    selected = defs.resolve_job_def("retrain").asset_layer.selected_asset_keys
    assert production_deployment.key not in selected and serving_bundle.key in selected


def materialize_gate(instance: dg.DagsterInstance, home: Path, tags: dict[str, str] | None = None) -> Any:
    return dg.materialize(
        [serving_bundle, production_deployment],
        selection=[production_deployment],
        instance=instance,
        resources=resources(home),
        tags=tags,
        raise_on_error=False,
    )


def test_the_gate_asset_refuses_a_withdrawn_bundle_naming_the_rollback(deploy_home: Path, pair: BundlePair) -> None:
    rollback = withdraw_b(deploy_home, pair)
    store = ArtifactStore(deploy_home)
    store.set_current(store.get(SERVING_BUNDLE, pair.b.id))  # a retrain made B the current bundle again
    before = Deployments(deploy_home).status()
    with dg.instance_for_test() as instance:
        result = materialize_gate(instance, deploy_home)
    assert not result.success
    [failure] = result.get_step_failure_events()
    data = failure.step_failure_data.user_failure_data
    assert data.description == (
        f"{withdrawn_refusal(pair.b.id, rollback, 'production')}; to gate it anyway, run with the tag "
        "aieng/allow_withdrawn=true"
    )
    assert {key: value.value for key, value in data.metadata.items()} == {
        "bundle_id": pair.b.id,
        "withdrawn_by_sequence": 3,
        "time": rollback["time"],
        "reason": "answers got worse",
        "actor": rollback["actor"],
    }
    assert Deployments(deploy_home).status() == before
    assert not reports_dir(deploy_home).exists() or list(reports_dir(deploy_home).glob("*.json")) == []


def test_the_tag_lets_the_gate_run_on_a_withdrawn_bundle(deploy_home: Path, pair: BundlePair) -> None:
    withdraw_b(deploy_home, pair)
    store = ArtifactStore(deploy_home)
    b = store.get(SERVING_BUNDLE, pair.b.id)
    store.set_current(b)
    # B is damaged too, so the gate that now runs stops at its first step, in seconds.
    flip_a_byte(next(path for path in sorted(b.path.iterdir()) if path.suffix == ".safetensors"))
    with dg.instance_for_test() as instance:
        result = materialize_gate(instance, deploy_home, tags={ALLOW_WITHDRAWN_TAG: "true"})
        refused = materialize_gate(instance, deploy_home, tags={ALLOW_WITHDRAWN_TAG: "yes"})  # only "true" says so
    assert not result.success
    message = step_failure_messages(result)["production_deployment"]
    assert "gate failed at verify: problems" in message and "withdrawn" not in message
    assert "was withdrawn from production by the rollback" in step_failure_messages(refused)["production_deployment"]
    assert Deployments(deploy_home).current()["bundle_id"] == pair.a.id
