"""configs/dagster-postgres.yaml against a real PostgreSQL server: the data half of the graph
materialized over a partition range by `dagster asset materialize`, its runs and
materializations read back from Postgres, and the same artifacts as on the SQLite instance."""

from __future__ import annotations

import json
import resource
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.cli_helpers import (
    AIENG,
    DATA_HALF,
    PARTITION_RANGE,
    PARTITIONS,
    REPO_ROOT,
    Env,
    artifact_snapshot,
    make_env,
)
from tests.e2e.postgres_server import MISSING_BINARIES, PostgresServer, postgres_bin_dir, running_postgres

pytestmark = pytest.mark.e2e

PARTITIONED = ["raw_documents", "clean_documents", "tokenized_documents"]
UNPARTITIONED = ["bpe_tokenizer", "dataset_manifest"]
SQLITE_SUFFIXES = {".db", ".sqlite", ".sqlite3"}


@dataclass
class Build:
    env: Env
    returncode: int
    output: str
    wall_s: float
    cpu_s: float  # of the `dagster` process: steadier than wall time on a busy machine
    server_cpu_s: float = 0.0  # of the PostgreSQL server meanwhile (none for SQLite)


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    if postgres_bin_dir() is None:
        pytest.fail(MISSING_BINARIES, pytrace=False)  # a failure, not a skip: CI must have them
    started = time.monotonic()
    with running_postgres() as server:
        print(f"\nPostgreSQL server up in {time.monotonic() - started:.1f} s")
        yield server


def materialize_data_half(env: Env) -> Build:
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    result = env.materialize("--select", DATA_HALF, "--partition-range", PARTITION_RANGE)
    wall_s = time.monotonic() - started
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = cpu_after.ru_utime - cpu_before.ru_utime + cpu_after.ru_stime - cpu_before.ru_stime
    return Build(env, result.returncode, result.stdout + result.stderr, wall_s, cpu_s)


@pytest.fixture(scope="module")
def builds(postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Build]:
    on_postgres = make_env(tmp_path_factory.mktemp("postgres-instance"))
    dagster_home = Path(on_postgres.vars["DAGSTER_HOME"])
    shutil.copy(REPO_ROOT / "configs" / "dagster-postgres.yaml", dagster_home / "dagster.yaml")
    on_postgres.vars.update(postgres.dagster_env())
    on_sqlite = make_env(tmp_path_factory.mktemp("sqlite-instance"))
    landed = on_postgres.run_ok(AIENG, "demo-data", "--json")
    assert json.loads(landed.stdout)["partitions"] == PARTITIONS
    shutil.copytree(on_postgres.home / "raw", on_sqlite.home / "raw")  # the same bytes, one process fewer
    server_cpu_before = postgres.cpu_seconds()
    on_postgres_build = materialize_data_half(on_postgres)
    on_postgres_build.server_cpu_s = postgres.cpu_seconds() - server_cpu_before
    results = {"postgres": on_postgres_build, "sqlite": materialize_data_half(on_sqlite)}
    print(
        f"\ndata half, {PARTITION_RANGE}, one `dagster asset materialize`: "
        f"Postgres instance {results['postgres'].wall_s:.1f} s wall, {results['postgres'].cpu_s:.1f} s CPU "
        f"(+ {results['postgres'].server_cpu_s:.1f} s CPU in the PostgreSQL server); "
        f"SQLite instance {results['sqlite'].wall_s:.1f} s wall, {results['sqlite'].cpu_s:.1f} s CPU"
    )
    return results


def sqlite_files(dagster_home: Path) -> list[Path]:
    return sorted(path for path in dagster_home.rglob("*") if path.suffix in SQLITE_SUFFIXES)


def test_both_instances_materialize_the_range(builds: dict[str, Build]) -> None:
    for name, result in builds.items():
        assert result.returncode == 0, f"{name}: {result.output[-6000:]}"
        for partition in PARTITIONS:
            assert f"clean_documents {partition}: wrote" in result.output, name


def test_runs_and_materializations_are_in_postgres(builds: dict[str, Build], postgres: PostgresServer) -> None:
    assert builds["postgres"].returncode == 0, builds["postgres"].output[-6000:]
    connection = postgres.connect()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT status FROM runs")
            runs = [status for (status,) in cursor.fetchall()]
            cursor.execute(
                "SELECT asset_key, partition FROM event_logs WHERE dagster_event_type = 'ASSET_MATERIALIZATION'"
            )
            materializations = Counter((json.loads(key)[0], partition) for key, partition in cursor.fetchall())
    finally:
        connection.close()
    # One run for the whole range (every selected asset has BackfillPolicy.single_run()).
    assert runs == ["SUCCESS"]
    expected = {(kind, partition): 1 for kind in PARTITIONED for partition in PARTITIONS}
    expected.update({(kind, None): 1 for kind in UNPARTITIONED})
    assert dict(materializations) == expected


def test_postgres_instance_writes_no_sqlite_files(builds: dict[str, Build]) -> None:
    on_postgres, on_sqlite = builds["postgres"], builds["sqlite"]
    assert on_postgres.returncode == 0 and on_sqlite.returncode == 0
    assert sqlite_files(Path(on_postgres.env.vars["DAGSTER_HOME"])) == []
    # The same check finds the default instance's databases: it is not blind.
    assert sqlite_files(Path(on_sqlite.env.vars["DAGSTER_HOME"])) != []


def test_postgres_and_sqlite_instances_build_the_same_artifacts(builds: dict[str, Build]) -> None:
    on_postgres, on_sqlite = builds["postgres"], builds["sqlite"]
    assert on_postgres.returncode == 0 and on_sqlite.returncode == 0
    # Artifact ids come from recipes (inputs, config, code version): the instance is no input.
    postgres_ids, sqlite_ids = set(artifact_snapshot(on_postgres.env.home)), set(artifact_snapshot(on_sqlite.env.home))
    assert len(postgres_ids) == len(PARTITIONED) * len(PARTITIONS) + len(UNPARTITIONED)
    assert postgres_ids == sqlite_ids
    assert (
        on_postgres.env.store.require_current("dataset_manifest").content_sha256
        == on_sqlite.env.store.require_current("dataset_manifest").content_sha256
    )
