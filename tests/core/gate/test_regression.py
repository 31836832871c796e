"""The candidate's stress figures against the deployed bundle's gate figures."""

from __future__ import annotations

from typing import Any

import pytest

from aieng_core.config import load_config
from aieng_core.gate.regression import baseline_event, compare, load_sha256
from tests.conftest import TINY_CONFIG


def level(throughput: float, ttft_p99: float, e2el_p99: float) -> dict[str, Any]:
    return {"output_throughput": throughput, "ttft_ms": {"p99": ttft_p99}, "e2el_ms": {"p99": e2el_p99}}


def promoted(levels: dict[str, Any] | None, sequence: int = 3) -> dict[str, Any]:
    figures = {} if levels is None else {"stress": {"levels": levels}}
    return {"sequence": sequence, "action": "promote", "to": "A", "actor": "gate", "figures": figures}


def test_a_first_deployment_compares_nothing() -> None:
    result = compare({"concurrency=1": level(100, 10, 50)}, None, None, 0.1)
    assert result["compared"] is False and result["checks"] == [] and result["regressions"] == []
    assert result["note"] == "first deployment: nothing is deployed, so there is nothing to compare with"


def test_a_bundle_promoted_by_hand_has_no_figures_to_compare_with() -> None:
    result = compare({"concurrency=1": level(100, 10, 50)}, "A", promoted(None), 0.1)
    assert result["compared"] is False
    assert "A has no gate stress figures (event 3 by 'gate'; promoted without the gate)" in result["note"]


@pytest.mark.parametrize(
    ("candidate", "regressed"),
    [
        (level(100, 10, 50), set()),  # the same
        (level(91, 10.9, 54.9), set()),  # worse, within 10%
        (level(200, 1, 5), set()),  # better everywhere
        (level(89, 10, 50), {"output_throughput"}),  # 11% fewer tokens/s
        (level(100, 11.5, 50), {"ttft_ms.p99"}),
        (level(100, 10, 56), {"e2el_ms.p99"}),
        (level(50, 20, 100), {"output_throughput", "ttft_ms.p99", "e2el_ms.p99"}),
    ],
)
def test_each_figure_may_be_at_most_max_regression_worse(candidate: dict[str, Any], regressed: set[str]) -> None:
    baseline = {"concurrency=1": level(100, 10, 50), "poisson=4": level(100, 10, 50)}
    result = compare({"concurrency=1": candidate}, "A", promoted(baseline), 0.1)
    assert result["compared"] is True and len(result["checks"]) == 3
    assert {r["figure"] for r in result["regressions"]} == regressed
    assert all(r["level"] == "concurrency=1" and not r["passed"] for r in result["regressions"])
    throughput = next(c for c in result["checks"] if c["figure"] == "output_throughput")
    assert throughput["worse_by"] == pytest.approx((100 - candidate["output_throughput"]) / 100)
    assert result["note"].startswith("compared with the gate figures of A (history event 3) at 1 load levels")


def test_levels_measured_by_only_one_gate_are_not_compared() -> None:
    result = compare({"concurrency=8": level(1, 1, 1)}, "A", promoted({"concurrency=1": level(1, 1, 1)}), 0.1)
    assert result["compared"] is False
    assert "no load level in common" in result["note"]


class FakeDeployments:
    def __init__(self, current: str | None, history: list[dict[str, Any]]) -> None:
        self._current, self._history = current, history

    def current(self) -> dict[str, Any]:
        return {"bundle_id": self._current}

    def history(self) -> list[dict[str, Any]]:
        return self._history


def test_the_baseline_is_the_latest_promotion_of_what_production_serves() -> None:
    history = [
        {"sequence": 1, "action": "promote", "to": "A"},
        {"sequence": 2, "action": "promote", "to": "B"},
        {"sequence": 3, "action": "rollback", "to": "A"},
        {"sequence": 4, "action": "promote", "to": "B"},
        {"sequence": 5, "action": "rollback", "to": "A"},
    ]
    assert baseline_event(FakeDeployments("A", history))["sequence"] == 1
    assert baseline_event(FakeDeployments("B", history[:4]))["sequence"] == 4
    assert baseline_event(FakeDeployments(None, history)) is None


def test_figures_measured_with_other_settings_are_not_compared() -> None:
    event = promoted({"concurrency=1": level(100, 10, 50)})
    event["figures"]["gate"] = {"load_sha256": "a" * 64}
    worse = {"concurrency=1": level(10, 100, 500)}
    other = compare(worse, "A", event, 0.1, settings_sha256="b" * 64)
    assert other["compared"] is False and other["regressions"] == []
    assert other["note"].startswith("not comparable: the gate of A ran another load")
    same = compare(worse, "A", event, 0.1, settings_sha256="a" * 64)
    assert same["compared"] is True and len(same["regressions"]) == 3


def test_thresholds_are_not_part_of_the_load_compared() -> None:
    config = load_config(TINY_CONFIG)
    stricter = config.model_copy(
        update={"gate": config.gate.model_copy(update={"max_regression": 5.0, "slo_ttft_ms": 1.0})}
    )
    heavier = config.model_copy(update={"gate": config.gate.model_copy(update={"requests_per_level": 99})})
    assert load_sha256(stricter) == load_sha256(config) != load_sha256(heavier)
