"""configs/alerts.yml reads only what `aieng serve` exposes: every metric name in an alert's
expression is a series of the server's registry, every label it matches on is a label of that
series, and every endpoint or reason it names is one the server uses. Renaming a metric, a label
or an endpoint breaks this test instead of silently blinding an alert.

The expressions are parsed here with a small PromQL tokenizer (selectors, grouping clauses,
functions, keywords); tests/e2e/test_prometheus.py has a real Prometheus load and evaluate them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from aieng_core.serving.http.deployment_watch import RollbackReadiness
from aieng_core.serving.http.metrics import ENDPOINTS, GENERATION_ENDPOINTS, REJECT_REASONS, ServingMetrics

REPO_ROOT = Path(__file__).resolve().parents[3]
ALERTS_FILE = REPO_ROOT / "configs" / "alerts.yml"
PIPELINE_CONFIG = REPO_ROOT / "configs" / "pipeline.yaml"
SEVERITIES = {"P0", "P1"}
# Series Prometheus itself writes for every target, and the labels it attaches to every sample.
PROMETHEUS_SERIES = {"up": set[str]()}
TARGET_LABELS = {"job", "instance"}
JOB = "aieng"

_STRING = r'"(?:[^"\\]|\\.)*"'
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SELECTOR = re.compile(rf"(?<![\w:])({_NAME})?\s*\{{((?:[^}}\"]|{_STRING})*)\}}")
_MATCHER = re.compile(rf"\s*({_NAME})\s*(=~|!~|!=|=)\s*({_STRING})\s*(?:,|$)")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_IDENTIFIER = re.compile(rf"(?<![\w:.]){_NAME}")
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str
    value: str


@dataclass(frozen=True)
class Selector:
    metric: str
    matchers: tuple[Matcher, ...]


def parse_selectors(expr: str) -> tuple[list[Selector], set[str]]:
    """The vector selectors of a PromQL expression (metric name and label matchers) and the
    labels of its grouping clauses (by, on, ...)."""
    selectors: list[Selector] = []

    def take_selector(match: re.Match[str]) -> str:
        name, body = match.group(1), match.group(2)
        if name is None:
            raise ValueError(f"a selector without a metric name in {expr!r}: name the series")
        matchers = []
        position = 0
        while position < len(body.strip()):
            found = _MATCHER.match(body.strip(), position)
            if found is None:
                raise ValueError(f"cannot read the label matchers {{{body}}} in {expr!r}")
            matchers.append(Matcher(found.group(1), found.group(2), yaml.safe_load(found.group(3))))
            position = found.end()
        selectors.append(Selector(name, tuple(matchers)))
        return " "

    rest = _SELECTOR.sub(take_selector, expr)
    rest = re.sub(_STRING, " ", rest)
    rest = re.sub(r"\[[^\]]*\]", " ", rest)  # range durations: [5m]
    grouping: set[str] = set()
    for clause in _GROUPING.finditer(rest):
        grouping |= {label.strip() for label in clause.group(2).split(",") if label.strip()}
    rest = _GROUPING.sub(" ", rest)
    for word in _IDENTIFIER.finditer(rest):
        is_function = rest[word.end() :].lstrip().startswith("(")
        if not is_function and word.group() not in KEYWORDS:
            selectors.append(Selector(word.group(), ()))
    return selectors, grouping


def exposed_series() -> dict[str, set[str]]:
    """Every sample name a server's /metrics can show, with its label names: a registry that has
    seen one of everything (a request, a rejection, a finish, a bundle, a followed pointer and
    its rollback check, the config file's validity), rendered and parsed."""
    metrics = ServingMetrics()
    metrics.count_http("/generate", 200)
    metrics.reject("overloaded")
    metrics.observe_finished("stop", 3, 0.1)
    metrics.set_bundle("bundle-1")
    metrics.set_deployment("production", "bundle-2", "bundle-1", mismatch=True)
    metrics.set_rollback("production", RollbackReadiness("production", "bundle-0", True, False, 0.0, None), now=60.0)
    metrics.set_config("/etc/aieng/pipeline.yaml", valid=True)
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


def known_values() -> dict[str, set[str]]:
    """The values a label can take, where the server has a fixed set of them."""
    return {"endpoint": {*ENDPOINTS, "other"}, "reason": set(REJECT_REASONS), "job": {JOB}}


def problems(expr: str, exposed: dict[str, set[str]]) -> list[str]:
    """What in `expr` the server does not expose: unknown series, labels or label values."""
    found = []
    selectors, grouping = parse_selectors(expr)
    if not selectors:
        found.append("reads no series")
    series = {**PROMETHEUS_SERIES, **exposed}
    values = known_values()
    for selector in selectors:
        if selector.metric not in series:
            found.append(f"{selector.metric} is not a series of aieng serve's /metrics")
            continue
        labels = series[selector.metric] | TARGET_LABELS
        for matcher in selector.matchers:
            if matcher.label not in labels:
                found.append(f"{selector.metric} has no label {matcher.label} (it has {sorted(labels)})")
            elif matcher.label in values:
                given = matcher.value.split("|") if matcher.op in ("=~", "!~") else [matcher.value]
                unknown = sorted(set(given) - values[matcher.label])
                if unknown:
                    found.append(f"{selector.metric}{{{matcher.label}}} never takes the value(s) {unknown}")
    every_label = set().union(*series.values()) | TARGET_LABELS | {"le"}
    unknown_grouping = sorted(grouping - every_label)
    if unknown_grouping:
        found.append(f"groups by {unknown_grouping}, which no series carries")
    return found


def load_rules() -> list[tuple[str, dict[str, Any]]]:
    """(group name, rule) for every rule of configs/alerts.yml."""
    document = yaml.safe_load(ALERTS_FILE.read_text(encoding="utf-8"))
    return [(group["name"], rule) for group in document["groups"] for rule in group["rules"]]


RULES = load_rules()


@pytest.fixture(scope="module")
def exposed() -> dict[str, set[str]]:
    return exposed_series()


@pytest.mark.parametrize(("group", "rule"), RULES, ids=[rule["alert"] for _, rule in RULES])
def test_every_series_an_alert_reads_is_exposed(group: str, rule: dict[str, Any], exposed: dict) -> None:
    assert problems(rule["expr"], exposed) == [], f"{group}/{rule['alert']}: {rule['expr']}"


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        ('rate(aieng_http_request_total{status=~"5.."}[5m]) > 0', "aieng_http_request_total is not a series"),
        ("aieng_num_requests_queued > 0", "aieng_num_requests_queued is not a series"),
        ('aieng_requests_rejected_total{cause="overloaded"} > 0', "has no label cause"),
        ('aieng_requests_rejected_total{reason="full"} > 0', "never takes the value(s) ['full']"),
        ('aieng_http_requests_total{endpoint=~"/generate|/chat"} > 0', "never takes the value(s) ['/chat']"),
        ('up{job="vllm"} == 0', "never takes the value(s) ['vllm']"),
        ("sum by (model) (rate(aieng_generation_tokens_total[1m])) == 0", "groups by ['model']"),
        ("histogram_quantile(0.99, rate(aieng_time_to_first_token_seconds[5m])) > 1", "is not a series"),
    ],
)
def test_a_wrong_name_label_or_value_is_caught(expr: str, problem: str, exposed: dict) -> None:
    (found,) = problems(expr, exposed)
    assert problem in found


