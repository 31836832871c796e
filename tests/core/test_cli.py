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
from aieng_core.deploy.deployments import Deployments
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
    assert code == 2 and out == ""  # 2: a bad config, as for bad arguments
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


# ---- aieng bundle / serve / bench serving -----------------------------------------------------


def test_bundle_verify_ok_exits_zero(serving_bundle_artifact, capsys: pytest.CaptureFixture) -> None:
    bundle = serving_bundle_artifact.bundle
    code, out, err = run(capsys, "bundle", "verify", str(bundle.path), "--json")
    assert code == 0 and err == ""
    report = json.loads(out)
    assert (report["bundle_id"], report["ok"], report["problems"]) == (bundle.id, True, [])
    assert [g["ok"] for g in report["goldens"]] == [True] * 5  # 3 golden prompts, 2 golden conversations
    code, out, err = run(capsys, "bundle", "verify", str(bundle.path))
    assert code == 0 and err == ""
    assert out.splitlines()[0] == f"serving bundle {bundle.id} at {bundle.path}: OK"
    assert "  ok   'The data pipeline' -> " in out


def test_bundle_verify_names_the_changed_file(
    serving_bundle_artifact, copy_bundle, capsys: pytest.CaptureFixture
) -> None:
    path = copy_bundle(serving_bundle_artifact.bundle)
    weights = path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    code, out, err = run(capsys, "bundle", "verify", str(path))
    assert code == 1
    assert_one_line_error(err)
    assert err == f"aieng: error: {weights}: sha256 does not match the manifest\n"
    assert "FAILED" in out.splitlines()[0]
    code, out, err = run(capsys, "bundle", "verify", str(path), "--json")
    assert code == 1
    assert json.loads(out)["problems"] == [f"{weights}: sha256 does not match the manifest"]
    assert_one_line_error(err)


