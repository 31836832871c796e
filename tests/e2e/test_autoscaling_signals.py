"""The autoscaling signals (issue 22 item 4): the recording rules of configs/recording-rules.yml
checked and unit-tested by promtool on synthetic replicas of two deployments, evaluated by a
real Prometheus scraping a real `aieng serve`, and the KEDA ScaledObject of
configs/keda-scaledobject.yaml read for what it promises: it scales on the recorded queue
length, out at once and in after a cooldown five to ten times longer.

There is no Kubernetes here: the manifest is checked as a document (its query names a series
the rules record, its behaviour's numbers), not applied.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from aieng_core.loadgen.server_process import ServerProcess
from tests.conftest import TINY_CONFIG
from tests.e2e.serve_helpers import poll
from tests.e2e.test_prometheus import JOB, READBACK_S, query, running_prometheus, system_binary

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
RULES_FILE = REPO_ROOT / "configs" / "recording-rules.yml"
SCALED_OBJECT_FILE = REPO_ROOT / "configs" / "keda-scaledobject.yaml"
QUEUE = "deployment:aieng_num_requests_waiting:sum"
RECORDED = {
    QUEUE: "sum",
    "deployment:aieng_num_requests_waiting:avg": "avg",
    "deployment:aieng_num_requests_running:sum": "sum",
    "deployment:aieng_kv_cache_free_slots:sum": "sum",
    "deployment:aieng_kv_cache_slots:sum": "sum",
    "deployment:aieng_ready:sum": "sum",
}


def recording_rules() -> dict[str, str]:
    """Recorded series name -> its expression."""
    (group,) = yaml.safe_load(RULES_FILE.read_text(encoding="utf-8"))["groups"]
    return {rule["record"]: rule["expr"] for rule in group["rules"]}


def test_the_rules_record_each_signal_per_deployment() -> None:
    rules = recording_rules()
    assert sorted(rules) == sorted(RECORDED)
    for name, expr in rules.items():
        level, metric, operation = name.split(":")  # Prometheus' level:metric:operations naming
        assert (level, operation) == ("deployment", RECORDED[name])
        assert expr == f'{operation} by (namespace, deployment) ({metric}{{job="{JOB}"}})'


def test_promtool_accepts_the_recording_rules() -> None:
    promtool = system_binary("promtool")
    result = subprocess.run(
        [promtool, "check", "rules", str(RULES_FILE)], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(RECORDED)} rules found" in result.stdout, result.stdout


def replica(metric: str, deployment: str, instance: str, values: str, job: str = JOB) -> dict[str, str]:
    labels = f'job="{job}", instance="{instance}", namespace="aieng", deployment="{deployment}"'
    return {"series": f"{metric}{{{labels}}}", "values": values}


def test_promtool_unit_tests_of_the_recording_rules(tmp_path: Path) -> None:
    """Deployment serve-a has three replicas: at 1m their queues are 3, 5 and 1; r3 stops
    answering scrapes after 1m (its series go stale) and is no longer counted at 2m. serve-b
    has one idle replica. A target of another job with the same labels is never counted."""
    promtool = system_binary("promtool")
    a, b = {"namespace": "aieng", "deployment": "serve-a"}, {"namespace": "aieng", "deployment": "serve-b"}
    series = [
        replica("aieng_num_requests_waiting", "serve-a", "r1", "3x8"),
        replica("aieng_num_requests_waiting", "serve-a", "r2", "5x4 9x4"),
        replica("aieng_num_requests_waiting", "serve-a", "r3", "1x4 stale"),
        replica("aieng_num_requests_waiting", "serve-b", "r4", "0x8"),
        replica("aieng_num_requests_waiting", "serve-a", "other", "100x8", job="not-aieng"),
        replica("aieng_num_requests_running", "serve-a", "r1", "16x8"),
        replica("aieng_num_requests_running", "serve-a", "r2", "16x8"),
        replica("aieng_num_requests_running", "serve-a", "r3", "2x4 stale"),
        replica("aieng_kv_cache_free_slots", "serve-a", "r1", "0x8"),
        replica("aieng_kv_cache_free_slots", "serve-a", "r2", "0x8"),
        replica("aieng_kv_cache_free_slots", "serve-a", "r3", "14x4 stale"),
        replica("aieng_kv_cache_free_slots", "serve-b", "r4", "16x8"),
        replica("aieng_kv_cache_slots", "serve-a", "r1", "16x8"),
        replica("aieng_kv_cache_slots", "serve-a", "r2", "16x8"),
        replica("aieng_kv_cache_slots", "serve-a", "r3", "16x4 stale"),
        replica("aieng_ready", "serve-a", "r1", "1x8"),
        replica("aieng_ready", "serve-a", "r2", "1x8"),
        replica("aieng_ready", "serve-a", "r3", "1x4 stale"),
        replica("aieng_ready", "serve-b", "r4", "0x8"),
    ]

    def expect(expr: str, at: str, *samples: tuple[dict[str, str], float]) -> dict[str, Any]:
        name = expr if expr in RECORDED else ""  # a bare series keeps its name; an expression's result has none
        return {
            "expr": expr,
            "eval_time": at,
            "exp_samples": [
                {"labels": name + "{" + ", ".join(f'{k}="{v}"' for k, v in lb.items()) + "}", "value": value}
                for lb, value in samples
            ],
        }

    checks = [
        expect(QUEUE, "1m", (a, 9), (b, 0)),
        expect(QUEUE, "2m", (a, 12), (b, 0)),  # r2's queue grew to 9; r3 is gone
        expect(f'{QUEUE}{{deployment="serve-a"}} / deployment:aieng_ready:sum{{deployment="serve-a"}}', "2m", (a, 6)),
        expect("deployment:aieng_num_requests_waiting:avg", "1m", (a, 3), (b, 0)),
        expect("deployment:aieng_num_requests_waiting:avg", "2m", (a, 6), (b, 0)),
        expect("deployment:aieng_num_requests_running:sum", "1m", (a, 34)),
        expect("deployment:aieng_num_requests_running:sum", "2m", (a, 32)),
        expect("deployment:aieng_kv_cache_free_slots:sum", "1m", (a, 14), (b, 16)),
        expect("deployment:aieng_kv_cache_free_slots:sum", "2m", (a, 0), (b, 16)),
        expect("deployment:aieng_kv_cache_slots:sum", "1m", (a, 48)),
        expect("deployment:aieng_kv_cache_slots:sum", "2m", (a, 32)),
        expect("deployment:aieng_ready:sum", "1m", (a, 3), (b, 0)),
        expect("deployment:aieng_ready:sum", "2m", (a, 2), (b, 0)),
    ]
    test_path = tmp_path / "recording-rules-test.yml"
    document = {
        "rule_files": [str(RULES_FILE)],
        "evaluation_interval": "15s",
        "tests": [{"interval": "15s", "input_series": series, "promql_expr_test": checks}],
    }
    test_path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    result = subprocess.run(
        [promtool, "test", "rules", str(test_path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout, result.stdout


def test_prometheus_records_a_real_servers_signals(tmp_path: Path, serving_bundle_artifact) -> None:
    """A real Prometheus with the recording rules loaded, scraping a real idle server labelled
    deployment=aieng-serve: the recorded series are the server's own gauges."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIENG_")}
    env.update(AIENG_HOME=str(tmp_path / "home"), AIENG_CONFIG=str(TINY_CONFIG))
    bundle = serving_bundle_artifact.bundle
    labels = {"namespace": "aieng", "deployment": "aieng-serve"}
    slots = float(serving_bundle_artifact.config.bundle.max_batch)
    expected = {
        QUEUE: 0.0,
        "deployment:aieng_num_requests_waiting:avg": 0.0,
        "deployment:aieng_num_requests_running:sum": 0.0,
        "deployment:aieng_kv_cache_free_slots:sum": slots,
        "deployment:aieng_kv_cache_slots:sum": slots,
        "deployment:aieng_ready:sum": 1.0,
    }
    with ServerProcess(bundle.path, tmp_path / "server.log", env) as server:
        with running_prometheus(tmp_path, server.port, RULES_FILE, labels) as port:
            key = tuple(sorted(labels.items()))

            def recorded() -> dict[str, float] | None:
                values = {name: query(port, name) for name in expected}
                if any(list(v) != [key] for v in values.values()):
                    return None  # not every rule evaluated after a scrape yet
                return {name: v[key] for name, v in values.items()}

            assert poll(recorded, READBACK_S, "every recording rule to be evaluated") == expected


