"""The `aieng` CLI in-process: data report, demo-data, and one-line errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from aieng_core.cli import main
from aieng_core.data import reasons
from aieng_core.data.demo_data import EXPECTED_DIRTY
from aieng_core.data.tables import QUARANTINE_FILE
from tests.conftest import DEMO_PARTITIONS
from tests.core.helpers import BuiltHome, read_table


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(err: str) -> None:
    assert err.startswith("aieng: error: ")
    assert err.count("\n") == 1 and err.endswith("\n")
    assert "Traceback" not in err


@pytest.mark.parametrize("day", [0, 1, 2])
def test_data_report_json_has_exact_counts(built_demo: BuiltHome, capsys: pytest.CaptureFixture, day: int) -> None:
    partition = DEMO_PARTITIONS[day]
    code, out, err = run(capsys, "--home", str(built_demo.home), "data", "report", "--partition", partition, "--json")
    assert code == 0 and err == ""
    report = json.loads(out)  # one JSON document, nothing else on stdout
    assert {"rows_in", "rows_clean", "rows_quarantined", "reasons", "quarantine_path"} <= set(report)
    expected = {reason: EXPECTED_DIRTY[f"day{day + 1}"].get(reason, 0) for reason in reasons.ALL_REASONS}
    assert report["reasons"] == expected
    assert report["rows_quarantined"] == sum(expected.values())
    clean = built_demo.clean[partition]
    assert report["rows_clean"] == clean.metrics["rows_clean"]
    assert report["rows_in"] == report["rows_clean"] + report["rows_quarantined"]
    assert report["quarantine_path"] == str(clean.file(QUARANTINE_FILE))
    assert len(read_table(Path(report["quarantine_path"]))) == report["rows_quarantined"]


def test_data_report_uses_AIENG_HOME(
    built_demo: BuiltHome, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIENG_HOME", str(built_demo.home))
    code, out, _ = run(capsys, "data", "report", "--partition", "2026-01-01", "--json")
    assert code == 0 and json.loads(out)["rows_quarantined"] == sum(EXPECTED_DIRTY["day1"].values())


def test_data_report_human_output(built_demo: BuiltHome, capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(capsys, "--home", str(built_demo.home), "data", "report", "--partition", "2026-01-02")
    assert code == 0 and err == ""
    clean = built_demo.clean["2026-01-02"]
    assert f"partition 2026-01-02 (clean_documents {clean.id})" in out
    lines = [line.split() for line in out.splitlines()]
    assert ["rows", "in", str(clean.metrics["rows_in"])] in lines
    assert ["rows", "clean", str(clean.metrics["rows_clean"])] in lines
    assert ["rows", "quarantined", str(clean.metrics["rows_quarantined"])] in lines
    for reason, count in EXPECTED_DIRTY["day2"].items():
        assert [reason, str(count)] in lines
    assert "too_long" not in out and "undecodable" not in out  # zero counts are not listed


def test_data_report_for_an_unmaterialized_partition(capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(capsys, "data", "report", "--partition", "2026-02-01", "--json")
    assert code == 1 and out == ""
    assert_one_line_error(err)
    assert "clean_documents" in err and "2026-02-01" in err


def test_data_report_for_a_bad_partition_key(capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(capsys, "data", "report", "--partition", "yesterday", "--json")
    assert code == 1 and out == ""
    assert_one_line_error(err)
    assert "YYYY-MM-DD" in err


def test_bad_config_is_a_one_line_error(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("data:\n  min_chars: -5\n")
    code, out, err = run(capsys, "--config", str(config), "demo-data")
    assert code == 1 and out == ""
    assert_one_line_error(err)
    assert "data.min_chars" in err and str(config.resolve()) in err
    assert not (Path(os.environ["AIENG_HOME"]) / "raw").exists()


def test_demo_data_lands_three_days(capsys: pytest.CaptureFixture) -> None:
    home = Path(os.environ["AIENG_HOME"])
    code, out, err = run(capsys, "demo-data", "--json")
    assert code == 0 and err == ""
    result = json.loads(out)
    assert result["partitions"] == DEMO_PARTITIONS
    assert result["home"] == str(home.resolve())
    assert sorted(p.name for p in (home / "raw").iterdir()) == DEMO_PARTITIONS
    assert sorted(Path(f).relative_to(home / "raw").as_posix() for f in result["files"]) == [
        "2026-01-01/documents.jsonl",
        "2026-01-02/documents.csv",
        "2026-01-02/legacy_gbk.csv",
        "2026-01-03/documents.parquet",
        "2026-01-03/extra.jsonl.gz",
    ]
    assert all(Path(f).is_file() and Path(f).stat().st_size > 0 for f in result["files"])
    # Landing again without --overwrite refuses, with one line, and changes nothing.
    before = {f: Path(f).read_bytes() for f in result["files"]}
    code, out, err = run(capsys, "demo-data")
    assert code == 1 and out == ""
    assert_one_line_error(err)
    assert "overwrite" in err
    assert {f: Path(f).read_bytes() for f in result["files"]} == before


def test_demo_data_human_output_and_options(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    home = tmp_path / "other-home"
    code, out, _ = run(capsys, "--home", str(home), "demo-data", "--start", "2026-03-01", "--days", "4")
    assert code == 0
    assert sorted(p.name for p in (home / "raw").iterdir()) == ["2026-03-01", "2026-03-02", "2026-03-03", "2026-03-04"]
    assert "partitions: 2026-03-01...2026-03-04" in out
    with pytest.raises(SystemExit) as info:
        main(["demo-data", "--days", "0"])
    assert info.value.code == 2
