"""report_metadata: what the UI shows of a gate report, whatever steps and figures it holds.

The gate's steps change (a step added, a step's figures reshaped); the metadata must then
still be made: every step's figures are kept whole in `figures`, and a step or figure the
per-step rows do not know adds no row instead of failing the run that reports it.
"""

from __future__ import annotations

from typing import Any

import dagster as dg

from orchestration.assets.deployment import LEVEL_COLUMNS, STEP_ROWS, VERDICT_CHARS, levels_table, report_metadata


def report(*steps: tuple[str, bool, dict[str, Any]]) -> dict[str, Any]:
    return {
        "bundle_id": "b" * 16,
        "path": "/tmp/gate-report.json",
        "production_before": {"bundle_id": None, "sequence": 0},
        "steps": [
            {"name": name, "passed": passed, "seconds": 1.5, "figures": figures} for name, passed, figures in steps
        ],
    }


BASE = {"verdict", "bundle_id", "gate_steps", "figures", "gate_report", "production_before"}


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


def level(ttft_p99: float, e2el_p99: float) -> dict[str, Any]:
    return {"errors": 0, "rejected_429": 0, "ttft_ms": {"p99": ttft_p99}, "e2el_ms": {"p99": e2el_p99}}


def test_each_stress_level_gets_numeric_p99_rows() -> None:
    levels = {"concurrency=1": level(13.4, 31.9), "poisson=8.0": level(12.5, 41.8), "broken": "not a level"}
    metadata = report_metadata(report(("stress", True, {"levels": levels})))
    numbers = {key: value for key, value in metadata.items() if key.startswith("stress_") and key != "stress_levels"}
    assert numbers == {
        "stress_concurrency_1_ttft_p99_ms": 13.4,
        "stress_concurrency_1_e2el_p99_ms": 31.9,
        "stress_poisson_8_0_ttft_p99_ms": 12.5,
        "stress_poisson_8_0_e2el_p99_ms": 41.8,
    }


def test_the_verdict_and_the_numbers_come_first() -> None:
    made = report(
        ("quality", True, {"candidate": {"bits_per_byte": 1.61}, "worse_by": -0.01}),
        ("stress", True, {"levels": {"concurrency=1": level(13.4, 31.9)}}),
        ("drill", True, {"time_to_rollback_seconds": 0.4}),
        ("promote", True, {"sequence": 2}),
    )
    made |= {"passed": True, "event": {"sequence": 2, "from": "a" * 16}}
    keys = list(report_metadata(made))
    assert keys[:2] == ["verdict", "bundle_id"]
    numbers = keys[2 : keys.index("gate_steps")]
    assert set(numbers) == {
        "bits_per_byte_candidate",
        "quality_worse_by",
        "stress_concurrency_1_ttft_p99_ms",
        "stress_concurrency_1_e2el_p99_ms",
        "time_to_rollback_seconds",
    }
    assert report_metadata(made)["verdict"] == f"promoted {'b' * 16} to production (sequence 2, was {'a' * 16})"


def test_a_refusal_is_one_line_naming_step_and_figure() -> None:
    reason = "P99 TTFT over the SLO at this load level; " * 10  # long, as reasons with advice are
    message = f"gate failed at stress: concurrency=1.ttft_ms.p99 = 13.36 (limit 0.001): {reason}"
    made = report(("stress", False, {})) | {"passed": False, "failure": {"message": message}}
    line = report_metadata(made)["verdict"]
    assert line.startswith("refused at stress: concurrency=1.ttft_ms.p99 = 13.36 (limit 0.001): P99 TTFT")
    assert len(line) == VERDICT_CHARS and line.endswith("…") and "\n" not in line


def test_an_inconclusive_report_says_so_and_refuses_nothing() -> None:
    message = (
        "inconclusive: the machine was busy (other processes took 1.02 of 2 cores during concurrency=8; there "
        "concurrency=8.good_fraction = 0.7812, limit 0.9): the stress step's SLOs say nothing of the bundle then"
    )
    failure = {"message": message, "outcome": "inconclusive"}
    made = report(("stress", False, {})) | {"passed": False, "outcome": "inconclusive", "failure": failure}
    metadata = report_metadata(made)
    assert metadata["verdict"] == message[: VERDICT_CHARS - 1] + "…"
    assert metadata["gate_steps"].value.splitlines()[-1] == "| stress | False | 1.50 | inconclusive: see verdict |"
    # The same failure, failed: a refusal.
    failed = made | {"outcome": "failed", "failure": {"message": "gate failed at stress: x = 1 (limit 0): y"}}
    assert report_metadata(failed)["verdict"] == "refused at stress: x = 1 (limit 0): y"
    assert report_metadata(failed)["gate_steps"].value.endswith("| failed: see failed_figure |")


def test_an_unfinished_report_says_so() -> None:
    assert report_metadata(report(("verify", True, {})))["verdict"] == "not decided: the gate did not finish"


def test_the_stress_table_stays_narrow() -> None:
    """Five load levels (configs/pipeline.yaml) in a table whose widest line fits the value
    column of the asset page at 1600 px (about 60 monospace characters)."""
    levels = {f"concurrency={n}": level(1234.5, 12345.6) for n in (1, 8, 32)}
    levels |= {f"poisson={rate}": level(1234.5, 12345.6) for rate in (4.0, 16.0)}
    lines = levels_table(levels).splitlines()
    assert len(lines) == 2 + 5 and len(LEVEL_COLUMNS) <= 6
    assert max(len(line) for line in lines[2:]) <= 70, lines
