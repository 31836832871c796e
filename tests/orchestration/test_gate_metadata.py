"""report_metadata: what the UI shows of a gate report, whatever steps and figures it holds.

The gate's steps change (a step added, a step's figures reshaped); the metadata must then
still be made: every step's figures are kept whole in `figures`, and a step or figure the
per-step rows do not know adds no row instead of failing the run that reports it.
"""

from __future__ import annotations

from typing import Any

import dagster as dg

from orchestration.assets.deployment import STEP_ROWS, report_metadata


def report(*steps: tuple[str, bool, dict[str, Any]]) -> dict[str, Any]:
    return {
        "bundle_id": "b" * 16,
        "path": "/tmp/gate-report.json",
        "production_before": {"bundle_id": None, "sequence": 0},
        "steps": [
            {"name": name, "passed": passed, "seconds": 1.5, "figures": figures} for name, passed, figures in steps
        ],
    }


BASE = {"bundle_id", "gate_steps", "figures", "gate_report", "production_before"}


def test_steps_and_figures_it_does_not_know_add_no_row() -> None:
    made = report(
        ("verify", True, {"files_checked": 7}),
        ("quality", True, {"candidate": {"bits_per_byte": "3.4"}}),  # a figure of the wrong type
        ("compare", True, {"rounds": [{"ratio": 1.01}]}),  # no `decision`: a reshaped comparison
        ("stress", False, {}),  # a failed step stops early, with few figures
    )
    metadata = report_metadata(made)
    assert set(metadata) == BASE
    assert metadata["figures"] == dg.MetadataValue.json({step["name"]: step["figures"] for step in made["steps"]})
    assert metadata["production_before"] == "none"
    rows = metadata["gate_steps"].value.splitlines()
    assert [row.split(" | ")[0].strip("| ") for row in rows[2:]] == ["verify", "quality", "compare", "stress"]
    assert rows[-1] == "| stress | False | 1.50 | failed: see failed_figure |"


def test_malformed_rows_are_left_out_and_known_ones_kept() -> None:
    made = report(
        ("compare", True, {"decision": {"ratio": 0.97, "interval": [0.9, "x"], "verdict": "no regression"}}),
        ("stress", False, {"levels": "not a table"}),  # failed: no headline is made of it
        ("drill", True, {"time_to_rollback_seconds": 0.4}),  # pickup_seconds missing
    )
    metadata = report_metadata(made)
    assert set(metadata) == BASE | {"latency_ratio_vs_deployed", "speed_verdict", "time_to_rollback_seconds"}
    assert (metadata["latency_ratio_vs_deployed"], metadata["time_to_rollback_seconds"]) == (0.97, 0.4)


def test_quality_shows_both_models_side_by_side() -> None:
    quality = {
        "candidate": {"bits_per_byte": 1.61, "bundle_id": "c" * 16},
        "deployed": {"bits_per_byte": 1.63, "bundle_id": "d" * 16},
        "unigram": {"bits_per_byte": 2.45},
        "worse_by": -0.0123,
    }
    metadata = report_metadata(report(("quality", True, quality)))
    assert (metadata["bits_per_byte_candidate"], metadata["bits_per_byte_deployed"]) == (1.61, 1.63)
    assert (metadata["bits_per_byte_unigram"], metadata["quality_worse_by"]) == (2.45, -0.0123)
    assert metadata["quality"].value.splitlines()[2:] == [
        f"| candidate | {'c' * 16} | 1.6100 |",
        f"| deployed | {'d' * 16} | 1.6300 |",
        "| unigram | token frequencies | 2.4500 |",
    ]


def test_every_row_maker_survives_empty_figures() -> None:
    assert {name: rows({}) for name, rows in STEP_ROWS.items()} == {name: {} for name in STEP_ROWS}
