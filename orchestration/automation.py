"""The declarative automation the retrain chain's later assets carry (orchestration/retrain.py
says why training itself is started by a sensor instead)."""

import dagster as dg

from orchestration.partitions import LOCATION_CONFIG


def follow_new_inputs() -> dg.AutomationCondition | None:
    """benchmark_report's and serving_bundle's condition: eager (run once an input is new,
    never while one is in progress), unless `gate.retrain: manual` says nothing runs by itself."""
    return None if LOCATION_CONFIG.gate.retrain == "manual" else dg.AutomationCondition.eager()