def test_the_parser_separates_series_from_functions_keywords_and_labels() -> None:
    selectors, grouping = parse_selectors(
        'sum by (job, instance) (rate(aieng_http_requests_total{endpoint=~"/generate|/predict", status=~"5.."}[2m]))'
        " / on (job) group_left sum(rate(aieng_http_requests_total[2m])) > 0.1e1"
        ' and bool absent(up{job="aieng"}) unless aieng_ready offset 5m'
    )
    assert [s.metric for s in selectors] == [
        "aieng_http_requests_total",
        "up",
        "aieng_http_requests_total",
        "aieng_ready",
    ]
    assert selectors[0].matchers == (Matcher("endpoint", "=~", "/generate|/predict"), Matcher("status", "=~", "5.."))
    assert selectors[1].matchers == (Matcher("job", "=", "aieng"),)
    assert grouping == {"job", "instance"}
    with pytest.raises(ValueError, match="without a metric name"):
        parse_selectors('{__name__="aieng_ready"} == 0')


def test_error_ratios_cover_exactly_the_generation_endpoints() -> None:
    """Adding a generation endpoint to the server must add it to the alerts' error ratios."""
    wanted = set(GENERATION_ENDPOINTS)
    ratios = [rule for _, rule in RULES if "aieng_http_requests_total" in rule["expr"]]
    assert len(ratios) == 3  # two 5xx ratios and the 429 ratio
    for rule in ratios:
        selectors, _ = parse_selectors(rule["expr"])
        for selector in selectors:
            if selector.metric == "aieng_http_requests_total":
                (endpoint,) = [m for m in selector.matchers if m.label == "endpoint"]
                assert endpoint.op == "=~" and set(endpoint.value.split("|")) == wanted, rule["alert"]


