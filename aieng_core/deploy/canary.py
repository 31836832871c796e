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
from collections.abc import Sequence
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
    errors: int  # answered 5xx or 429: the server failed or shed the request
    p99_ms: float | None  # of the requests answered 2xx; None: none was
    client_errors: int = 0  # answered another 4xx: as common on both sides, unless the bundle refuses requests
    first_arrival: float | None = None  # epoch seconds of the first request counted

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def client_error_rate(self) -> float:
        return self.client_errors / self.requests if self.requests else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "error_rate": self.error_rate, "client_error_rate": self.client_error_rate}


@dataclass(frozen=True)
class _Answer:
    arrival: float
    latency_ms: float
    status: int


class RequestLogWindow:
    """The generation requests of some bundles in the request log, read as it grows: each
    poll() reads only the lines appended since the last (the log is append-only); a rotation
    (another file at the path) is followed from its start. figures() counts the requests that
    arrived at `since` or later."""

    def __init__(self, log_path: Path, bundle_ids: Sequence[str]) -> None:
        self.log_path = log_path
        self.answers: dict[str, list[_Answer]] = {bundle: [] for bundle in bundle_ids}
        self._position = log_size(log_path)  # what was there before the rollout is not its traffic
        self._inode = _inode(log_path)
        self._partial = b""

    def poll(self) -> None:
        inode = _inode(self.log_path)
        if inode is None:
            return
        if inode != self._inode or log_size(self.log_path) < self._position:
            self._inode, self._position, self._partial = inode, 0, b""  # rotated: a new file
        with self.log_path.open("rb") as log:
            log.seek(self._position)
            data = self._partial + log.read()
            self._position = log.tell()
        *lines, self._partial = data.split(b"\n")  # the last piece may be a line still being written
        for line in lines:
            self._take(line)

    def _take(self, line: bytes) -> None:
        try:
            record = json.loads(line)
            answers = self.answers.get(record.get("bundle_id"))
            if answers is None or record.get("path") not in GENERATION_PATHS:
                return
            arrival = dt.datetime.fromisoformat(record["time"]).timestamp()
            answers.append(_Answer(arrival, float(record["latency_ms"]), int(record["status"])))
        except (AttributeError, KeyError, TypeError, ValueError):
            return  # not a record (a torn or foreign line)

    def figures(self, bundle_id: str, since: float) -> WindowFigures:
        answers = [a for a in self.answers[bundle_id] if a.arrival >= since]
        errors = sum(a.status >= 500 or a.status == 429 for a in answers)
        client = sum(400 <= a.status < 500 and a.status != 429 for a in answers)
        succeeded = [a.latency_ms for a in answers if 200 <= a.status < 300]
        first = min((a.arrival for a in answers), default=None)
        p99 = percentile(succeeded, 99) if succeeded else None
        return WindowFigures(len(answers), errors, p99, client, first)

    def forget_before(self, since: float) -> None:
        """Drop what arrived before `since` (a past step's): memory stays one step's traffic."""
        for bundle, answers in self.answers.items():
            self.answers[bundle] = [a for a in answers if a.arrival >= since]


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None


def log_size(log_path: Path) -> int:
    try:
        return log_path.stat().st_size
    except FileNotFoundError:
        return 0


def read_window(log_path: Path, since: float, bundle_ids: Sequence[str]) -> dict[str, WindowFigures]:
    """Each bundle's generation requests in the whole log that arrived at `since` or later."""
    window = RequestLogWindow(log_path, bundle_ids)
    window._position, window._inode = 0, _inode(log_path)
    window.poll()
    window._take(window._partial)  # a last line without its newline
    return {bundle: window.figures(bundle, since) for bundle in bundle_ids}


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class CanaryPolicy:
    """When a step passes, judged once at the end of its hold (a judgement at every poll
    would take the worst of many looks: measured in docs/deployment/canary.md): the candidate
    answered at least `min_requests`; its error rate (5xx and 429) and its rate of other 4xx
    are each at most production's plus `max_error_rate_increase`; its P99 latency (of 2xx
    answers) at most production's times `max_p99_ratio` plus `p99_slack_ms` (the slack keeps a
    few milliseconds of noise on a fast model from reading as a 50% regression)."""

    min_requests: int = 500  # measured: fewer make false rollbacks of heavy-tailed latencies common
    max_error_rate_increase: float = 0.01
    max_p99_ratio: float = 1.5
    p99_slack_ms: float = 5.0

    def __post_init__(self) -> None:
        if self.min_requests < 1:
            raise DeploymentError(f"--min-requests must be at least 1, not {self.min_requests}")
        if not 0.0 <= self.max_error_rate_increase <= 1.0:
            raise DeploymentError(f"--max-error-rate-increase must be in [0, 1], not {self.max_error_rate_increase}")
        if not self.max_p99_ratio >= 1.0 or math.isinf(self.max_p99_ratio):
            raise DeploymentError(f"--max-p99-ratio must be at least 1, not {self.max_p99_ratio}")
        if not self.p99_slack_ms >= 0.0 or math.isinf(self.p99_slack_ms):
            raise DeploymentError(f"--p99-slack-ms must be at least 0, not {self.p99_slack_ms}")


def judge(candidate: WindowFigures, baseline: WindowFigures, policy: CanaryPolicy) -> str | None:
    """Why the candidate breaches its SLOs against `baseline`, or None when it does not."""
    if candidate.error_rate > baseline.error_rate + policy.max_error_rate_increase:
        return (
            f"error rate {candidate.error_rate:.2%} ({candidate.errors} of {candidate.requests}, 5xx and 429) "
            f"against production's {baseline.error_rate:.2%} ({baseline.errors} of {baseline.requests}): more "
            f"than {policy.max_error_rate_increase:.2%} above"
        )
    if candidate.client_error_rate > baseline.client_error_rate + policy.max_error_rate_increase:
        return (
            f"refused {candidate.client_error_rate:.2%} of its requests with a 4xx ({candidate.client_errors} of "
            f"{candidate.requests}) against production's {baseline.client_error_rate:.2%}: more than "
            f"{policy.max_error_rate_increase:.2%} above (the same clients send both sides the same requests)"
        )
    if candidate.p99_ms is not None and baseline.p99_ms is not None:
        limit = baseline.p99_ms * policy.max_p99_ratio + policy.p99_slack_ms
        if candidate.p99_ms > limit:
            return (
                f"P99 latency {candidate.p99_ms:.1f} ms against production's {baseline.p99_ms:.1f} ms: above "
                f"{policy.max_p99_ratio:g} x + {policy.p99_slack_ms:g} ms = {limit:.1f} ms"
            )
    return None
