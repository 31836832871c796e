"""What a gate run found: each step's figures, the first failure, and where the report is kept.

A failed gate raises GateFailed naming the step, the figure that failed it, the value measured
and the limit it broke, with a reason a person can act on. Every run, passed or failed, is
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
from typing import Any

from aieng_core.deploy.deployments import DEPLOYMENTS_DIR
from aieng_core.store.atomic import atomic_write_bytes

REPORTS_DIR = "gate-reports"
STEPS = ("verify", "warmup", "stress", "drill", "promote")


class GateFailed(Exception):
    """The gate refused the bundle at `step`: `figure` measured `value` against `limit`.
    Production was not changed. `figures` are what the step measured before it stopped;
    `report` (set by run_gate) is the whole run, `report.path` where it was written."""

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
        measured = "" if value is None else f" = {_show(value)}" + ("" if limit is None else f" (limit {_show(limit)})")
        super().__init__(f"gate failed at {step}: {figure}{measured}: {reason}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "figure": self.figure,
            "value": plain(self.value),
            "limit": plain(self.limit),
            "reason": self.reason,
            "message": str(self),
        }


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
class StepResult:
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
    steps: list[StepResult] = field(default_factory=list)
    passed: bool = False
    failure: dict[str, Any] | None = None  # GateFailed.as_dict() of the step that stopped the gate
    event: dict[str, Any] | None = None  # the production history event of the promotion
    finished_at: str | None = None
    path: str | None = None  # where this report was written

    def figures(self) -> dict[str, Any]:
        """Each finished step's figures by step name (what the promotion event records)."""
        return {step.name: step.figures for step in self.steps}

    def step(self, name: str) -> StepResult:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(f"the gate did not run step {name!r} (ran {[s.name for s in self.steps]})")

    def as_dict(self) -> dict[str, Any]:
        return plain(asdict(self))


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def reports_dir(home: Path) -> Path:
    return Path(home) / DEPLOYMENTS_DIR / REPORTS_DIR


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
