"""The promotion gate: verify, warm up, compare with what serves, stress-test and
rollback-drill a serving bundle, then promote it on production (production_deployment.py runs
the steps in order)."""

from aieng_core.gate.drill import DRILL_POINTER
from aieng_core.gate.production_deployment import CODE_VERSION, KIND, run_gate
from aieng_core.gate.report import GateFailed, GateInconclusive, GateReport, GateStep, read_report, reports_dir

__all__ = [
    "CODE_VERSION",
    "DRILL_POINTER",
    "KIND",
    "GateFailed",
    "GateInconclusive",
    "GateReport",
    "GateStep",
    "read_report",
    "reports_dir",
    "run_gate",
]