def test_latency_thresholds_are_the_gate_slos() -> None:
    gate = yaml.safe_load(PIPELINE_CONFIG.read_text(encoding="utf-8"))["gate"]
    by_name = {rule["alert"]: rule for _, rule in RULES}
    for alert, series, slo_ms in [
        ("AiengTimeToFirstTokenP99AboveSLO", "aieng_time_to_first_token_seconds_bucket", gate["slo_ttft_p99_ms"]),
        ("AiengEndToEndLatencyP99AboveSLO", "aieng_e2e_request_latency_seconds_bucket", gate["slo_e2el_p99_ms"]),
    ]:
        expr = " ".join(by_name[alert]["expr"].split())
        assert expr.startswith("histogram_quantile(0.99, ") and series in expr
        threshold = float(re.fullmatch(r".*\)\s*>\s*([0-9.]+)", expr).group(1))  # type: ignore[union-attr]
        assert threshold == slo_ms / 1000, f"{alert}: {threshold} s, but the gate's SLO is {slo_ms} ms"
        assert f"(SLO {slo_ms / 1000:g} s)" in by_name[alert]["annotations"]["summary"]


def test_every_rule_is_an_alert_an_operator_can_act_on() -> None:
    names = [rule["alert"] for _, rule in RULES]
    assert len(names) == len(set(names)), "alert names must be unique"
    assert len(names) == 15
    for group, rule in RULES:
        where = f"{group}/{rule.get('alert')}"
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, where
        assert re.fullmatch(r"Aieng[A-Z][A-Za-z0-9]+", rule["alert"]), where
        assert re.fullmatch(r"[1-9][0-9]*[sm]", rule["for"]), f"{where}: for: {rule['for']}"
        assert rule["labels"] == {"severity": rule["labels"]["severity"]} and rule["labels"]["severity"] in SEVERITIES
        assert set(rule["annotations"]) == {"summary", "description"}, where
        assert rule["annotations"]["description"].startswith("Check first: "), where
        assert "\n" not in rule["annotations"]["summary"] + rule["annotations"]["description"], where


def test_the_deployment_series_are_exported_as_the_rules_read_them() -> None:
    """Mismatch: one series per pointer, 1 or 0; readiness: no ready series when stale, before
    a check (stale 1) or with nothing to roll back to; a damaged check file is a 0 for an
    unknown target."""
    metrics = ServingMetrics()

    def samples() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(metrics.render().decode())
            for sample in family.samples
            if sample.name.startswith(("aieng_deployment", "aieng_rollback"))
        }

    assert samples() == {}  # a server serving a bundle path: none of them
    metrics.set_deployment("production", "b2", "b1", mismatch=True)
    metrics.set_rollback("production", None, now=100.0)
    mismatch = (("pointer", "production"), ("pointer_bundle", "b2"), ("served_bundle", "b1"))
    assert samples() == {("aieng_deployment_mismatch", mismatch): 1.0}
    metrics.set_deployment("production", "b2", "b2", mismatch=False)
    # Stale: no ready series (its label would name a target that may no longer be the one).
    metrics.set_rollback("production", RollbackReadiness("production", "b1", None, True, 40.0, "stale"), now=100.0)
    pointer = (("pointer", "production"),)
    assert samples() == {
        (
            "aieng_deployment_mismatch",
            (("pointer", "production"), ("pointer_bundle", "b2"), ("served_bundle", "b2")),
        ): 0,
        ("aieng_rollback_check_stale", pointer): 1.0,
        ("aieng_rollback_check_age_seconds", pointer): 60.0,
    }
    never_checked = RollbackReadiness("production", None, None, True, None, "no rollback readiness check has run yet")
    metrics.set_rollback("production", never_checked, now=100.0)
    assert {k: v for k, v in samples().items() if k[0].startswith("aieng_rollback")} == {
        ("aieng_rollback_check_stale", pointer): 1.0
    }
    failed = RollbackReadiness("production", "b1", False, False, 40.0, "sha256 does not match")
    metrics.set_rollback("production", failed, now=100.0)
    assert samples()[("aieng_rollback_target_ready", (("bundle_id", "b1"), *pointer))] == 0.0
    nothing_to_roll_back_to = RollbackReadiness("production", None, None, False, 90.0, None)
    metrics.set_rollback("production", nothing_to_roll_back_to, now=100.0)
    assert {name for name, _ in samples()} == {
        "aieng_deployment_mismatch",
        "aieng_rollback_check_stale",
        "aieng_rollback_check_age_seconds",
    }
    damaged = RollbackReadiness("production", "unknown", False, False, None, "rollback-check.json: not valid JSON")
    metrics.set_rollback("production", damaged, now=100.0)
    assert {key: value for key, value in samples().items() if key[0].startswith("aieng_rollback")} == {
        ("aieng_rollback_target_ready", (("bundle_id", "unknown"), *pointer)): 0.0,
        ("aieng_rollback_check_stale", pointer): 0.0,
    }
