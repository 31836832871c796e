"""The data half of the pipeline through real processes: `aieng` and `dagster` CLIs against a
temporary AIENG_HOME and DAGSTER_HOME, as an operator runs it without the UI or a daemon."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from aieng_core.data.demo_data import EXPECTED_DIRTY, GBK_CSV_TEXTS, land_demo_data
from aieng_core.data.reasons import ALL_REASONS
from tests.e2e.cli_helpers import AIENG, DATA_HALF, PARTITION_RANGE, PARTITIONS, Env, artifact_snapshot, make_env

pytestmark = pytest.mark.e2e

ASSET_KINDS = ["raw_documents", "clean_documents", "bpe_tokenizer", "tokenized_documents", "dataset_manifest"]
DAY2_DOCS = "from aieng_core.data.demo_data import day_documents; print(len(day_documents(1)))"


def build(root: Path) -> tuple[Env, subprocess.CompletedProcess[str]]:
    env = make_env(root)
    landed = env.run_ok(AIENG, "demo-data", "--json")
    assert json.loads(landed.stdout)["partitions"] == PARTITIONS
    return env, env.materialize("--select", DATA_HALF, "--partition-range", PARTITION_RANGE)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> tuple[Env, subprocess.CompletedProcess[str]]:
    return build(tmp_path_factory.mktemp("first"))


def test_range_materialize_builds_every_asset(pipeline: tuple[Env, subprocess.CompletedProcess[str]]) -> None:
    env, result = pipeline
    assert result.returncode == 0, result.stderr[-6000:]
    store = env.store
    for kind in ("raw_documents", "clean_documents", "tokenized_documents"):
        assert store.current_partitions(kind) == PARTITIONS
        for partition in PARTITIONS:
            assert store.verify(store.require_current(kind, partition)) == []
    for kind in ("bpe_tokenizer", "dataset_manifest"):
        assert store.verify(store.require_current(kind)) == []
    assert store.require_current("bpe_tokenizer").metrics["training_partitions"] == PARTITIONS
    assert store.require_current("dataset_manifest").metrics["partitions"] == 3
    output = result.stdout + result.stderr
    for partition in PARTITIONS:
        assert f"clean_documents {partition}: wrote" in output
    # The instance under DAGSTER_HOME recorded the run.
    assert any((Path(env.vars["DAGSTER_HOME"]) / "history").rglob("*.db"))


def test_data_report_json_has_the_exact_counts(pipeline: tuple[Env, subprocess.CompletedProcess[str]]) -> None:
    env, result = pipeline
    assert result.returncode == 0
    report = json.loads(env.run_ok(AIENG, "data", "report", "--partition", "2026-01-02", "--json").stdout)
    dirty = EXPECTED_DIRTY["day2"]
    # Day 2 is every corpus document of its slice plus the GBK CSV's texts. The slice is
    # counted in a fresh interpreter, like the one `aieng demo-data` ran in (see
    # test_cli_demo_data_equals_library_demo_data for why not in this process).
    rows_clean = int(env.run_ok(sys.executable, "-c", DAY2_DOCS).stdout) + len(GBK_CSV_TEXTS)
    assert report["rows_clean"] == rows_clean
    assert report["rows_quarantined"] == sum(dirty.values()) == 7
    assert report["rows_in"] == rows_clean + 7
    assert report["reasons"] == {reason: dirty.get(reason, 0) for reason in ALL_REASONS}
    clean = env.store.require_current("clean_documents", "2026-01-02")
    assert report["artifact_id"] == clean.id
    quarantine = Path(report["quarantine_path"])
    assert quarantine == clean.path / "quarantine.parquet"
    assert pq.ParquetFile(quarantine).metadata.num_rows == report["rows_quarantined"]
    reasons = pq.read_table(quarantine, columns=["reason"]).column("reason").to_pylist()
    assert {reason: reasons.count(reason) for reason in set(reasons)} == dirty


def test_rematerializing_reuses_every_artifact(pipeline: tuple[Env, subprocess.CompletedProcess[str]]) -> None:
    env, result = pipeline
    assert result.returncode == 0
    before = artifact_snapshot(env.home)
    assert {key.split("/")[0] for key in before} == set(ASSET_KINDS)
    dataset_before = env.store.require_current("dataset_manifest").content_sha256

    again = env.materialize("--select", DATA_HALF, "--partition-range", PARTITION_RANGE)
    assert again.returncode == 0, again.stderr[-6000:]
    assert artifact_snapshot(env.home) == before  # same ids, and not one manifest rewritten
    assert env.store.require_current("dataset_manifest").content_sha256 == dataset_before
    output = again.stdout + again.stderr
    for kind in ("raw_documents", "clean_documents", "tokenized_documents"):
        for partition in PARTITIONS:
            assert f"{kind} {partition}: reused" in output
    assert "bpe_tokenizer: reused" in output
    assert ": wrote " not in output and "bpe_tokenizer: trained" not in output


def test_fresh_home_elsewhere_gives_the_same_dataset_version(
    pipeline: tuple[Env, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    env, result = pipeline
    assert result.returncode == 0
    other, other_result = build(tmp_path / "a" / "different" / "place")
    assert other_result.returncode == 0, other_result.stderr[-6000:]
    assert other.home != env.home
    first = env.store.require_current("dataset_manifest")
    second = other.store.require_current("dataset_manifest")
    assert second.content_sha256 == first.content_sha256
    # Ids come from recipes (inputs, config, code version), never from paths or times.
    assert set(artifact_snapshot(other.home)) == set(artifact_snapshot(env.home))
    assert (
        other.store.require_current("bpe_tokenizer").content_sha256
        == env.store.require_current("bpe_tokenizer").content_sha256
    )


def test_missing_partition_folder_fails_naming_it(pipeline: tuple[Env, subprocess.CompletedProcess[str]]) -> None:
    env, result = pipeline
    assert result.returncode == 0
    before = artifact_snapshot(env.home)
    failed = env.materialize("--select", DATA_HALF, "--partition", "2026-01-09")
    assert failed.returncode != 0
    output = failed.stdout + failed.stderr
    assert str(env.home / "raw" / "2026-01-09") in output
    assert "does not exist" in output
    assert artifact_snapshot(env.home) == before
    assert env.store.current("raw_documents", "2026-01-09") is None


def test_cli_demo_data_equals_library_demo_data(tmp_path: Path) -> None:
    """`aieng demo-data` and `land_demo_data()` called in a process that has loaded the code
    location (this one, once it imports orchestration.definitions) must land the same bytes.

    demo_data.py promises byte-identical files for a given Python version, so the data version
    never drifts. Its corpus reads docstrings of the objects the stdlib modules hold *in the
    calling process*, and other code replaces some of them: pytest replaces
    `threading.excepthook` while a test runs, and importing torch (which the code location does,
    for model_checkpoint) replaces `inspect.getfile` with `torch.package`'s own. Either one
    drops a document from the corpus and shifts the day slices.
    """
    import orchestration.definitions  # noqa: F401  # what a Dagster run process has loaded
    from aieng_core.data import demo_data

    cli = make_env(tmp_path / "cli")
    cli.run_ok(AIENG, "demo-data")
    library_home = tmp_path / "library"
    demo_data.corpus.cache_clear()  # built now, in this process's current state
    land_demo_data(library_home)

    def landed(home: Path) -> dict[str, str]:
        return {
            path.relative_to(home).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted((home / "raw").rglob("*"))
            if path.is_file()
        }

    from_cli, from_library = landed(cli.home), landed(library_home)
    assert set(from_cli) == set(from_library)
    differing = sorted(name for name in from_cli if from_cli[name] != from_library[name])
    assert differing == [], (
        f"demo data landed by `aieng demo-data` and by the library in this process differ in {differing}"
    )
