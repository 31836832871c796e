"""Every hostile case landed into one partition and pushed through the real `dagster asset
materialize` as a subprocess: no crash, the blocking row check passes, each landed file ends
exactly as its case says, and the run's peak resident memory stays bounded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.e2e.cli_helpers import make_env
from tests.hostile.generator import IGNORED_ENTRIES, Case, hostile_cases, land_cases, odd_name_case

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DAGSTER = str(BIN / "dagster")
PARTITION = "2026-01-01"
TIMEOUT_S = 600
# Runs the command as its child and writes the child's own peak RSS (KiB), then exits as it did.
MEASURE_PEAK_RSS = (
    "import os, subprocess, sys\n"
    "child = subprocess.Popen(sys.argv[2:])\n"
    "_, status, usage = os.wait4(child.pid, 0)\n"
    "open(sys.argv[1], 'w').write(str(usage.ru_maxrss))\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)
# Measured 485 MiB (torch and dagster imported); the readers before issue 6 took 1,098 MiB on a subset.
PEAK_RSS_LIMIT = 1 << 30  # bytes
CASES = hostile_cases()


@dataclass
class Run:
    home: Path
    returncode: int
    timed_out: bool
    output: str = field(repr=False)
    peak_rss: int  # bytes
    clean: list[dict] = field(repr=False)
    quarantine: list[dict] = field(repr=False)
    metrics: dict = field(repr=False)
    raw_manifest: dict = field(repr=False)


def _current_artifact(home: Path, kind: str) -> Path:
    ref = json.loads((home / "refs" / kind / f"{PARTITION}.json").read_text())
    return home / "artifacts" / kind / ref["id"]


def _materialize(root: Path) -> Run:
    environment = make_env(root)
    home, env = environment.home, environment.vars
    land_cases(home, PARTITION, CASES, extras=True)
    log = root / "materialize.log"
    command = [
        DAGSTER,
        "asset",
        "materialize",
        "-m",
        "orchestration.definitions",
        "--select",
        "raw_documents,clean_documents",
        "--partition",
        PARTITION,
    ]
    # The peak is measured by a small stdlib-only process between us and dagster: Linux
    # carries the forking process's peak RSS into the child's ru_maxrss, so waiting on dagster
    # directly would report this (large, test-suite-sized) process's peak instead of its own.
    peak_file = root / "peak_rss_kib"
    command = [sys.executable, "-S", "-c", MEASURE_PEAK_RSS, str(peak_file), *command]
    timed_out = threading.Event()
    with open(log, "wb") as out:
        # Output to a file, not a pipe, so nothing needs draining and os.wait4 can reap the
        # child itself and return its resource usage. Its own session, so a timeout kills
        # every process it started.
        process = subprocess.Popen(
            command, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )

        def kill() -> None:
            timed_out.set()
            os.killpg(process.pid, signal.SIGKILL)

        timer = threading.Timer(TIMEOUT_S, kill)
        timer.start()
        try:
            _, status, _ = os.wait4(process.pid, 0)
        finally:
            timer.cancel()
        process.returncode = os.waitstatus_to_exitcode(status)
    output = log.read_text(encoding="utf-8", errors="replace")
    clean = quarantine = []
    metrics = raw_manifest = {}
    if process.returncode == 0:
        artifact = _current_artifact(home, "clean_documents")
        clean = pq.read_table(artifact / "clean.parquet").to_pylist()
        quarantine = pq.read_table(artifact / "quarantine.parquet").to_pylist()
        metrics = json.loads((artifact / "manifest.json").read_text())["metrics"]
        raw_manifest = json.loads((_current_artifact(home, "raw_documents") / "manifest.json").read_text())
    return Run(
        home,
        process.returncode,
        timed_out.is_set(),
        output,
        int(peak_file.read_text()) * 1024 if peak_file.exists() else 0,
        clean,
        quarantine,
        metrics,
        raw_manifest,
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    result = _materialize(tmp_path_factory.mktemp("hostile").resolve())
    landed = sum(case.landed_bytes for case in CASES)
    rows = len(result.clean) + len(result.quarantine)
    print(
        f"\nhostile e2e: {len(CASES)} kinds (+1 odd-named file), {landed:,} landed bytes, "
        f"{rows:,} rows ({len(result.clean):,} clean, {len(result.quarantine):,} quarantined), "
        f"peak RSS {result.peak_rss / (1 << 20):,.0f} MiB, exit {result.returncode}"
    )
    return result


def _succeeded(run: Run) -> None:
    """Later checks need a finished run; test_materialize_succeeds_with_no_crash shows why not."""
    if run.timed_out or run.returncode != 0:
        pytest.fail(f"materialize did not succeed (exit {run.returncode}, timed out: {run.timed_out})", pytrace=False)


def test_materialize_succeeds_with_no_crash(run: Run) -> None:
    assert not run.timed_out, f"dagster ran past {TIMEOUT_S} s\n{run.output[-6000:]}"
    assert run.returncode == 0, run.output[-6000:]
    assert "RUN_SUCCESS" in run.output
    for bad in ("STEP_FAILURE", "RUN_FAILURE", "ENGINE_EVENT - Process for run exited"):
        assert bad not in run.output
    assert "Asset check 'raw_snapshot_intact' on 'raw_documents' passed." in run.output
    assert "Asset check 'rows_accounted_for' on 'clean_documents' passed." in run.output


def test_every_row_is_accounted_for(run: Run) -> None:
    _succeeded(run)
    odd = odd_name_case()
    total = sum(case.expected_records for case in CASES) + odd.expected_records
    rows_clean, rows_quarantined = len(run.clean), len(run.quarantine)
    assert rows_clean + rows_quarantined == total, f"{rows_clean} clean + {rows_quarantined} quarantined"
    assert run.metrics["rows_in"] == total
    assert run.metrics["rows_clean"] == len(run.clean)
    assert run.metrics["rows_quarantined"] == len(run.quarantine)
    assert run.metrics["rows_expected"] == total
    # No (file, line) is both clean and quarantined, and no clean row is written twice.
    clean_pairs = {(row["source_file"], row["line"]) for row in run.clean}
    assert len(clean_pairs) == len(run.clean)
    assert clean_pairs.isdisjoint((row["source_file"], row["line"]) for row in run.quarantine)


def _by_file(rows: list[dict]) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        grouped[row["source_file"]].append(row)
    return grouped


@pytest.mark.parametrize("case", CASES, ids=[case.kind for case in CASES])
def test_each_landed_file_ends_as_its_case_says(run: Run, case: Case) -> None:
    _succeeded(run)
    clean, quarantine = _by_file(run.clean), _by_file(run.quarantine)
    reasons = Counter(row["reason"] for name in case.files for row in quarantine.get(name, []))
    texts = {row["id"]: row["text"] for name in case.files for row in clean.get(name, [])}
    assert dict(reasons) == case.expected_reasons, case.note
    assert texts == case.expected_clean, case.note
    assert sum(len(clean.get(n, [])) + len(quarantine.get(n, [])) for n in case.files) == case.expected_records
    if case.quarantine_lines is not None:
        got = sorted(
            (row["source_file"], row["line"], row["reason"]) for name in case.files for row in quarantine.get(name, [])
        )
        assert got == list(case.quarantine_lines)


def test_per_file_counts_in_the_metrics(run: Run) -> None:
    """clean_documents' metrics carry each file's independent count and the rows read."""
    _succeeded(run)
    files = {entry["name"]: entry for entry in run.metrics["files"]}
    wrong = {}
    for case in CASES:
        counted = {name: files.get(name) for name in case.files}
        if (
            any(entry is None or entry["expected"] != entry["read"] for entry in counted.values())
            or sum(entry["expected"] for entry in counted.values()) != case.expected_records
        ):
            wrong[case.kind] = (case.expected_records, counted)
    assert wrong == {}
    assert len(files) == sum(len(case.files) for case in CASES) + 1  # the odd-named file too


def test_odd_file_name_is_snapshotted_and_read(run: Run) -> None:
    _succeeded(run)
    odd = odd_name_case()
    known = {name for case in CASES for name in case.files}
    names = {row["source_file"] for row in run.clean + run.quarantine} - known
    assert len(names) == 1, names
    (name,) = names
    name.encode("utf-8")  # stored as valid text
    assert name.endswith(".jsonl")
    rows = [row for row in run.clean if row["source_file"] == name]
    assert {row["id"]: row["text"] for row in rows} == odd.expected_clean
    assert [row for row in run.quarantine if row["source_file"] == name] == []


def test_skipped_entries_are_listed_and_never_read(run: Run) -> None:
    _succeeded(run)
    ignored = set(run.raw_manifest.get("ignored_files", []))
    assert set(IGNORED_ENTRIES) <= ignored
    sources = {row["source_file"] for row in run.clean + run.quarantine}
    assert sources.isdisjoint(IGNORED_ENTRIES)
    ids = {row["id"] for row in run.clean}
    assert {"hidden-1", "inner-1"}.isdisjoint(ids)


def test_peak_memory_is_bounded(run: Run) -> None:
    _succeeded(run)
    print(
        f"\npeak RSS of `dagster asset materialize`: {run.peak_rss / (1 << 20):,.0f} MiB (limit "
        f"{PEAK_RSS_LIMIT / (1 << 20):,.0f} MiB)"
    )
    assert 0 < run.peak_rss < PEAK_RSS_LIMIT
