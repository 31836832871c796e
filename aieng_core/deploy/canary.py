"""Canary rollouts: a candidate bundle answers a growing share of a pointer's traffic, watched
against what the pointer serves, and is rolled back by itself on a breach.

State, beside the pointer it rolls out on (`deployments/<pointer>/`):
- `canary.json` (store/canary_state.py, which the servers read): the candidate and its share
  of the traffic while a rollout runs.
- `canary-history.jsonl`: one line per event of every rollout (`start`, `step`, `rolled_back`,
  `promoted`, `aborted`), with the figures each decision was taken on and, for a rollback, why.

The figures come from the request log every server appends to (`store/request_log.py`: one
line per answered request, naming the bundle that answered): for each step's window, each
bundle's requests, errors (5xx) and P99 latency, both sides over the same window. This module
is pure: it reads and writes those files; the rollout itself (cli/deploy.py, through the gate)
and the servers (serving/http/following.py) use it.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from aieng_core.store.pointers import PRODUCTION, DeploymentError, deployments_dir

CANARY_HISTORY_FILE = "canary-history.jsonl"
ACTIONS = ("start", "step", "rolled_back", "promoted", "aborted")
GENERATION_PATHS = ("/generate", "/predict", "/v1/completions", "/v1/chat/completions")


def canary_history_path(home: Path | str, pointer: str = PRODUCTION) -> Path:
    return deployments_dir(home) / pointer / CANARY_HISTORY_FILE


def parse_steps(text: str) -> tuple[float, ...]:
    """`5,25,100` -> (0.05, 0.25, 1.0): percentages of traffic, increasing, ending at 100."""
    try:
        percents = [float(part) for part in text.split(",")]
    except ValueError:
        raise DeploymentError(f"--steps {text!r}: percentages separated by commas, such as 5,25,100") from None
    if not percents or any(not 0 < p <= 100 or math.isnan(p) for p in percents):
        raise DeploymentError(f"--steps {text!r}: each step is a percentage in (0, 100]")
    if any(b <= a for a, b in zip(percents, percents[1:], strict=False)):
        raise DeploymentError(f"--steps {text!r}: the steps must increase")
    if percents[-1] != 100:
        raise DeploymentError(f"--steps {text!r}: the last step must be 100 (the candidate takes all the traffic)")
    return tuple(p / 100 for p in percents)


def parse_duration(text: str) -> float:
    """`10m`, `30s`, `1h`, `90` (seconds) -> seconds."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    number, unit = (text[:-1], units[text[-1]]) if text and text[-1] in units else (text, 1.0)
    try:
        seconds = float(number) * unit
    except ValueError:
        raise DeploymentError(f"--hold {text!r}: a duration such as 10m, 30s or 1h") from None
    if not seconds > 0 or math.isinf(seconds):
        raise DeploymentError(f"--hold {text!r}: must be more than 0")
    return seconds


# ---- history ----------------------------------------------------------------------------------
def record_event(home: Path | str, pointer: str, event: dict[str, Any]) -> dict[str, Any]:
    """Appends one event (with its time and pointer) to the canary history; returns it."""
    if event.get("action") not in ACTIONS:
        raise ValueError(f"canary event action must be one of {ACTIONS}, not {event.get('action')!r}")
    full = {"time": now_iso(), "pointer": pointer, **event}
    path = canary_history_path(home, pointer)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(full, sort_keys=True, allow_nan=False).encode() + b"\n"
    with path.open("ab") as history:  # O_APPEND, one write: whole lines, never rewritten
        history.write(line)
    return full


def read_history(home: Path | str, pointer: str = PRODUCTION) -> list[dict[str, Any]]:
    """Every canary event on `pointer`, oldest first (a torn last line is left out)."""
    path = canary_history_path(home, pointer)
    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        return []
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:
            continue  # a line a crash cut short: no event
    return events


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


# ---- figures ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class WindowFigures:
    """One bundle's generation requests in a window of the request log."""

    requests: int
    errors: int  # answered 5xx
    p99_ms: float | None  # None: no request

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "error_rate": self.error_rate}


def read_window(log_path: Path, since: float, bundle_ids: Sequence[str], offset: int = 0) -> dict[str, WindowFigures]:
    """Each of `bundle_ids`' generation requests that arrived at `since` (epoch seconds) or
    later, from the request log at `log_path`, read from byte `offset` on (its size when the
    rollout began: the log is only appended to)."""
    latencies: dict[str, list[float]] = {bundle: [] for bundle in bundle_ids}
    errors = dict.fromkeys(bundle_ids, 0)
    for record in _records(log_path, offset):
        bundle = record.get("bundle_id")
        if bundle not in latencies or record.get("path") not in GENERATION_PATHS:
            continue
        try:
            arrived = dt.datetime.fromisoformat(record["time"]).timestamp()
            latency, status = float(record["latency_ms"]), int(record["status"])
        except (KeyError, TypeError, ValueError):
            continue
        if arrived < since:
            continue
        latencies[bundle].append(latency)
        errors[bundle] += status >= 500
    return {
        bundle: WindowFigures(len(values), errors[bundle], percentile(values, 99) if values else None)
        for bundle, values in latencies.items()
    }


def log_size(log_path: Path) -> int:
    try:
        return log_path.stat().st_size
    except FileNotFoundError:
        return 0


def _records(log_path: Path, offset: int = 0) -> Iterator[dict[str, Any]]:
    try:
        with log_path.open("rb") as log:
            if offset > log_path.stat().st_size:
                offset = 0  # rotated since: a new file
            log.seek(offset)
            lines = log.read().splitlines()
    except FileNotFoundError:
        return
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            yield record


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class CanaryPolicy:
    """When a step passes: the candidate answered at least `min_requests`, its error rate is
    at most production's plus `max_error_rate_increase`, and its P99 latency at most
    production's times `max_p99_ratio` plus `p99_slack_ms` (the slack keeps a few
    milliseconds of noise on a fast model from reading as a 50% regression)."""

    min_requests: int = 20
    max_error_rate_increase: float = 0.01
    max_p99_ratio: float = 1.5
    p99_slack_ms: float = 5.0


def judge(candidate: WindowFigures, baseline: WindowFigures, policy: CanaryPolicy) -> str | None:
    """Why the candidate breaches its SLOs against `baseline`, or None when it does not.
    Needs `policy.min_requests` of the candidate's (the caller waits for them)."""
    if candidate.error_rate > baseline.error_rate + policy.max_error_rate_increase:
        return (
            f"error rate {candidate.error_rate:.2%} ({candidate.errors} of {candidate.requests}) against "
            f"production's {baseline.error_rate:.2%} ({baseline.errors} of {baseline.requests}): more than "
            f"{policy.max_error_rate_increase:.2%} above"
        )
    if candidate.p99_ms is not None and baseline.p99_ms is not None:
        limit = baseline.p99_ms * policy.max_p99_ratio + policy.p99_slack_ms
        if candidate.p99_ms > limit:
            return (
                f"P99 latency {candidate.p99_ms:.1f} ms against production's {baseline.p99_ms:.1f} ms: above "
                f"{policy.max_p99_ratio:g} x + {policy.p99_slack_ms:g} ms = {limit:.1f} ms"
            )
    return None
