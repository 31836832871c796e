"""deployment_pointer_sensor: changes of the production pointer that Dagster was not told of
become materializations of production_deployment, each sequence once.

A real Dagster instance (instance_for_test) and a real deployment pointer: bundles A and B
(tests/core/deploy) promoted and rolled back with Deployments, as `aieng deploy` does with
AIENG_DAGSTER_URL unset. The sensor's asset events are recorded in the instance as the daemon
records them (helpers.tick_like_the_daemon).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import dagster as dg

from aieng_core.deploy.deployments import Deployments
from orchestration.resources import AiengResource
from orchestration.sensors import deployment_pointer_sensor, unfinished_gate_run
from tests.conftest import TINY_CONFIG
from tests.core.deploy import BundlePair
from tests.orchestration.helpers import materializations, meta, tick_like_the_daemon

KEY = "production_deployment"


@dg.op
def _nothing() -> None:
    pass


@dg.job
def gate_stand_in() -> None:
    """A job whose run stands in for a gate run that promoted and has not finished yet."""
    _nothing()


def resources(home: Path) -> dict[str, AiengResource]:
    return {"aieng": AiengResource(home=str(home), config_path=str(TINY_CONFIG))}


def test_every_unrecorded_change_is_recorded_once(deploy_home: Path, pair: BundlePair) -> None:
    production = Deployments(deploy_home)
    production.promote(pair.a.id, verify=False, reason="first")
    production.promote(pair.b.id, verify=False)
    rollback = production.rollback(reason="latency regression", verify=False)
    with dg.instance_for_test() as instance:
        first = tick_like_the_daemon(deployment_pointer_sensor, instance, None, resources(deploy_home))
        assert first.cursor == "3" and len(first.asset_events) == 3
        recorded = materializations(instance, KEY)
        assert [meta(m)["sequence"] for m in recorded] == [1, 2, 3]
        assert [meta(m)["bundle_id"] for m in recorded] == [pair.a.id, pair.b.id, pair.a.id]
        latest = meta(recorded[-1])
        assert {key: latest[key] for key in ("action", "from", "reason", "pointer", "reported_by", "withdrawn")} == {
            "action": "rollback",
            "from": pair.b.id,
            "reason": "latency regression",
            "pointer": "production",
            "reported_by": "deployment_pointer_sensor",
            "withdrawn": pair.b.id,
        }
        assert (latest["actor"], latest["time"]) == (rollback["actor"], rollback["time"])
        assert recorded[-1].tags["dagster/data_version"] == f"{pair.a.id}:3"
        assert meta(recorded[0])["from"] == "none" and meta(recorded[0])["allow_withdrawn"] is False

        # Nothing new: no event, whichever cursor it is given (the instance's latest names sequence 3).
        for cursor in (first.cursor, None):
            again = tick_like_the_daemon(deployment_pointer_sensor, instance, cursor, resources(deploy_home))
            assert again.asset_events == [] and again.cursor == cursor
            assert "already" in again.skip_message
        assert len(materializations(instance, KEY)) == 3

        # A later change: exactly one more.
        production.promote(pair.b.id, verify=False, allow_withdrawn=True, reason="fixed in config")
        later = tick_like_the_daemon(deployment_pointer_sensor, instance, first.cursor, resources(deploy_home))
        assert later.cursor == "4"
        recorded = materializations(instance, KEY)
        assert [meta(m)["sequence"] for m in recorded] == [1, 2, 3, 4]
        assert (meta(recorded[-1])["bundle_id"], meta(recorded[-1])["allow_withdrawn"]) == (pair.b.id, True)


def test_only_what_the_instance_lacks_is_recorded(deploy_home: Path, pair: BundlePair) -> None:
    production = Deployments(deploy_home)
    production.promote(pair.a.id, verify=False)
    production.promote(pair.b.id, verify=False)
    production.rollback(verify=False)
    with dg.instance_for_test() as instance:
        # The CLI told Dagster of sequence 1 (a gate run records `sequence` the same way).
        told = dg.AssetMaterialization(asset_key=KEY, metadata={"bundle_id": pair.a.id, "sequence": 1})
        instance.report_runless_asset_event(told)
        data = tick_like_the_daemon(deployment_pointer_sensor, instance, None, resources(deploy_home))
        assert [meta(m)["sequence"] for m in materializations(instance, KEY)] == [1, 2, 3]
        assert data.cursor == "3"

        # A materialization naming no sequence (reported by hand): the cursor decides.
        instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=KEY))
        quiet = tick_like_the_daemon(deployment_pointer_sensor, instance, data.cursor, resources(deploy_home))
        assert quiet.asset_events == [] and len(materializations(instance, KEY)) == 4


def test_a_gate_run_still_running_records_its_own_promote(deploy_home: Path, pair: BundlePair) -> None:
    production = Deployments(deploy_home)
    production.promote(pair.a.id, verify=False)
    with dg.instance_for_test() as instance:
        run = instance.create_run_for_job(gate_stand_in, status=dg.DagsterRunStatus.STARTED)
        production.promote(pair.b.id, verify=False, dagster_run_id=run.run_id)
        data = tick_like_the_daemon(deployment_pointer_sensor, instance, None, resources(deploy_home))
        # Sequence 1 is recorded; 2 is left to its run (and so is anything after it, in order).
        assert [meta(m)["sequence"] for m in materializations(instance, KEY)] == [1]
        assert data.cursor == "1"
        instance.report_run_failed(instance.get_run_by_id(run.run_id))  # it ended without recording it
        data = tick_like_the_daemon(deployment_pointer_sensor, instance, data.cursor, resources(deploy_home))
        assert [meta(m)["sequence"] for m in materializations(instance, KEY)] == [1, 2]
        assert data.cursor == "2"


def test_a_run_unfinished_long_after_its_promote_is_not_waited_for() -> None:
    with dg.instance_for_test() as instance:
        run = instance.create_run_for_job(gate_stand_in, status=dg.DagsterRunStatus.STARTED)
        now = dt.datetime.now(dt.UTC)
        recent = {"dagster_run_id": run.run_id, "time": now.isoformat()}
        old = {"dagster_run_id": run.run_id, "time": (now - dt.timedelta(hours=1)).isoformat()}
        assert unfinished_gate_run(instance, recent) == run.run_id
        assert unfinished_gate_run(instance, old) is None
        assert unfinished_gate_run(instance, {"dagster_run_id": "not-a-run-here", "time": now.isoformat()}) is None


def test_a_latest_naming_another_history_is_replaced_by_what_serves_here(deploy_home: Path, pair: BundlePair) -> None:
    """Another home reported sequence 9 (or sequence 1 with another bundle) to this instance:
    the UI would name a bundle this pointer never named. What it serves is recorded, once."""
    Deployments(deploy_home).promote(pair.a.id, verify=False)
    with dg.instance_for_test() as instance:
        for foreign in ({"sequence": 9, "bundle_id": pair.a.id}, {"sequence": 1, "bundle_id": pair.b.id}):
            instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=KEY, metadata=foreign))
            data = tick_like_the_daemon(deployment_pointer_sensor, instance, None, resources(deploy_home))
            assert [(meta(m)["sequence"], meta(m)["bundle_id"]) for m in materializations(instance, KEY)][-1] == (
                1,
                pair.a.id,
            )
            assert data.cursor == "1"
            again = tick_like_the_daemon(deployment_pointer_sensor, instance, data.cursor, resources(deploy_home))
            assert again.asset_events == []
        assert len(materializations(instance, KEY)) == 4  # two foreign reports, each answered once


def test_nothing_deployed_records_nothing(deploy_home: Path) -> None:
    with dg.instance_for_test() as instance:
        data = tick_like_the_daemon(deployment_pointer_sensor, instance, None, resources(deploy_home))
        assert data.asset_events == [] and materializations(instance, KEY) == []