def test_bundle_verify_names_the_golden_prompt(
    serving_bundle_artifact, copy_bundle, capsys: pytest.CaptureFixture
) -> None:
    from aieng_core.bundle.serving_bundle import BUNDLE_FILES, GOLDEN_FILE, bundle_content_sha256
    from aieng_core.hashing import sha256_file

    path = copy_bundle(serving_bundle_artifact.bundle)
    doc = json.loads((path / GOLDEN_FILE).read_text(encoding="utf-8"))
    doc["outputs"][0]["token_ids"][-1] += 1
    (path / GOLDEN_FILE).write_text(json.dumps(doc), encoding="utf-8")
    manifest = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    manifest["files"][GOLDEN_FILE] = sha256_file(path / GOLDEN_FILE)
    manifest["content_sha256"] = bundle_content_sha256({n: manifest["files"][n] for n in BUNDLE_FILES})
    (path / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    code, out, err = run(capsys, "bundle", "verify", str(path))
    assert code == 1
    assert_one_line_error(err)
    assert err.startswith(f"aieng: error: {path / GOLDEN_FILE}: golden prompt 'The data pipeline' differs from token 7")
    assert "  DIFF 'The data pipeline' -> " in out


def test_bundle_verify_of_a_missing_directory(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    code, _, err = run(capsys, "bundle", "verify", str(tmp_path / "nope"))
    assert code == 1
    assert_one_line_error(err)
    assert "is not a serving bundle" in err


def test_bundle_build_reuses_and_current_prints_the_commands(
    serving_bundle_artifact, copy_bundled_home, capsys: pytest.CaptureFixture
) -> None:
    import shlex
    import sys

    home = copy_bundled_home(serving_bundle_artifact).home
    bundle = serving_bundle_artifact.bundle
    code, out, err = run(capsys, "--home", str(home), "bundle", "build", "--json")
    assert code == 0 and err == ""
    built = json.loads(out)
    assert (built["id"], built["reused"]) == (bundle.id, True)
    assert built["path"] == str(home / "artifacts" / "serving_bundle" / bundle.id)
    assert built["metrics"] == bundle.metrics

    code, out, err = run(capsys, "--home", str(home), "bundle", "current", "--json")
    assert code == 0 and err == ""
    current = json.loads(out)
    aieng = Path(sys.executable).parent / "aieng"
    executable = shlex.quote(str(aieng)) if aieng.is_file() else "aieng"
    assert current == {
        "id": bundle.id,
        "path": built["path"],
        "model_checkpoint_id": serving_bundle_artifact.model.id,
        "weights": "fp32",
        "source_bundle_id": None,
        "lineage": bundle.manifest["lineage"],
        "production_bundle_id": None,
        "serve_command": f"{executable} serve --bundle {built['path']}",
        "curl_command": (
            "curl -s http://127.0.0.1:8000/generate -H 'Content-Type: application/json' "
            """-d '{"prompt": "The data pipeline", "max_new_tokens": 32, "temperature": 0}'"""
        ),
        "lineage_command": f"{executable} lineage {bundle.id}",
    }
    code, out, _ = run(capsys, "--home", str(home), "bundle", "current", "--path")
    assert (code, out) == (0, built["path"] + "\n")
    code, out, _ = run(capsys, "--home", str(home), "bundle", "current")
    assert code == 0
    assert out.splitlines() == [
        f"serving_bundle {bundle.id} (model_checkpoint {serving_bundle_artifact.model.id})",
        f"  {built['path']}",
        "production serves nothing yet (`aieng deploy promote ID`, or materialize production_deployment)",
        "serve it:",
        f"  {current['serve_command']}",
        "then query it:",
        f"  {current['curl_command']}",
        "what it was made from:",
        f"  {current['lineage_command']}",
    ]
    # Once production serves it, it is served by following the pointer.
    Deployments(home).promote(bundle.id, verify=False)
    code, out, _ = run(capsys, "--home", str(home), "bundle", "current", "--json")
    deployed = json.loads(out)
    assert deployed["production_bundle_id"] == bundle.id
    assert deployed["serve_command"] == f"{executable} serve --deployment current"
    assert deployed["lineage_command"] == f"{executable} lineage current"


def test_bundle_current_without_a_bundle(capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(capsys, "bundle", "current")
    assert code == 1 and out == ""
    assert_one_line_error(err)
    assert "serving_bundle has not been materialized" in err


def test_bundle_build_without_a_model(capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(capsys, "bundle", "build")
    assert code == 1 and out == ""
    assert_one_line_error(err)
    assert "model_checkpoint has not been materialized" in err


def test_serve_hands_its_arguments_to_the_server(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import sys
    import types

    from tests.conftest import TINY_CONFIG

    calls = []
    fake = types.ModuleType("aieng_core.serving.http.server")
    fake.run_server = lambda **kwargs: calls.append(kwargs) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "aieng_core.serving.http.server", fake)
    assert run(capsys, "serve", "--bundle", str(tmp_path / "b"))[0] == 0
    code, _, _ = run(capsys, "serve", "--bundle", "x", "--host", "0.0.0.0", "--port", "9001", "--log-level", "debug")
    assert code == 0
    assert [(c["bundle_path"], c["host"], c["port"], c["log_level"]) for c in calls] == [
        (tmp_path / "b", "127.0.0.1", 8000, "info"),
        (Path("x"), "0.0.0.0", 9001, "debug"),
    ]
    assert calls[0]["config"].serving.max_waiting == 32  # the tiny config, from $AIENG_CONFIG
    assert str(TINY_CONFIG) == os.environ["AIENG_CONFIG"]
    with pytest.raises(SystemExit):
        main(["serve"])  # --bundle is required


def test_bench_serving_dispatches(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    calls = []
    fake = types.ModuleType("aieng_core.bench.serving_bench")
    fake.run_serving_bench = lambda **kwargs: calls.append(kwargs) or {"ok": 1}  # type: ignore[attr-defined]
    fake.format_serving_results = lambda results: f"formatted {results}"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "aieng_core.bench.serving_bench", fake)
    code, out, _ = run(capsys, "bench", "serving", "--out", "r.json", "--json")
    assert (code, json.loads(out)) == (0, {"ok": 1})
    code, out, _ = run(capsys, "bench", "serving", "--quick", "--rounds", "5")
    assert (code, out) == (0, "formatted {'ok': 1}\n")
    run(capsys, "bench", "serving", "--workload", "contention")
    assert calls == [
        {"out": "r.json", "config": None, "quick": False, "rounds": 3, "workload": "all"},
        {"out": None, "config": None, "quick": True, "rounds": 5, "workload": "all"},
        {"out": None, "config": None, "quick": False, "rounds": 3, "workload": "contention"},
    ]


def test_a_reader_that_stops_reading_gets_no_traceback(tmp_path: Path) -> None:
    """`aieng deploy status | head -3`: the pipe is closed before aieng writes (the read end is
    closed before it starts), so its first write fails with EPIPE: it exits as SIGPIPE would,
    quietly, with nothing on stderr."""
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "aieng_core.cli", "--home", str(tmp_path), "deploy", "status"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (141, "")


@pytest.mark.parametrize(
    "argv",
    [
        ["deploy", "status", "--pointer", "gate-reports"],
        ["deploy", "promote", "abc", "--pointer", "gate-reports"],
        ["serve", "--deployment", "current", "--pointer", "gate-reports"],
    ],
    ids=["status", "promote", "serve"],
)
def test_the_gate_reports_folder_is_no_pointer(capsys: pytest.CaptureFixture, tmp_path: Path, argv: list[str]) -> None:
    """Pointers share $AIENG_HOME/deployments/ with the gate's reports: that name is refused,
    and nothing is written there."""
    code, out, err = run(capsys, "--home", str(tmp_path), *argv)
    assert (code, out) == (1, "")
    assert err == (
        "aieng: error: deployment pointer 'gate-reports' is reserved: $AIENG_HOME/deployments/gate-reports/ holds "
        "the gate's reports; choose another name\n"
    )
    assert not (tmp_path / "deployments").exists()