def scaled_object() -> dict[str, Any]:
    return yaml.safe_load(SCALED_OBJECT_FILE.read_text(encoding="utf-8"))


def test_the_scaled_object_scales_on_the_recorded_queue_length() -> None:
    document = scaled_object()
    assert (document["apiVersion"], document["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    spec = document["spec"]
    (trigger,) = spec["triggers"]
    assert (trigger["type"], trigger["metricType"]) == ("prometheus", "AverageValue")
    metadata = trigger["metadata"]
    # The query reads the recorded series for this ScaledObject's own namespace and Deployment.
    match = re.fullmatch(r'sum\((\S+)\{namespace="([^"]+)", deployment="([^"]+)"\}\)', metadata["query"])
    assert match, metadata["query"]
    assert match.group(1) == QUEUE and QUEUE in recording_rules()
    assert match.group(2) == document["metadata"]["namespace"]
    assert match.group(3) == spec["scaleTargetRef"]["name"]
    # KEDA reads threshold as a string; 8 waiting per replica, far below the 429 limit.
    assert isinstance(metadata["threshold"], str) and float(metadata["threshold"]) == 8
    assert float(metadata["threshold"]) < 0.8 * 256  # AiengQueueNearlyFull at the default serving.max_waiting
    assert metadata["ignoreNullValues"] == "false"  # no data is an error, never a zero queue
    assert 2 <= spec["minReplicaCount"] < spec["maxReplicaCount"]


def test_the_scaled_object_scales_in_five_to_ten_times_slower_than_out() -> None:
    behavior = scaled_object()["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    up, down = behavior["scaleUp"], behavior["scaleDown"]
    assert up["stabilizationWindowSeconds"] == 0  # out on the first reading over the target
    out_period = max(policy["periodSeconds"] for policy in up["policies"])
    # In: the window must pass with every recommendation lower, then one pod per period.
    assert [(p["type"], p["value"]) for p in down["policies"]] == [("Pods", 1)]
    cooldown = down["stabilizationWindowSeconds"]
    assert 5 <= cooldown / out_period <= 10, (cooldown, out_period)
    assert min(policy["periodSeconds"] for policy in down["policies"]) >= cooldown
    for direction in (up, down):
        for policy in direction["policies"]:
            assert policy["type"] in ("Pods", "Percent") and policy["value"] > 0
            assert 0 < policy["periodSeconds"] <= 1800  # the API's limit
