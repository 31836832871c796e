"""New data retrains by itself: the retrain sensor's decision on a real store and instance, and
the eager conditions that carry a new model to its benchmark and bundle."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import dagster as dg
import yaml
from dagster._core.test_utils import create_run_for_test

from aieng_core.data.clean_documents import build_clean_documents
from aieng_core.data.demo_data import land_demo_data
from aieng_core.data.raw_documents import build_raw_documents
from aieng_core.dataset.dataset_manifest import build_dataset_manifest
from aieng_core.store import ArtifactStore
from aieng_core.tokenizer.tokenized_documents import build_tokenized_documents
from orchestration.definitions import defs
from orchestration.resources import AiengResource
from orchestration.retrain import retrain_decision
from tests.conftest import TINY_CONFIG

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def copied(trained_home, tmp_path: Path) -> Path:
    home = tmp_path / "home"
    shutil.copytree(trained_home.home, home)
    return home


def config_with(tmp_path: Path, **gate) -> str:
    document = yaml.safe_load(TINY_CONFIG.read_text(encoding="utf-8"))
    document["gate"] = {**document.get("gate", {}), **gate}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return str(path)


def new_day(home: Path, config) -> str:
    """Land and ingest a fourth day: a new dataset manifest the model was not trained on."""
    store = ArtifactStore(home)
    land_demo_data(home, start_date=dt.date(2026, 1, 4), days=1)
    build_raw_documents(store, config, "2026-01-04")
    build_clean_documents(store, config, "2026-01-04")
    build_tokenized_documents(store, config, "2026-01-04")
    return build_dataset_manifest(store, config).id


def test_the_model_of_the_current_data_trains_nothing(trained_home, tmp_path: Path) -> None:
    home = copied(trained_home, tmp_path)
    aieng = AiengResource(home=str(home), config_path=str(TINY_CONFIG))
    with dg.instance_for_test() as instance:
        request, why = retrain_decision(aieng, instance, {}, NOW)
    dataset = ArtifactStore(home).require_current("dataset_manifest").id
    assert request is None
    assert why == f"the current model {trained_home.model.id} was trained on it: dataset manifest {dataset}"


def test_new_data_trains_once_spaced_by_the_minimum_interval(trained_home, tmp_path: Path) -> None:
    home = copied(trained_home, tmp_path)
    dataset = new_day(home, trained_home.config)
    aieng = AiengResource(home=str(home), config_path=config_with(tmp_path, retrain_min_interval_minutes=60))
    with dg.instance_for_test() as instance:
        request, why = retrain_decision(aieng, instance, {}, NOW)
        assert request is not None and request.run_key == f"train:{dataset}"
        assert request.tags == {"aieng/dataset_manifest_id": dataset}
        assert why.startswith(f"training on dataset manifest {dataset} (the current model's: ")
        # Requested 10 minutes ago: the next may start 60 minutes after that one.
        recent = {"requested_at": (NOW - dt.timedelta(minutes=10)).isoformat()}
        request, why = retrain_decision(aieng, instance, recent, NOW)
        assert request is None
        assert why == (
            f"dataset manifest {dataset} is new, but the last training started at 2026-12-01T11:50:00+00:00: "
            "gate.retrain_min_interval_minutes 60 lets the next start at 2026-12-01T12:50:00+00:00"
        )
        long_ago = {"requested_at": (NOW - dt.timedelta(minutes=61)).isoformat()}
        assert retrain_decision(aieng, instance, long_ago, NOW)[0] is not None
        # A training in progress: nothing more until it ends.
        run = create_run_for_test(instance, job_name="train", status=dg.DagsterRunStatus.STARTED)
        request, why = retrain_decision(aieng, instance, long_ago, NOW)
        assert request is None
        assert why == f"a training is in progress (run {run.run_id}); dataset manifest {dataset} waits"


def test_the_policy_decides_who_trains(trained_home, tmp_path: Path) -> None:
    home = copied(trained_home, tmp_path)
    new_day(home, trained_home.config)
    with dg.instance_for_test() as instance:
        for policy, why in (
            ("cron", "gate.retrain is cron: retrain_schedule trains on gate.retrain_cron, once it is started"),
            ("manual", "gate.retrain is manual: trainings start by hand"),
        ):
            aieng = AiengResource(home=str(home), config_path=config_with(tmp_path, retrain=policy))
            assert retrain_decision(aieng, instance, {}, NOW) == (None, why)


def test_the_sensor_records_its_request_in_the_cursor(trained_home, tmp_path: Path) -> None:
    home = copied(trained_home, tmp_path)
    dataset = new_day(home, trained_home.config)
    sensor = defs.resolve_sensor_def("retrain_sensor")
    resources = {"aieng": AiengResource(home=str(home), config_path=str(TINY_CONFIG))}
    with dg.instance_for_test() as instance:
        context = dg.build_sensor_context(instance=instance, resources=resources, definitions=defs)
        result = sensor.evaluate_tick(context)
        assert [r.run_key for r in result.run_requests] == [f"train:{dataset}"]
        assert result.run_requests[0].job_name in (None, "train")
        assert json.loads(result.cursor)["dataset_manifest_id"] == dataset
        # Next tick: requested a moment ago, so it waits (tiny.yaml keeps the default 60 minutes).
        context = dg.build_sensor_context(
            instance=instance, resources=resources, definitions=defs, cursor=result.cursor
        )
        again = sensor.evaluate_tick(context)
        assert list(again.run_requests) == [] and "gate.retrain_min_interval_minutes 60" in again.skip_message


def test_a_new_model_is_benchmarked_and_bundled_by_automation() -> None:
    with dg.instance_for_test() as instance:
        first = dg.evaluate_automation_conditions(defs=defs, instance=instance)
        assert first.total_requested == 0  # no model yet: nothing to benchmark
        instance.report_runless_asset_event(dg.AssetMaterialization(asset_key="dataset_manifest"))
        instance.report_runless_asset_event(dg.AssetMaterialization(asset_key="model_checkpoint"))
        second = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
        requested = {key: second.get_num_requested(dg.AssetKey(key)) for key in ("benchmark_report", "serving_bundle")}
        assert requested == {"benchmark_report": 1, "serving_bundle": 1}  # one run: the bundle follows its report
        # Handled: the next evaluation requests nothing more for the same model.
        third = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=second.cursor)
        assert third.total_requested == 0


def test_a_failed_training_is_named_not_retried_and_a_partial_model_resumes(trained_home, tmp_path: Path) -> None:
    home = copied(trained_home, tmp_path)
    dataset = new_day(home, trained_home.config)
    aieng = AiengResource(home=str(home), config_path=config_with(tmp_path, retrain_min_interval_minutes=0))
    with dg.instance_for_test() as instance:
        failed = create_run_for_test(
            instance, job_name="train", status=dg.DagsterRunStatus.FAILURE, tags={"dagster/run_key": f"train:{dataset}"}
        )
        request, why = retrain_decision(aieng, instance, {}, NOW)
        assert request is None
        assert why.startswith(f"the training of dataset manifest {dataset} failed in run {failed.run_id}: ")
    # A model stopped by training.max_minutes on the current data: resumed, a key per resume.
    store = ArtifactStore(home)
    model = store.require_current("model_checkpoint")
    manifest = json.loads((model.path / "manifest.json").read_text(encoding="utf-8"))
    manifest["metrics"] = {**manifest["metrics"], "partial": True, "steps": 40}
    manifest["inputs"] = [{"kind": "dataset_manifest", "id": dataset}]
    (model.path / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    with dg.instance_for_test() as instance:
        request, why = retrain_decision(aieng, instance, {}, NOW)
    assert request is not None and request.run_key == f"train:{dataset}:from-step-40"
    assert why == f"resuming the partial model {model.id} at step 40 on {dataset}"
