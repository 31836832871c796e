"""What a gate run found: each step's figures, the first failure, and where the report is kept.

A failed gate raises GateFailed naming the step, the figure that failed it, the value measured
and the limit it broke, with a reason a person can act on. A gate that could not decide (an SLO
broken only while other processes took the machine's CPU: busy.py) raises GateInconclusive, a
GateFailed that is no refusal of the bundle. Every run, passed, failed or inconclusive, is
written as JSON to `$AIENG_HOME/deployments/gate-reports/<bundle_id>-<time>[-<run id>].json`
(atomically), so the figures of a gate that refused a bundle are as findable as those of one
that promoted it (those are also in the production history event).
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from aieng_core.store.atomic import atomic_write_bytes
from aieng_core.store.pointers import GATE_REPORTS_DIR, deployments_dir

STEPS = ("verify", "quality", "warmup", "compare", "stress", "drill", "promote")
# How a gate ended: promoted, refused, or undecided (a re-run can pass). GateReport.conclude sets it.
Outcome = Literal["passed", "failed", "inconclusive"]


class GateFailed(Exception):
    """The gate refused the bundle at `step`: `figure` measured `value` against `limit`.
    Production was not changed. `figures` are what the step measured before it stopped;
    `report` (set by run_gate) is the whole run, `report.path` where it was written."""

    outcome: Outcome = "failed"

    def __init__(
        self,
        step: str,
        figure: str,
        reason: str,
        value: Any = None,
        limit: Any = None,
        figures: dict[str, Any] | None = None,
    ) -> None:
        self.step = step
        self.figure = figure
        self.reason = reason
        self.value = value
        self.limit = limit
        self.figures = figures or {}
        self.report: GateReport | None = None
        super().__init__(self._message())

    def _message(self) -> str:
        value, limit = self.value, self.limit
        measured = "" if value is None else f" = {_show(value)}" + ("" if limit is None else f" (limit {_show(limit)})")
        return f"gate failed at {self.step}: {self.figure}{measured}: {self.reason}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "step": self.step,
            "figure": self.figure,
            "value": plain(self.value),
            "limit": plain(self.limit),
            "reason": self.reason,
            "message": str(self),
        }


class GateInconclusive(GateFailed):
    """The gate could not decide at `step`: `figure` broke its limit only while other processes
    took the machine's CPU (busy.py). No refusal of the bundle: production was not changed and
    a re-run can pass. A GateFailed all the same, so every `except GateFailed` leaves production
    as it was; those that answer a person tell the two apart (`outcome`). `reason` is the
    message after `inconclusive: `."""

    outcome: Outcome = "inconclusive"

    def _message(self) -> str:
        return f"inconclusive: {self.reason}"


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def plain(value: Any) -> Any:
    """`value` as plain JSON: finite floats rounded to 6 significant digits, tuples as lists,
    non-finite floats as None (the history refuses NaN and infinity)."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


@dataclass
class GateStep:
    """One step of a gate run, as the report records it."""

    name: str
    passed: bool
    seconds: float
    figures: dict[str, Any]


@dataclass
class GateReport:
    bundle_id: str
    bundle_path: str
    run_id: str | None
    actor: str
    started_at: str
    production_before: dict[str, Any]  # {bundle_id, sequence} when the gate started
    steps: list[GateStep] = field(default_factory=list)
    outcome: Outcome | None = None  # None while the gate runs; set by conclude() only
    passed: bool = False  # outcome == "passed": promoted
    failure: dict[str, Any] | None = None  # GateFailed.as_dict() of the step that stopped the gate
    event: dict[str, Any] | None = None  # the production history event of the promotion
    finished_at: str | None = None
    path: str | None = None  # where this report was written

    def conclude(self, failure: GateFailed | None = None) -> None:
        """The gate's end, recorded in this one place: passed (no failure: promoted), failed (the
        bundle refused) or inconclusive (undecided: no refusal, a re-run can pass)."""
        self.outcome = "passed" if failure is None else failure.outcome
        self.passed = failure is None
        self.failure = None if failure is None else failure.as_dict()
        self.finished_at = now_iso()

    def figures(self) -> dict[str, Any]:
        """Each finished step's figures by step name (what the promotion event records)."""
        return {step.name: step.figures for step in self.steps}

    def step(self, name: str) -> GateStep:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(f"the gate did not run step {name!r} (ran {[s.name for s in self.steps]})")

    def as_dict(self) -> dict[str, Any]:
        return plain(asdict(self))


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def reports_dir(home: Path) -> Path:
    return deployments_dir(home) / GATE_REPORTS_DIR


def report_name(bundle_id: str, started_at: str, run_id: str | None) -> str:
    stamp = dt.datetime.fromisoformat(started_at).strftime("%Y%m%dT%H%M%S%fZ")
    return f"{bundle_id}-{stamp}" + (f"-{run_id}" if run_id else "")


def write_report(home: Path, report: GateReport) -> Path:
    """Write (or replace) the report's JSON atomically; sets and returns report.path."""
    folder = reports_dir(home)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{report_name(report.bundle_id, report.started_at, report.run_id)}.json"
    report.path = str(path)
    data = json.dumps(report.as_dict(), indent=2, sort_keys=True, ensure_ascii=False).encode("utf-8") + b"\n"
    atomic_write_bytes(path, data)
    return path


def read_report(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def _headline(name: str, figures: dict[str, Any]) -> str:
    if name == "verify":
        return f"{figures['files_checked']} files, {figures['goldens_matching']}/{figures['goldens_replayed']} goldens"
    if name == "warmup":
        return (
            f"{figures['device']}: first request {figures['cold_first_request_ms']:.1f} ms cold, "
            f"{figures['warm_first_request_ms']:.1f} ms warm; peak memory {figures['peak_memory_bytes'] / 2**20:.0f} "
            f"MiB of a {figures['memory_budget_bytes'] / 2**30:.2f} GiB budget; "
            f"decode step graphs {figures['step_graphs']['status']}"
        )
    if name == "quality":
        line = f"candidate {figures['candidate']['bits_per_byte']:.4f} bits/byte"
        if "deployed" in figures:
            line += f", deployed {figures['deployed']['bits_per_byte']:.4f} ({figures['worse_by']:+.1%})"
        return line + f", unigram {figures['unigram']['bits_per_byte']:.4f}"
    if name == "compare":
        return str(figures["note"])
    if name == "stress":
        levels = ", ".join(
            f"{level}: P99 TTFT {values['ttft_ms']['p99']:.1f} ms, {values['output_throughput']:.0f} tok/s"
            for level, values in figures["levels"].items()
        )
        return levels
    if name == "drill":
        traffic = figures["traffic"]
        return (
            f"pickup {figures['pickup_seconds']:.2f} s, time to rollback {figures['time_to_rollback_seconds']:.2f} s, "
            f"{traffic['ok']} requests ok, {traffic['failed_requests']} failed"
        )
    if name == "promote":
        return f"sequence {figures['sequence']}: {figures['from'] or '(none)'} -> {figures['to']}"
    return ""


def step_headline(name: str, figures: dict[str, Any]) -> str:
    """One line of what a passed step found: the run's log line and the UI's steps table say
    the same. A figure missing (a failed step stops early) gives "see the report", never an error."""
    try:
        return _headline(name, figures)
    except (KeyError, TypeError, ValueError, AttributeError):
        return "see the report"
