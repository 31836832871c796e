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
    RequestLogWindow,
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
from aieng_core.store.canary_state import (
    CANARY_STALE_S,
    canary_path,
    clear_canary,
    live_canary,
    read_canary,
    routes_to_canary,
    write_canary,
)
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
    lines += [_line(203.5, "cand", 0.5, status=429), _line(204.5, "cand", 0.5, status=400)]
    lines += [_line(200.5, "prod", 3.0), _line(201.0, "prod", 5.0), _line(201.0, "other", 9.0)]
    lines += [_line(202.0, "prod", 999.0, path="/health/ready"), "{torn\n"]
    log.write_text("".join(lines))
    window = read_window(log, 150.0, ["cand", "prod"])
    # Errors: the 5xx and the 429; the 400 is a client error; P99 of the 2xx answers only.
    p99 = pytest.approx(float(np.percentile(range(2, 10), 99)))
    assert window["cand"] == WindowFigures(12, 3, p99, client_errors=1, first_arrival=200.0)
    assert (window["cand"].error_rate, window["cand"].client_error_rate) == (0.25, 1 / 12)
    assert window["prod"] == WindowFigures(2, 0, pytest.approx(float(np.percentile([3.0, 5.0], 99))), 0, 200.5)
    assert read_window(log, 150.0, ["none"])["none"] == WindowFigures(0, 0, None)


def test_the_window_reads_only_what_was_appended_and_follows_a_rotation(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    log.write_text(_line(10.0, "cand", 1.0))  # before the rollout: not its traffic
    window = RequestLogWindow(log, ["cand"])
    with log.open("a") as out:
        out.write(_line(20.0, "cand", 2.0) + _line(21.0, "cand", 3.0)[:20])  # the last line half written
    window.poll()
    assert window.figures("cand", 0.0).requests == 1
    with log.open("a") as out:
        out.write(_line(21.0, "cand", 3.0)[20:])
    window.poll()
    assert window.figures("cand", 0.0).requests == 2
    log.rename(tmp_path / "requests.jsonl.1")  # logrotate: a new file at the path
    log.write_text(_line(30.0, "cand", 4.0))
    window.poll()
    assert window.figures("cand", 0.0).requests == 3
    window.forget_before(25.0)
    assert window.figures("cand", 0.0).requests == 1


def test_servers_route_only_a_live_canary_of_the_pointer_as_it_is(tmp_path: Path) -> None:
    now = dt.datetime.now(dt.UTC)
    state = {"bundle_id": "b", "share": 0.25, "pointer_sequence": 3, "updated_at": now.isoformat()}
    write_canary(tmp_path, "production", state)
    assert live_canary(tmp_path, "production", 3, now.timestamp()) == state
    assert live_canary(tmp_path, "production", 4, now.timestamp()) is None  # promoted or rolled back by hand since
    assert live_canary(tmp_path, "production", 3, now.timestamp() + CANARY_STALE_S + 1) is None  # its process is gone
    clear_canary(tmp_path)
    assert live_canary(tmp_path, "production", 3, now.timestamp()) is None


@pytest.mark.parametrize("values", [[3.0], [1.0, 2.0], [5.0, 1.0, 4.0], [0.1 * i * i for i in range(37)]])
def test_percentile_matches_numpy(values: list[float]) -> None:
    assert percentile(values, 99) == pytest.approx(float(np.percentile(values, 99)))


def test_judge() -> None:
    policy = CanaryPolicy(min_requests=1, max_error_rate_increase=0.01, max_p99_ratio=1.5, p99_slack_ms=5.0)
    production = WindowFigures(100, 1, 20.0, client_errors=2)
    assert judge(WindowFigures(50, 0, 34.9), production, policy) is None  # under 1.5 x 20 + 5
    assert "P99 latency 36.0 ms" in (judge(WindowFigures(50, 0, 36.0), production, policy) or "")
    assert "error rate 4.00%" in (judge(WindowFigures(50, 2, 10.0), production, policy) or "")
    assert judge(WindowFigures(100, 2, 10.0), production, policy) is None  # 2% <= 1% + 1%
    # A bundle that refuses what production answers (a missing chat template: fast 400s).
    assert "refused 50.00%" in (judge(WindowFigures(50, 0, 1.0, client_errors=25), production, policy) or "")


@pytest.mark.parametrize(
    ("field", "value"),
    [("min_requests", 0), ("max_error_rate_increase", -0.1), ("max_p99_ratio", 0.5), ("p99_slack_ms", float("nan"))],
)
def test_a_policy_that_could_never_judge_is_refused(field: str, value: float) -> None:
    with pytest.raises(DeploymentError, match=field.replace("_", "-")):
        CanaryPolicy(**{field: value})


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
    assert all(s["candidate"]["requests"] >= 20 and s["seconds_watched"] >= 30.0 for s in steps)
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
    # Judged once, at the end of the hold (every poll's look would add false rollbacks).
    assert history[-1]["steps"][0]["seconds_watched"] >= 30.0


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


def _interrupt(home: Path) -> None:
    raise KeyboardInterrupt


def _roll_back_by_hand(home: Path) -> None:
    current = Pointer(home, "production").current_path
    current.write_text(current.read_text().replace('"sequence": 1', '"sequence": 2'))


@pytest.mark.parametrize(
    ("happens", "raised", "says"),
    [
        (_interrupt, KeyboardInterrupt, None),  # Ctrl-C, or SIGTERM (the command turns it into one)
        (_roll_back_by_hand, GateFailed, "changed by hand"),  # a promote or rollback by hand
        (clear_canary, GateFailed, "removed while it ran"),  # what `aieng deploy canary --abort` does
    ],
    ids=["interrupted", "pointer-moved-by-hand", "aborted"],
)
def test_a_rollout_ended_from_outside_removes_the_canary_and_says_so(
    tmp_path: Path, happens: Any, raised: type[BaseException], says: str | None
) -> None:
    home = _home(tmp_path)
    traffic = Traffic(home, tmp_path / "requests.jsonl", {"cand": 10.0, "prod": 10.0})
    sleep = traffic.sleep

    def then(seconds: float) -> None:
        sleep(seconds)
        if traffic.now > 1_000_010.0:  # during the first step
            happens(home)

    traffic.sleep = then  # type: ignore[method-assign]
    with pytest.raises(raised, match=says):
        _rollout(home, traffic)(lambda extra: pytest.fail("promoted"))
    assert read_canary(home) is None
    assert read_history(home)[-1]["action"] == "aborted"
