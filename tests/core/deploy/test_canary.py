"""The canary rollout's parts without servers: routing by request id, the state file, the
window figures read from a request log, the SLO judgement, and the rollout's steps on a
request log written as it polls (a fake clock: no sleeping)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aieng_core.deploy.canary import (
    CanaryPolicy,
    WindowFigures,
    judge,
    parse_duration,
    parse_steps,
    percentile,
    read_history,
    read_window,
)
from aieng_core.gate.canary import canary_rollout
from aieng_core.gate.report import GateFailed
from aieng_core.store.canary_state import canary_path, read_canary, routes_to_canary, write_canary
from aieng_core.store.pointers import DeploymentError, Pointer


def test_routing_is_sticky_proportional_and_nested() -> None:
    ids = [f"request-{n}" for n in range(20_000)]
    at_5 = {i for i in ids if routes_to_canary(i, 0.05)}
    at_25 = {i for i in ids if routes_to_canary(i, 0.25)}
    assert abs(len(at_5) / len(ids) - 0.05) < 0.005 and abs(len(at_25) / len(ids) - 0.25) < 0.01
    assert at_5 <= at_25  # widening keeps every request the candidate already answered
    assert all(routes_to_canary(i, 0.05) for i in sorted(at_5)[:50])  # the same id, the same side
    assert not any(routes_to_canary(i, 0.0) for i in ids[:100]) and all(routes_to_canary(i, 1.0) for i in ids[:100])


@pytest.mark.parametrize(
    ("text", "says"),
    [("5,25", "last step must be 100"), ("25,5,100", "must increase"), ("0,100", "(0, 100]"), ("a,100", "commas")],
)
def test_bad_steps_are_refused_naming_why(text: str, says: str) -> None:
    with pytest.raises(DeploymentError, match=says.replace("(", r"\(").replace("]", r"\]")):
        parse_steps(text)


def test_steps_and_durations() -> None:
    assert parse_steps("5,25,100") == (0.05, 0.25, 1.0)
    assert [parse_duration(t) for t in ("10m", "30s", "1h", "90")] == [600.0, 30.0, 3600.0, 90.0]
    for bad in ("", "0s", "tenm", "-1m"):
        with pytest.raises(DeploymentError, match="--hold"):
            parse_duration(bad)


def test_the_state_file_is_checked_when_read(tmp_path: Path) -> None:
    assert read_canary(tmp_path) is None
    write_canary(tmp_path, "production", {"bundle_id": "b", "share": 0.25, "step": 2})
    assert read_canary(tmp_path) == {"bundle_id": "b", "share": 0.25, "step": 2}
    canary_path(tmp_path).write_text('{"bundle_id": "b", "share": 7}')
    with pytest.raises(DeploymentError, match="share must be a number in"):
        read_canary(tmp_path)


def _line(time: float, bundle: str, latency: float, status: int = 200, path: str = "/generate") -> str:
    stamp = dt.datetime.fromtimestamp(time, tz=dt.UTC).isoformat(timespec="milliseconds")
    record = {"time": stamp, "request_id": "r", "path": path, "status": status, "bundle_id": bundle,
              "latency_ms": latency}  # fmt: skip
    return json.dumps(record) + "\n"


def test_window_figures_count_each_bundles_generation_requests_since_the_window_opened(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    lines = [_line(100.0, "cand", 1.0)]  # before the window
    lines += [_line(200.0 + n, "cand", float(n), status=500 if n < 2 else 200) for n in range(10)]
    lines += [_line(200.5, "prod", 3.0), _line(201.0, "prod", 5.0), _line(201.0, "other", 9.0)]
    lines += [_line(202.0, "prod", 999.0, path="/health/ready"), "{torn"]
    log.write_text("".join(lines))
    window = read_window(log, 150.0, ["cand", "prod"])
    assert window["cand"] == WindowFigures(10, 2, pytest.approx(float(np.percentile(range(10), 99))))
    assert window["cand"].error_rate == 0.2
    assert window["prod"] == WindowFigures(2, 0, pytest.approx(float(np.percentile([3.0, 5.0], 99))))
    assert read_window(log, 150.0, ["none"])["none"] == WindowFigures(0, 0, None)
    assert read_window(log, 150.0, ["cand"], offset=len(lines[0]) + len(lines[1]))["cand"].requests == 9


@pytest.mark.parametrize("values", [[3.0], [1.0, 2.0], [5.0, 1.0, 4.0], [0.1 * i * i for i in range(37)]])
def test_percentile_matches_numpy(values: list[float]) -> None:
    assert percentile(values, 99) == pytest.approx(float(np.percentile(values, 99)))


def test_judge() -> None:
    policy = CanaryPolicy(min_requests=1, max_error_rate_increase=0.01, max_p99_ratio=1.5, p99_slack_ms=5.0)
    production = WindowFigures(100, 1, 20.0)
    assert judge(WindowFigures(50, 0, 34.9), production, policy) is None  # under 1.5 x 20 + 5
    assert "P99 latency 36.0 ms" in (judge(WindowFigures(50, 0, 36.0), production, policy) or "")
    assert "error rate 4.00%" in (judge(WindowFigures(50, 2, 10.0), production, policy) or "")
    assert judge(WindowFigures(100, 2, 10.0), production, policy) is None  # 2% <= 1% + 1%


# ---- the rollout on a request log written as it polls -------------------------------------------
class Traffic:
    """A fake clock whose every sleep writes the requests that arrived meanwhile to the log:
    `rate` per second, each routed by its id at the share canary.json says now."""

    def __init__(self, home: Path, log: Path, latency: dict[str, float], errors: dict[str, int] | None = None):
        self.home, self.log, self.latency, self.errors = home, log, latency, errors or {}
        self.now, self.sent, self.shares = 1_000_000.0, 0, []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        state = read_canary(self.home)
        share = state["share"] if state else 0.0
        self.shares.append(share)
        with self.log.open("a") as log:
            for _ in range(int(seconds * 40)):  # 40 requests a second
                self.now += 1 / 40
                self.sent += 1
                bundle = "cand" if state and routes_to_canary(f"id-{self.sent}", share) else "prod"
                status = 500 if self.sent % 10 < self.errors.get(bundle, 0) else 200
                log.write(_line(self.now, bundle, self.latency[bundle], status))


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    pointer = Pointer(home, "production")
    pointer.directory.mkdir(parents=True)
    # production serves "prod" (a current.json as a promote writes it)
    doc = {"pointer": "production", "bundle_id": "prod", "bundle_path": "/x", "sequence": 1,
           "updated_at": "2026-12-02T00:00:00+00:00", "stack": []}  # fmt: skip
    pointer.current_path.write_text(json.dumps(doc))
    return home


def _rollout(home: Path, traffic: Traffic, policy: CanaryPolicy = CanaryPolicy(min_requests=20)) -> Any:
    return canary_rollout(
        home, "production", "cand", (0.05, 0.25, 1.0), 30.0, traffic.log, "tester", policy,
        poll_s=0.5, first_answer_s=60.0, clock=traffic.clock, sleep=traffic.sleep,
    )  # fmt: skip


def test_a_healthy_candidate_is_promoted_after_every_step(tmp_path: Path) -> None:
    home = _home(tmp_path)
    traffic = Traffic(home, tmp_path / "requests.jsonl", {"cand": 10.0, "prod": 10.0})
    promoted: list[dict[str, Any]] = []
    event = _rollout(home, traffic)(lambda extra: promoted.append(extra or {}) or {"sequence": 2})
    assert event == {"sequence": 2}
    [extra] = promoted
    steps = extra["canary"]["steps"]
    assert [s["share"] for s in steps] == [0.05, 0.25, 1.0]
    assert all(s["candidate"]["requests"] >= 20 and s["seconds"] >= 30.0 for s in steps)
    assert steps[-1]["production"]["requests"] == 0 and steps[-1]["compared_with"] == "the previous step's window"
    assert sorted(set(traffic.shares)) == [0.05, 0.25, 1.0]
    assert read_canary(home) is None  # removed once promoted
    assert [e["action"] for e in read_history(home)] == ["start", "step", "step", "step", "promoted"]


def test_a_slow_candidate_is_rolled_back_at_the_first_step_naming_why(tmp_path: Path) -> None:
    home = _home(tmp_path)
    traffic = Traffic(home, tmp_path / "requests.jsonl", {"cand": 80.0, "prod": 10.0})
    with pytest.raises(GateFailed) as failed:
        _rollout(home, traffic)(lambda extra: pytest.fail("promoted a breaching candidate"))
    assert failed.value.step == "canary" and "P99 latency 80.0 ms" in failed.value.reason
    assert read_canary(home) is None
    history = read_history(home)
    assert [e["action"] for e in history] == ["start", "rolled_back"]
    assert "P99 latency" in history[-1]["reason"] and history[-1]["steps"][0]["share"] == 0.05
    # Rolled back as soon as the candidate had its 20 requests, not after the hold.
    assert history[-1]["steps"][0]["seconds"] < 30.0


def test_a_candidate_that_errors_is_rolled_back(tmp_path: Path) -> None:
    home = _home(tmp_path)
    traffic = Traffic(home, tmp_path / "requests.jsonl", {"cand": 10.0, "prod": 10.0}, errors={"cand": 1})
    with pytest.raises(GateFailed, match="error rate"):
        _rollout(home, traffic)(lambda extra: pytest.fail("promoted an erroring candidate"))


def test_a_candidate_no_server_answers_for_is_rolled_back(tmp_path: Path) -> None:
    home = _home(tmp_path)
    traffic = Traffic(home, tmp_path / "requests.jsonl", {"cand": 10.0, "prod": 10.0})
    traffic.sleep = lambda seconds: setattr(traffic, "now", traffic.now + seconds)  # type: ignore[method-assign]
    with pytest.raises(GateFailed, match="answered no request in 60 s"):
        _rollout(home, traffic)(lambda extra: pytest.fail("promoted an unwatched candidate"))
    assert read_canary(home) is None


def test_an_interrupted_rollout_removes_the_canary_and_says_so(tmp_path: Path) -> None:
    home = _home(tmp_path)
    traffic = Traffic(home, tmp_path / "requests.jsonl", {"cand": 10.0, "prod": 10.0})
    sleep = traffic.sleep

    def interrupted(seconds: float) -> None:
        sleep(seconds)
        if traffic.now > 1_000_040.0:
            raise KeyboardInterrupt

    traffic.sleep = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        _rollout(home, traffic)(lambda extra: pytest.fail("promoted"))
    assert read_canary(home) is None
    assert read_history(home)[-1]["action"] == "aborted"
