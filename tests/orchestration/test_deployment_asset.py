"""production_deployment, its sensor and the retrain schedule, with a real Dagster instance.

The bundled tiny home (tests/bundle_fixtures.py) is copied; serving_bundle (reused) and
production_deployment are materialized, which runs the whole gate for real (tests/core/gate
covers its steps); the sensor is evaluated against the instance's real serving_bundle
materializations; a second bundle (other serving limits) and an impossible SLO show a failed
gate as a failed run that names the step and the figure, production left as it was; the same
SLO on a machine the gate is told is busy (`gate.busy_cores_limit: 0`) shows an inconclusive
gate retried by Dagster, then ending the run as inconclusive, and the bundle gated normally after.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from aieng_core.config import ConfigError, load_config
from aieng_core.deploy.deployments import Deployments
from aieng_core.gate import DRILL_POINTER, read_report, reports_dir
from aieng_core.gate.report import STEPS, step_headline
from orchestration.assets.benchmark import benchmark_report
from orchestration.assets.data import clean_documents, raw_documents
from orchestration.assets.dataset import dataset_manifest
from orchestration.assets.deployment import BUNDLE_ID_TAG, levels_table, production_deployment
from orchestration.assets.model import model_checkpoint
from orchestration.assets.serving import serving_bundle
from orchestration.assets.tokenizer import bpe_tokenizer, tokenized_documents
from orchestration.resources import AiengResource
from orchestration.schedules import retrain_job, retrain_schedule, retrain_schedule_for
from orchestration.sensors import deploy_job, serving_bundle_sensor
from tests.conftest import TINY_CONFIG
from tests.orchestration.helpers import meta, run_materializations, step_failure_messages

pytestmark = pytest.mark.e2e  # the gate starts real `aieng serve` processes

GRAPH = [model_checkpoint, benchmark_report, serving_bundle, production_deployment]
ALL_ASSETS = [
    raw_documents,
    clean_documents,
    bpe_tokenizer,
    tokenized_documents,
    dataset_manifest,
    model_checkpoint,
    benchmark_report,
    serving_bundle,
    production_deployment,
]
RESOURCES = {"aieng": AiengResource(config_path=str(TINY_CONFIG))}


def aieng(home: Path, config: Path = TINY_CONFIG) -> dict[str, AiengResource]:
    return {"aieng": AiengResource(home=str(home), config_path=str(config))}


def write_config(folder: Path, name: str, **sections: dict[str, Any]) -> Path:
    """configs/tiny.yaml with some keys of some sections changed."""
    config = yaml.safe_load(TINY_CONFIG.read_text(encoding="utf-8"))
    for section, values in sections.items():
        config[section].update(values)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def evaluate(instance: dg.DagsterInstance, cursor: str | None, home: Path) -> tuple[list[dg.RunRequest], str | None]:
    context = dg.build_sensor_context(instance=instance, cursor=cursor, resources=aieng(home))
    data = serving_bundle_sensor.evaluate_tick(context)
    return list(data.run_requests or []), data.cursor


@dataclass
class Chain:
    home: Path
    bundle_a: str
    bundle_b: str
    gated: dg.ExecuteInProcessResult
    again: dg.ExecuteInProcessResult
    busy: dg.ExecuteInProcessResult
    refused: dg.ExecuteInProcessResult
    # Sensor evaluations: (run keys, cursor) in the order they were made.
    first_tick: tuple[list[dg.RunRequest], str | None]
    quiet_tick: tuple[list[dg.RunRequest], str | None]
    reset_tick: tuple[list[dg.RunRequest], str | None]
    reused_tick: tuple[list[dg.RunRequest], str | None]
    second_tick: tuple[list[dg.RunRequest], str | None]
    production_before_refusal: dict[str, Any]


@pytest.fixture(scope="module")
def chain(serving_bundle_artifact, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    import shutil

    root = tmp_path_factory.mktemp("deployment-asset")
    home = root / "aieng-home"
    shutil.copytree(serving_bundle_artifact.home, home)
    other = write_config(root, "max-batch-8", bundle={"max_batch": 8})
    # A failure however busy the machine is (busy_cores_limit beyond any machine's cores)...
    impossible = write_config(
        root, "impossible", bundle={"max_batch": 8}, gate={"slo_ttft_p99_ms": 0.001, "busy_cores_limit": 1000}
    )
    # ...and inconclusive whatever the load (any measured load is enough), retried once at once. One
    # stress level (48 requests: longer than a CPU sampling window) and one compare round keep its
    # two gates short.
    busy_gate = {"slo_ttft_p99_ms": 0.001, "busy_cores_limit": 0, "busy_retries": 1, "busy_retry_seconds": 0}
    busy_gate |= {"concurrencies": [1], "poisson_rates": [], "requests_per_level": 48}
    busy_gate |= {"compare_rounds": 1, "compare_max_rounds": 1}
    busy = write_config(root, "busy", bundle={"max_batch": 8}, gate=busy_gate)
    with dg.instance_for_test() as instance:

        def materialize(selection: list[Any], config: Path = TINY_CONFIG, **kwargs: Any) -> Any:
            return dg.materialize(
                GRAPH, instance=instance, resources=aieng(home, config), selection=selection, **kwargs
            )

        gated = materialize([serving_bundle, production_deployment])
        again = materialize([production_deployment])
        bundle_a = Deployments(home).current()["bundle_id"]
        first_tick = evaluate(instance, None, home)
        quiet_tick = evaluate(instance, first_tick[1], home)
        reset_tick = evaluate(instance, None, home)
        materialize([serving_bundle])  # the same bundle again (reused): same run key
        reused_tick = evaluate(instance, quiet_tick[1], home)
        materialize([serving_bundle], other)  # another bundle: another run key
        second_tick = evaluate(instance, reused_tick[1], home)
        bundle_b = second_tick[0][0].run_key if second_tick[0] else ""
        production_before_refusal = Deployments(home).status()
        undecided = materialize([production_deployment], busy, raise_on_error=False)
        refused = materialize([production_deployment], impossible, raise_on_error=False)
        yield Chain(
            home,
            bundle_a,
            bundle_b,
            gated,
            again,
            undecided,
            refused,
            first_tick,
            quiet_tick,
            reset_tick,
            reused_tick,
            second_tick,
            production_before_refusal,
        )


def deployment_materialization(result: dg.ExecuteInProcessResult) -> dg.AssetMaterialization:
    return run_materializations(result)[("production_deployment", None)]


def test_the_gate_promotes_the_current_bundle(chain: Chain, serving_bundle_artifact) -> None:
    assert chain.gated.success
    assert chain.bundle_a == serving_bundle_artifact.bundle.id
    materialization = deployment_materialization(chain.gated)
    values = meta(materialization)
    history = Deployments(chain.home).history()
    event = history[0]
    assert (event["action"], event["to"], event["dagster_run_id"]) == ("promote", chain.bundle_a, chain.gated.run_id)
    assert event["actor"] and event["reason"] == "gate passed"
    assert values["bundle_id"] == chain.bundle_a and values["already_serving"] is False
    assert (values["sequence"], values["previous_bundle_id"], values["production_before"]) == (1, "none", "none")
    assert values["history_event"] == {k: v for k, v in event.items() if k != "figures"}
    assert materialization.tags["dagster/data_version"] == f"{chain.bundle_a}:1"
    steps_run = tuple(name for name in STEPS if name != "promote")  # the gate's steps, in order
    assert values["figures"] == {name: event["figures"][name] for name in steps_run} | {
        "promote": values["figures"]["promote"]
    }
    steps = values["gate_steps"].splitlines()
    assert [line.split(" | ")[0].strip("| ") for line in steps[2:]] == [*steps_run, "promote"]
    assert all(" | True | " in line for line in steps[2:])
    # Each row says what its step found in the words of the gate's own log line.
    report = read_report(Path(values["gate_report"]))
    for line, step in zip(steps[2:], report["steps"]):
        assert line.endswith(f" | {step_headline(step['name'], step['figures']).replace('|', chr(92) + '|')} |")
    assert values["stress_levels"] == levels_table(event["figures"]["stress"]["levels"])
    assert len(values["stress_levels"].splitlines()) == 2 + 3  # header, rule, three load levels
    # What on-call reads first: the verdict, the bundle, then one number per row.
    assert list(values)[:2] == ["verdict", "bundle_id"]
    assert values["verdict"] == f"promoted {chain.bundle_a} to production (sequence 1, was none)"
    for level, figures in event["figures"]["stress"]["levels"].items():
        slug = level.replace("=", "_").replace(".", "_")
        assert values[f"stress_{slug}_ttft_p99_ms"] == figures["ttft_ms"]["p99"], level
        assert values[f"stress_{slug}_e2el_p99_ms"] == figures["e2el_ms"]["p99"], level
    assert values["time_to_rollback_seconds"] == event["figures"]["drill"]["time_to_rollback_seconds"] > 0
    assert Path(values["gate_report"]).is_file()


def test_a_bundle_production_already_serves_is_not_gated_again(chain: Chain) -> None:
    assert chain.again.success
    values = meta(deployment_materialization(chain.again))
    assert values["already_serving"] is True and values["sequence"] == 1
    assert values["verdict"] == f"not gated again: production already serves {chain.bundle_a} (sequence 1)"
    assert values["note"] == f"production already serves serving_bundle {chain.bundle_a} (sequence 1): nothing to gate"
    assert values["history_event"]["dagster_run_id"] == chain.gated.run_id
    assert deployment_materialization(chain.again).tags["dagster/data_version"] == f"{chain.bundle_a}:1"


def test_the_sensor_requests_one_run_per_bundle_keyed_by_bundle_id(chain: Chain) -> None:
    requests, cursor = chain.first_tick
    assert [(r.run_key, r.tags[BUNDLE_ID_TAG]) for r in requests] == [(chain.bundle_a, chain.bundle_a)]
    assert cursor is not None
    # Nothing new: no request, the cursor stays.
    assert chain.quiet_tick == ([], cursor)
    # A reset cursor asks again, under the same run key: Dagster launches a run key only once.
    assert [r.run_key for r in chain.reset_tick[0]] == [chain.bundle_a]
    # The same bundle materialized again (reused) is the same run key too.
    assert [r.run_key for r in chain.reused_tick[0]] == [chain.bundle_a]
    assert int(chain.reused_tick[1]) > int(cursor)
    # A second, distinct bundle: a second request.
    assert [r.run_key for r in chain.second_tick[0]] == [chain.bundle_b]
    assert chain.bundle_b not in ("", chain.bundle_a)
    assert int(chain.second_tick[1]) > int(chain.reused_tick[1])


def test_the_sensor_targets_the_deploy_job() -> None:
    assert serving_bundle_sensor.job_name == "deploy" == deploy_job.name
    defs = dg.Definitions(assets=ALL_ASSETS, jobs=[deploy_job], sensors=[serving_bundle_sensor], resources=RESOURCES)
    job = defs.resolve_job_def("deploy")
    assert {key.to_user_string() for key in job.asset_layer.selected_asset_keys} == {"production_deployment"}


def test_a_failed_gate_fails_the_run_naming_step_and_figure(chain: Chain) -> None:
    assert not chain.refused.success
    message = step_failure_messages(chain.refused)["production_deployment"]
    assert "gate failed at stress: concurrency=1.ttft_ms.p99 = " in message and "(limit 0.001)" in message
    [failure] = chain.refused.get_step_failure_events()
    data = failure.step_failure_data.user_failure_data
    values = {key: value.value for key, value in data.metadata.items()}
    assert (values["failed_step"], values["failed_figure"], values["limit"]) == (
        "stress",
        "concurrency=1.ttft_ms.p99",
        "0.001",
    )
    assert values["bundle_id"] == chain.bundle_b and values["production_before"] == chain.bundle_a
    assert values["verdict"].startswith("refused at stress: concurrency=1.ttft_ms.p99 = ")
    assert len(values["verdict"]) <= 120 and list(data.metadata)[0] == "verdict"
    assert " | False | " in values["gate_steps"].splitlines()[-1]
    assert Path(values["gate_report"]).is_file()
    # Production still serves the first bundle; the drill never ran.
    assert Deployments(chain.home).status() == chain.production_before_refusal
    assert Deployments(chain.home).current()["bundle_id"] == chain.bundle_a
    assert [e["to"] for e in Deployments(chain.home, DRILL_POINTER).history()][-1] == chain.bundle_a


def test_an_inconclusive_gate_is_retried_then_fails_as_inconclusive_not_refused(chain: Chain) -> None:
    result = chain.busy
    assert not result.success
    kinds = [event.event_type_value for event in result.all_events if event.step_key == "production_deployment"]
    assert kinds.count("STEP_UP_FOR_RETRY") == 1 and kinds.count("STEP_RESTARTED") == 1  # gate.busy_retries 1
    [failure] = result.get_step_failure_events()
    data = failure.step_failure_data.user_failure_data
    assert data.description.startswith("inconclusive: the machine was busy (other processes took ")
    assert "production unchanged, the bundle not refused; after 2 attempts" in data.description
    values = {key: value.value for key, value in data.metadata.items()}
    assert list(values)[:2] == ["verdict", "outcome"]
    assert values["verdict"].startswith("inconclusive: the machine was busy (") and len(values["verdict"]) <= 120
    assert (values["outcome"], values["inconclusive_step"], values["attempts"]) == ("inconclusive", "stress", 2)
    assert values["broken_figure"] == "concurrency=1.ttft_ms.p99" and values["bundle_id"] == chain.bundle_b
    last = values["gate_steps"].splitlines()[-1]
    assert last.startswith("| stress | False | ") and last.endswith(" | inconclusive: see verdict |")
    # Each attempt gated the bundle from the start and wrote its report, inconclusive.
    reports = [read_report(path) for path in reports_dir(chain.home).glob(f"*-{result.run_id}.json")]
    assert [r["outcome"] for r in reports] == ["inconclusive", "inconclusive"]
    assert all([s["name"] for s in r["steps"]] == list(STEPS[:5]) for r in reports)
    # Production unchanged; the next run gates the same bundle normally (here: to a real refusal).
    assert Deployments(chain.home).status()["sequence"] == chain.production_before_refusal["sequence"]
    [refusal] = chain.refused.get_step_failure_events()
    refused = {key: value.value for key, value in refusal.step_failure_data.user_failure_data.metadata.items()}
    assert (refused["outcome"], refused["failed_step"]) == ("failed", "stress")
    assert [s["name"] for s in read_report(Path(refused["gate_report"]))["steps"]] == list(STEPS[:5])


def test_the_retrain_job_is_everything_from_the_dataset_manifest_to_the_bundle() -> None:
    defs = dg.Definitions(assets=ALL_ASSETS, jobs=[retrain_job], schedules=[retrain_schedule], resources=RESOURCES)
    job = defs.resolve_job_def("retrain")
    assert {key.to_user_string() for key in job.asset_layer.selected_asset_keys} == {
        "dataset_manifest",
        "model_checkpoint",
        "benchmark_report",
        "serving_bundle",
    }
    assert job.partitions_def is None


def test_the_retrain_schedule_runs_on_the_configured_cron() -> None:
    assert retrain_schedule.cron_schedule == load_config(TINY_CONFIG).gate.retrain_cron == "0 3 * * 1"
    assert retrain_schedule.execution_timezone == "UTC" and retrain_schedule.job_name == "retrain"
    context = dg.build_schedule_context(scheduled_execution_time=datetime(2026, 1, 5, 3, 0, tzinfo=UTC))
    # gate.retrain is on_new_data by default: the retrain sensor trains, this schedule does not.
    skipped = retrain_schedule.evaluate_tick(context)
    assert list(skipped.run_requests or []) == []
    assert skipped.skip_message == "gate.retrain is on_new_data, not cron: this schedule trains nothing"


def test_the_retrain_schedule_trains_when_the_policy_is_cron(tmp_path: Path) -> None:
    path = write_config(tmp_path, "cron", gate={"retrain": "cron"})
    schedule = retrain_schedule_for(load_config(path), path)
    context = dg.build_schedule_context(scheduled_execution_time=datetime(2026, 1, 5, 3, 0, tzinfo=UTC))
    [request] = list(schedule.evaluate_tick(context).run_requests or [])
    assert request.job_name in (None, "retrain") and request.partition_key is None


def test_another_cron_gives_another_schedule(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, "daily", gate={"retrain_cron": "30 2 * * *"}))
    schedule = retrain_schedule_for(config)
    assert schedule.cron_schedule == "30 2 * * *" and schedule.job_name == "retrain"
    bad = config.model_copy(update={"gate": config.gate.model_copy(update={"retrain_cron": "every monday"})})
    with pytest.raises(ConfigError, match=r"gate\.retrain_cron: 'every monday' is not a cron expression"):
        retrain_schedule_for(bad, "some.yaml")


def test_the_new_modules_keep_the_code_location_light() -> None:
    import subprocess
    import sys

    script = (
        "import sys, orchestration.assets.deployment, orchestration.sensors, orchestration.schedules; "
        "print(sorted(m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"
