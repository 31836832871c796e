"""A real Prometheus (Debian's `prometheus` package) scrapes a real `aieng serve`, with the
alert rules of configs/alerts.yml loaded: the series it stores read back through its HTTP API
equal what the server counted, every rule loads and evaluates without error, a healthy server
fires nothing, and a killed one makes AiengDown go pending. A server following a pointer that
names a damaged bundle exports the mismatch, which Prometheus reads with both bundles named,
and its rollback readiness check's result.

promtool checks the rules file and runs unit tests of every alert on synthetic series: when
each one fires, for which instance, and after how long (its `for:`).

Prometheus runs in its own process group, killed as a group whatever happens; the server is
killed by the test or, should the test fail first, stopped by SIGTERM (then killed). Every wait
is a poll with a deadline.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import signal
import subprocess
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from aieng_core.config import load_config
from aieng_core.deploy.deployments import Deployments
from aieng_core.loadgen.http_client import request
from aieng_core.loadgen.server_process import ServerProcess, free_port
from aieng_core.store.pointers import PRODUCTION
from aieng_core.store.rollback_check import write_check
from tests.conftest import TINY_CONFIG
from tests.e2e.serve_helpers import flip_one_byte, home_with_both_bundles, poll

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
ALERTS_FILE = REPO_ROOT / "configs" / "alerts.yml"
JOB = "aieng"
GENERATE_REQUESTS = 7
MAX_NEW_TOKENS = 4
PROMETHEUS_READY_S = 30
READBACK_S = 20
STOP_S = 10


def system_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: install the Debian package `prometheus` (make system-deps)")
    return path


def alert_rules() -> dict[str, list[dict[str, Any]]]:
    """Group name -> its rules, as configs/alerts.yml says."""
    document = yaml.safe_load(ALERTS_FILE.read_text(encoding="utf-8"))
    return {group["name"]: group["rules"] for group in document["groups"]}


def http_get(port: int, path: str, params: dict[str, str] | None = None) -> tuple[int, bytes]:
    """A GET to 127.0.0.1:`port` (Prometheus or the server): its status and body, whatever the status."""
    reply = request(port, "GET", f"{path}?{urllib.parse.urlencode(params)}" if params else path, timeout=5)
    return reply.status, reply.body


# ---- promtool ---------------------------------------------------------------------------------------


def test_promtool_accepts_the_rules() -> None:
    promtool = system_binary("promtool")
    result = subprocess.run(
        [promtool, "check", "rules", str(ALERTS_FILE)], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    count = sum(len(rules) for rules in alert_rules().values())
    assert f"SUCCESS: {count} rules found" in result.stdout, result.stdout


@dataclass(frozen=True)
class AlertCase:
    """Input series (one sample per 15 s, promtool's notation) on which `alert` is still quiet
    at `quiet_at` (its `for:` not over yet) and fires at `firing_at` with `firing`'s labels
    (besides severity), while the alerts in `also_quiet` stay quiet. Instance a:1 is sick, b:1
    healthy."""

    alert: str
    series: list[dict[str, str]]
    quiet_at: str
    firing_at: str
    firing: list[dict[str, str]]
    also_quiet: list[str] = field(default_factory=list)


def _series(name: str, instance: str, values: str, **labels: str) -> dict[str, str]:
    label_text = ",".join(f'{k}="{v}"' for k, v in {"job": JOB, "instance": instance, **labels}.items())
    return {"series": f"{name}{{{label_text}}}", "values": values}


def _buckets(name: str, instance: str, slow_from: float, bounds: list[str]) -> list[dict[str, str]]:
    """A histogram whose 10 observations per 15 s all land in the first bucket above `slow_from`."""
    return [
        _series(f"{name}_bucket", instance, "0+10x60" if le == "+Inf" or float(le) > slow_from else "0x60", le=le)
        for le in bounds
    ]


GENERATE, HEALTH = {"endpoint": "/generate"}, {"endpoint": "/health/ready"}
A = {"job": JOB, "instance": "a:1"}
MISMATCH = {"pointer": "production", "pointer_bundle": "b2", "served_bundle": "b1"}
AGREE = {"pointer": "production", "pointer_bundle": "b1", "served_bundle": "b1"}
ALERT_CASES = [
    AlertCase(
        "AiengDown",  # a: down from 45 s on
        [_series("up", "a:1", "1 1 1 0x20"), _series("up", "b:1", "1x23")],
        quiet_at="1m30s",
        firing_at="2m",
        firing=[A],
    ),
    AlertCase("AiengTargetMissing", [_series("aieng_ready", "a:1", "1x40")], "4m", "6m", [{"job": JOB}]),
    AlertCase(
        "AiengNotReady",
        [_series("aieng_ready", "a:1", "1 0x40"), _series("aieng_ready", "b:1", "1x41")],
        quiet_at="4m",
        firing_at="6m",
        firing=[A],
    ),
    AlertCase(
        "AiengHighErrorRate",  # a: 25 % of generation requests fail; b: none do, only its readiness probe says 503
        [
            _series("aieng_http_requests_total", "a:1", "0+30x40", status="200", **GENERATE),
            _series("aieng_http_requests_total", "a:1", "0+10x40", status="503", **GENERATE),
            _series("aieng_http_requests_total", "b:1", "0+30x40", status="200", **GENERATE),
            _series("aieng_http_requests_total", "b:1", "0+90x40", status="503", **HEALTH),
        ],
        quiet_at="45s",
        firing_at="4m",
        firing=[A],
    ),
    AlertCase(
        "AiengElevatedErrorRate",  # a: 1 in 41 fail (2.4 %: not a P0); b: 1 in 201 (0.5 %)
        [
            _series("aieng_http_requests_total", "a:1", "0+40x80", status="200", **GENERATE),
            _series("aieng_http_requests_total", "a:1", "0+1x80", status="504", **GENERATE),
            _series("aieng_http_requests_total", "b:1", "0+200x80", status="200", **GENERATE),
            _series("aieng_http_requests_total", "b:1", "0+1x80", status="500", **GENERATE),
        ],
        quiet_at="9m",
        firing_at="16m",
        firing=[A],
        also_quiet=["AiengHighErrorRate"],
    ),
    AlertCase(
        "AiengOverloaded",  # a: 6 of 30 get 429 (not an error: no 5xx alert); b: none
        [
            _series("aieng_http_requests_total", "a:1", "0+24x60", status="200", **GENERATE),
            _series("aieng_http_requests_total", "a:1", "0+6x60", status="429", **GENERATE),
            _series("aieng_requests_rejected_total", "a:1", "0+6x60", reason="overloaded"),
            _series("aieng_http_requests_total", "b:1", "0+30x60", status="200", **GENERATE),
            _series("aieng_requests_rejected_total", "b:1", "0x60", reason="overloaded"),
        ],
        quiet_at="4m",
        firing_at="11m",
        firing=[A],
        also_quiet=["AiengHighErrorRate", "AiengElevatedErrorRate"],
    ),
    AlertCase(
        "AiengTimeToFirstTokenP99AboveSLO",  # a: first tokens in 2.5-5 s; b: within 0.5 s
        _buckets("aieng_time_to_first_token_seconds", "a:1", 2.5, ["0.5", "1", "2.5", "5", "+Inf"])
        + _buckets("aieng_time_to_first_token_seconds", "b:1", 0.25, ["0.5", "1", "2.5", "5", "+Inf"]),
        quiet_at="4m",
        firing_at="11m",
        firing=[A],
    ),
    AlertCase(
        "AiengEndToEndLatencyP99AboveSLO",  # a: answers in 10-20 s; b: in 5-7.5 s
        _buckets("aieng_e2e_request_latency_seconds", "a:1", 10, ["5", "7.5", "10", "20", "+Inf"])
        + _buckets("aieng_e2e_request_latency_seconds", "b:1", 5, ["5", "7.5", "10", "20", "+Inf"]),
        quiet_at="4m",
        firing_at="11m",
        firing=[A],
    ),
    AlertCase(
        "AiengQueueNearlyFull",  # a: 30 of 32 waiting; b: 16 of 32
        [
            _series("aieng_num_requests_waiting", "a:1", "30x20"),
            _series("aieng_max_num_requests_waiting", "a:1", "32x20"),
            _series("aieng_num_requests_waiting", "b:1", "16x20"),
            _series("aieng_max_num_requests_waiting", "b:1", "32x20"),
        ],
        quiet_at="1m",
        firing_at="3m",
        firing=[A],
    ),
    AlertCase(
        "AiengKVCacheExhausted",  # a: no slot free and 3 waiting; b: no slot free, nobody waiting
        [
            _series("aieng_kv_cache_free_slots", "a:1", "0x40"),
            _series("aieng_num_requests_waiting", "a:1", "3x40"),
            _series("aieng_kv_cache_free_slots", "b:1", "0x40"),
            _series("aieng_num_requests_waiting", "b:1", "0x40"),
        ],
        quiet_at="4m",
        firing_at="6m",
        firing=[A],
    ),
    AlertCase(
        "AiengEngineStalled",  # a: 2 running, the token counter flat; b: 2 running, 50 tokens per 15 s
        [
            _series("aieng_num_requests_running", "a:1", "2x40"),
            _series("aieng_num_requests_waiting", "a:1", "0x40"),
            _series("aieng_generation_tokens_total", "a:1", "100x40"),
            _series("aieng_num_requests_running", "b:1", "2x40"),
            _series("aieng_num_requests_waiting", "b:1", "0x40"),
            _series("aieng_generation_tokens_total", "b:1", "0+50x40"),
        ],
        quiet_at="1m30s",
        firing_at="3m",
        firing=[A],
    ),
    AlertCase(
        "AiengDeploymentMismatch",  # a: the pointer names b2, which it refused, and it serves b1; b: agree
        [
            _series("aieng_deployment_mismatch", "a:1", "1x20", **MISMATCH),
            _series("aieng_deployment_mismatch", "b:1", "0x20", **AGREE),
        ],
        quiet_at="45s",
        firing_at="1m30s",
        firing=[{**A, **MISMATCH}],
    ),
    AlertCase(
        "AiengRollbackTargetNotReady",  # a: its check failed; b: not ready only because stale (the overdue alert's)
        [
            _series("aieng_rollback_target_ready", "a:1", "0x40", pointer="production", bundle_id="b0"),
            _series("aieng_rollback_check_stale", "a:1", "0x40", pointer="production"),
            _series("aieng_rollback_target_ready", "b:1", "0x40", pointer="production", bundle_id="b0"),
            _series("aieng_rollback_check_stale", "b:1", "1x40", pointer="production"),
        ],
        quiet_at="4m",
        firing_at="6m",
        firing=[{**A, "pointer": "production", "bundle_id": "b0"}],
    ),
    AlertCase(
        "AiengRollbackCheckOverdue",  # a: last checked 2 h ago and counting; c: stale since the pointer moved; b: fresh
        [
            _series("aieng_rollback_check_age_seconds", "a:1", "1900+15x420", pointer="production"),
            _series("aieng_rollback_check_stale", "a:1", "0x420", pointer="production"),
            _series("aieng_rollback_check_age_seconds", "c:1", "60x420", pointer="production"),
            _series("aieng_rollback_check_stale", "c:1", "1x420", pointer="production"),
            _series("aieng_rollback_check_age_seconds", "b:1", "60x420", pointer="production"),
            _series("aieng_rollback_check_stale", "b:1", "0x420", pointer="production"),
        ],
        quiet_at="80m",
        firing_at="100m",
        firing=[{**A, "pointer": "production"}, {"job": JOB, "instance": "c:1", "pointer": "production"}],
    ),
    AlertCase(
        "AiengConfigInvalid",  # a: its config file stopped loading 30 s in; b: its file loads
        [
            _series("aieng_config_valid", "a:1", "1 1 0x20", path="/etc/aieng/pipeline.yaml"),
            _series("aieng_config_valid", "b:1", "1x22", path="/etc/aieng/pipeline.yaml"),
        ],
        quiet_at="2m",
        firing_at="3m",
        firing=[{**A, "path": "/etc/aieng/pipeline.yaml"}],
    ),
]


def test_promtool_unit_tests_of_every_alert(tmp_path: Path) -> None:
    """Each alert fires for the sick instance only, and only once its `for:` is over.

    promtool compares annotations too, and those are prose: the rules are copied without them
    (expressions, `for:` and labels unchanged); test_alert_rules.py checks the annotations."""
    promtool = system_binary("promtool")
    groups = alert_rules()
    rules = {rule["alert"]: rule for group in groups.values() for rule in group}
    assert sorted(case.alert for case in ALERT_CASES) == sorted(rules), "one case per alert"
    stripped = {
        "groups": [
            {"name": name, "rules": [{k: v for k, v in rule.items() if k != "annotations"} for rule in group]}
            for name, group in groups.items()
        ]
    }
    rules_path = tmp_path / "alerts-without-annotations.yml"
    rules_path.write_text(yaml.safe_dump(stripped, sort_keys=False), encoding="utf-8")
    tests = []
    for case in ALERT_CASES:
        severity = rules[case.alert]["labels"]["severity"]
        firing = [{"exp_labels": {"severity": severity, **labels}} for labels in case.firing]
        checks = [
            {"eval_time": case.quiet_at, "alertname": case.alert, "exp_alerts": []},
            {"eval_time": case.firing_at, "alertname": case.alert, "exp_alerts": firing},
            *({"eval_time": case.firing_at, "alertname": other, "exp_alerts": []} for other in case.also_quiet),
        ]
        tests.append({"interval": "15s", "input_series": case.series, "alert_rule_test": checks})
    test_path = tmp_path / "alerts-test.yml"
    document = {"rule_files": [str(rules_path)], "evaluation_interval": "15s", "tests": tests}
    test_path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    result = subprocess.run(
        [promtool, "test", "rules", str(test_path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout, result.stdout


# ---- a real Prometheus scraping a real server ---------------------------------------------------------


@contextmanager
def running_prometheus(
    folder: Path, target_port: int, rule_file: Path = ALERTS_FILE, target_labels: dict[str, str] | None = None
) -> Iterator[int]:
    """Prometheus scraping 127.0.0.1:target_port every second (the target labelled with
    `target_labels`) with `rule_file` loaded (configs/alerts.yml unless told); yields its port
    once /-/ready answers 200, and kills its process group on the way out."""
    binary = system_binary("prometheus")
    targets: dict[str, Any] = {"targets": [f"127.0.0.1:{target_port}"]}
    if target_labels:
        targets["labels"] = target_labels
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rule_file)],
        "scrape_configs": [{"job_name": JOB, "static_configs": [targets]}],
    }
    config_path = folder / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    port = free_port()
    log_path = folder / "prometheus.log"
    command = [
        binary,
        f"--config.file={config_path}",
        f"--storage.tsdb.path={folder / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def log_tail() -> str:
        return log_path.read_text(encoding="utf-8", errors="replace")[-4000:]

    def ready() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"prometheus exited with {process.returncode}:\n{log_tail()}")
        try:
            return http_get(port, "/-/ready")[0] == 200
        except OSError:
            return False

    try:
        poll(ready, PROMETHEUS_READY_S, "prometheus to be ready")
        yield port
    except BaseException:
        print(f"prometheus log:\n{log_tail()}")
        raise
    finally:
        with_group(process, signal.SIGTERM)
        try:
            process.wait(STOP_S)
        except subprocess.TimeoutExpired:
            with_group(process, signal.SIGKILL)
            process.wait(STOP_S)


def with_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass  # the group is gone already


def api(port: int, path: str, **params: str) -> Any:
    status, body = http_get(port, path, params or None)
    reply = json.loads(body)
    assert status == 200 and reply["status"] == "success", f"{path} {params}: {status} {body[:500]!r}"
    return reply["data"]


def query(port: int, promql: str) -> dict[tuple[tuple[str, str], ...], float]:
    """An instant query: labels (sorted, without __name__) -> value."""
    data = api(port, "/api/v1/query", query=promql)
    assert data["resultType"] == "vector", data
    return {
        tuple(sorted((k, v) for k, v in item["metric"].items() if k != "__name__")): float(item["value"][1])
        for item in data["result"]
    }


def server_counts(server: ServerProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, body = http_get(server.port, "/metrics")
    assert status == 200
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


def generate(port: int, n: int) -> None:
    body = {"prompt": f"The data pipeline {n}", "max_new_tokens": MAX_NEW_TOKENS, "temperature": 0}
    reply = request(port, "POST", "/generate", body, timeout=60)
    assert reply.status == 200, reply.body
    assert reply.json["tokens"] >= 1


def test_prometheus_scrapes_serve_and_evaluates_the_alert_rules(tmp_path: Path, serving_bundle_artifact) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIENG_")}
    env.update(AIENG_HOME=str(tmp_path / "home"), AIENG_CONFIG=str(TINY_CONFIG))
    bundle = serving_bundle_artifact.bundle
    with ServerProcess(bundle.path, tmp_path / "server.log", env) as server:
        target = f"127.0.0.1:{server.port}"
        answered = ("bundle_id", bundle.id)  # every request series names the bundle that answered
        generate_labels = (
            answered, ("endpoint", "/generate"), ("instance", target), ("job", JOB), ("status", "200")
        )  # fmt: skip
        with running_prometheus(tmp_path, server.port) as port:
            for n in range(GENERATE_REQUESTS):
                generate(server.port, n)
            counted = server_counts(server)
            assert (
                counted[("aieng_http_requests_total", (answered, ("endpoint", "/generate"), ("status", "200")))]
                == GENERATE_REQUESTS
            )
            assert counted[("aieng_e2e_request_latency_seconds_count", (answered,))] == GENERATE_REQUESTS

            # The counter read back through Prometheus is the server's own count, no more, no less.
            generate_series = f'aieng_http_requests_total{{job="{JOB}", endpoint="/generate"}}'
            expected = {generate_labels: float(GENERATE_REQUESTS)}
            poll(lambda: query(port, generate_series) == expected, READBACK_S, f"{generate_series} == {expected}")
            target_labels = (("instance", target), ("job", JOB))
            assert query(port, f'up{{job="{JOB}"}}') == {target_labels: 1.0}
            assert query(port, "aieng_e2e_request_latency_seconds_count") == {
                (answered, *target_labels): GENERATE_REQUESTS
            }
            assert query(port, "aieng_ready") == {target_labels: 1.0}
            assert query(port, "aieng_config_valid") == {
                (("instance", target), ("job", JOB), ("path", str(TINY_CONFIG))): 1.0
            }
            max_waiting = load_config(TINY_CONFIG).serving.max_waiting
            assert query(port, "aieng_max_num_requests_waiting") == {target_labels: max_waiting}
            assert query(port, f'aieng_bundle_info{{bundle_id="{bundle.id}"}}') == {
                (("bundle_id", bundle.id), *target_labels): 1.0
            }

            (active,) = api(port, "/api/v1/targets")["activeTargets"]
            assert active["labels"] == {"instance": target, "job": JOB}
            assert active["scrapeUrl"] == f"http://{target}/metrics"
            assert active["health"] == "up" and active["lastError"] == ""

            # Every group and rule of configs/alerts.yml is loaded, evaluated, and healthy.
            wanted = {name: [rule["alert"] for rule in rules] for name, rules in alert_rules().items()}

            def loaded_rules() -> dict[str, list[dict[str, Any]]]:
                groups = api(port, "/api/v1/rules")["groups"]
                return {group["name"]: group["rules"] for group in groups}

            def all_evaluated() -> bool:
                return all(rule["health"] != "unknown" for rules in loaded_rules().values() for rule in rules)

            poll(all_evaluated, READBACK_S, "every rule to be evaluated once")
            loaded = loaded_rules()
            assert {name: [rule["name"] for rule in rules] for name, rules in loaded.items()} == wanted
            for rules in loaded.values():
                for rule in rules:
                    assert rule["type"] == "alerting"
                    assert (rule["health"], rule.get("lastError", "")) == ("ok", ""), rule["name"]
                    assert re.fullmatch(r"\d{4}-\d\d-\d\dT.*", rule["lastEvaluation"]), rule

            # A healthy server fires nothing (AiengTargetMissing may be pending until the first scrape).
            poll(lambda: api(port, "/api/v1/alerts")["alerts"] == [], READBACK_S, "no alert on a healthy server")

            # Killed (a crash, not a drain: test_serve.py covers those), the server is down and
            # AiengDown goes pending for it (firing would take its `for:`, a minute).
            assert server.process is not None
            server.process.kill()
            server.process.wait(STOP_S)

            def down_alerts() -> list[dict[str, Any]]:
                alerts = api(port, "/api/v1/alerts")["alerts"]
                return [alert for alert in alerts if alert["labels"]["alertname"] == "AiengDown"]

            (down,) = poll(down_alerts, READBACK_S, "AiengDown to go pending")
            assert down["state"] == "pending"
            assert down["labels"] == {"alertname": "AiengDown", "instance": target, "job": JOB, "severity": "P0"}
            assert down["annotations"]["summary"] == f"aieng serve on {target} cannot be scraped"
            assert query(port, f'up{{job="{JOB}"}}') == {target_labels: 0.0}


def test_prometheus_reads_the_deployment_mismatch_and_the_rollback_readiness(
    tmp_path: Path, serving_bundle_artifact, second_bundle
) -> None:
    """A server following the production pointer, whose pointer then names a bundle damaged
    since it was built (one byte of its weights changed; the pointer written without
    verification, as a rollback to it would): it refuses that bundle and keeps serving, still
    ready, and Prometheus reads the mismatch naming both bundles, with its alert pending. The
    rollback readiness check's result file is read on the server's poll and reaches Prometheus."""
    first_id, second_id = serving_bundle_artifact.bundle.id, second_bundle.id
    home = home_with_both_bundles(second_bundle, tmp_path / "home")
    deployments = Deployments(home)
    deployments.promote(first_id, reason="first")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIENG_")}
    env.update(AIENG_HOME=str(home), AIENG_CONFIG=str(TINY_CONFIG))
    with ServerProcess(None, tmp_path / "server.log", env, pointer=PRODUCTION) as server:
        target = f"127.0.0.1:{server.port}"
        target_labels = (("instance", target), ("job", JOB))

        def series(**labels: str) -> tuple[tuple[str, str], ...]:
            """A series' labels as query() gives them: sorted, the target's included."""
            return tuple(sorted({"instance": target, "job": JOB, **labels}.items()))

        def ready() -> dict[str, Any] | None:
            status, body = http_get(server.port, "/health/ready")
            return json.loads(body) if status == 200 else None

        poll(lambda: (ready() or {}).get("bundle_id") == first_id, READBACK_S * 3, f"the server to serve {first_id}")
        with running_prometheus(tmp_path, server.port) as port:
            agree = series(pointer=PRODUCTION, pointer_bundle=first_id, served_bundle=first_id)
            poll(
                lambda: query(port, "aieng_deployment_mismatch") == {agree: 0.0},
                READBACK_S,
                "the mismatch gauge at 0 while the pointer and the server agree",
            )
            assert query(port, "aieng_rollback_target_ready") == {}  # no check has run yet:
            assert query(port, "aieng_rollback_check_stale") == {series(pointer=PRODUCTION): 1.0}  # overdue

            flip_one_byte(home / "artifacts" / "serving_bundle" / second_id / "model.safetensors")
            deployments.promote(second_id, reason="damaged since it was built", verify=False)
            refused = poll(lambda: (r := ready()) and r["deployment"]["mismatch"] and r, READBACK_S * 3, "a refusal")
            assert refused["bundle_id"] == first_id  # still serving, still ready
            assert refused["deployment"]["bundle_id"] == second_id and refused["deployment"]["refused"] is True
            mismatch = refused["deployment"]["mismatch"]
            assert (mismatch["pointer_bundle"], mismatch["served_bundle"]) == (second_id, first_id)
            assert "model.safetensors: sha256 does not match the manifest" in mismatch["reason"]

            labels = {"pointer": PRODUCTION, "pointer_bundle": second_id, "served_bundle": first_id}
            expected = {series(**labels): 1.0}
            poll(lambda: query(port, "aieng_deployment_mismatch") == expected, READBACK_S, f"mismatch == {expected}")
            assert query(port, "aieng_ready") == {target_labels: 1.0}

            def pending(alertname: str) -> list[dict[str, Any]]:
                alerts = api(port, "/api/v1/alerts")["alerts"]
                return [alert for alert in alerts if alert["labels"]["alertname"] == alertname]

            (alert,) = poll(lambda: pending("AiengDeploymentMismatch"), READBACK_S, "AiengDeploymentMismatch pending")
            assert alert["state"] == "pending"
            assert alert["labels"] == {
                "alertname": "AiengDeploymentMismatch",
                **labels,
                **dict(target_labels),
                "severity": "P0",
            }
            assert alert["annotations"]["summary"] == (
                f"aieng serve on {target} serves {first_id}, not {second_id}, which the production pointer "
                "names: it refused that bundle"
            )

            # The rollback target (the first bundle: the top of the stack) checked and failed,
            # then checked and passed: each result reaches Prometheus from the server's poll.
            sequence = deployments.current()["sequence"]
            check = {
                "pointer": PRODUCTION,
                "checked_at": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
                "sequence": sequence,
                "bundle_id": first_id,
                "ok": False,
                "problems": ["model.safetensors: sha256 does not match the manifest"],
                "goldens_checked": 0,
                "seconds": 0.5,
            }
            write_check(home, check)
            ready_labels = series(bundle_id=first_id, pointer=PRODUCTION)
            poll(
                lambda: query(port, "aieng_rollback_target_ready") == {ready_labels: 0.0},
                READBACK_S,
                "aieng_rollback_target_ready == 0",
            )
            assert query(port, "aieng_rollback_check_stale") == {series(pointer=PRODUCTION): 0.0}
            (not_ready,) = poll(lambda: pending("AiengRollbackTargetNotReady"), READBACK_S, "the not-ready alert")
            assert not_ready["labels"]["bundle_id"] == first_id and not_ready["state"] == "pending"
            write_check(home, {**check, "ok": True, "problems": [], "goldens_checked": 3})
            poll(
                lambda: query(port, "aieng_rollback_target_ready") == {ready_labels: 1.0},
                READBACK_S,
                "aieng_rollback_target_ready == 1",
            )
