"""AIENG_EXECUTOR=celery with configs/dagster-celery.yaml, run for real: Debian's redis-server as
broker and result backend, two `dagster-celery worker start` workers, the data half of the graph
for a partition range.

- Steps ran in both workers (each step's engine event names the worker that ran it), and the
  artifacts are the ones an in-process run builds (same ids).
- A worker's pool process killed mid-step (SIGKILL, as the OOM killer does) with a complete
  staging directory of a tokenized_documents artifact: the run fails naming that step, nothing
  staged is visible (no id listed, every ref still names the previous artifact), and a re-run on
  the restarted pool completes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest

from aieng_core.store.verify import find_staging, verify_store
from tests.e2e.celery_cluster import (
    CELERY_RUN_CONFIG,
    MISSING_REDIS,
    CeleryWorker,
    running_redis,
    running_workers,
)
from tests.e2e.cli_helpers import (
    AIENG,
    DAGSTER,
    DATA_HALF,
    PARTITION_RANGE,
    PARTITIONS,
    REPO_ROOT,
    TIMEOUT_S,
    Env,
    make_env,
)

pytestmark = pytest.mark.e2e

WORKERS = ["worker1", "worker2"]
KILLED_STEP = "tokenized_documents"
PAUSE_POINT = f"artifact.staged:{KILLED_STEP}"  # aieng_core/faults.py: its staging complete, not yet renamed
DATA_KINDS = ["raw_documents", "clean_documents", "bpe_tokenizer", "tokenized_documents", "dataset_manifest"]


@dataclass
class Build:
    returncode: int
    output: str
    wall_s: float


@dataclass
class Kill:
    pid: int
    worker: str
    staged: list[Path]
    listed_while_held: dict[str, list[str]]
    refs_while_held: dict[str, str | None]
    build: Build


@dataclass
class Cluster:
    in_process: Env
    on_celery: Env
    builds: dict[str, Build]
    kill: Kill
    figures: dict[str, float | int | str]


def materialize(env: Env, *extra: str) -> Build:
    started = time.monotonic()
    result = env.materialize("--select", DATA_HALF, "--partition-range", PARTITION_RANGE, *extra)
    return Build(result.returncode, result.stdout + result.stderr, time.monotonic() - started)


def artifact_ids(home: Path) -> set[str]:
    """kind/id of every artifact directory on disk; a staging directory (a dot name) is none."""
    manifests = (home / "artifacts").glob("*/*/manifest.json")
    return {
        path.parent.relative_to(home / "artifacts").as_posix()
        for path in manifests
        if not path.parent.name.startswith(".")
    }


def instance_of(env: Env) -> dg.DagsterInstance:
    return dg.DagsterInstance.from_config(env.vars["DAGSTER_HOME"])


def runs_oldest_first(env: Env) -> list[dg.DagsterRun]:
    with instance_of(env) as instance:
        return list(reversed(instance.get_runs()))


def steps_by_worker(env: Env, run_id: str) -> dict[str, str]:
    """step key -> the Celery worker node that ran it, from the engine event each task reports
    before it runs its step."""
    ran: dict[str, str] = {}
    with instance_of(env) as instance:
        for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
            event = entry.dagster_event
            if event is None or "in celery worker" not in (event.message or ""):
                continue
            assert event.step_key not in ran, f"{event.step_key} was sent to a worker twice"
            ran[str(event.step_key)] = str(event.engine_event_data.metadata["Celery worker"].value)
    return ran


def succeeded_steps(env: Env, run_id: str) -> set[str]:
    with instance_of(env) as instance:
        return {
            str(entry.dagster_event.step_key)
            for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_SUCCESS)
            if entry.dagster_event is not None
        }


def wait_for_hold(release: Path, killed_run: subprocess.Popen[str], log: Path) -> int:
    """The pid of the pool process held at PAUSE_POINT (aieng_core/faults.py names a file for it)."""
    deadline = time.monotonic() + TIMEOUT_S
    while not (waiting := list(release.parent.glob(f"{release.name}.*.waiting"))):
        if killed_run.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"no step was held at {PAUSE_POINT}:\n{log.read_text()[-6000:]}")
        time.sleep(0.05)
    [held] = waiting
    return int(held.name.split(".")[-2])


def kill_mid_step(on_celery: Env, workers: list[CeleryWorker], release: Path, root: Path) -> Kill:
    """The first run on the workers, held at PAUSE_POINT and its pool process SIGKILLed there."""
    log = root / "killed-run.log"
    command = [DAGSTER, "asset", "materialize", "-m", "orchestration.definitions", "-c", str(CELERY_RUN_CONFIG)]
    command += ["--select", DATA_HALF, "--partition-range", PARTITION_RANGE]
    started = time.monotonic()
    with log.open("w") as sink:
        killed_run = subprocess.Popen(command, cwd=REPO_ROOT, env=on_celery.vars, stdout=sink, stderr=subprocess.STDOUT)
    try:
        pid = wait_for_hold(release, killed_run, log)
        [worker] = [worker.node for worker in workers if pid in worker.pool_pids()]
        store = on_celery.store
        # Held with a staging directory complete (files and manifest), not yet renamed.
        staged = find_staging(on_celery.home)
        listed = {kind: store.list_ids(kind) for kind in DATA_KINDS}
        refs = {partition: getattr(store.current(KILLED_STEP, partition), "id", None) for partition in PARTITIONS}
        os.kill(pid, signal.SIGKILL)
        killed_run.wait(timeout=TIMEOUT_S)
    finally:
        if killed_run.poll() is None:
            killed_run.kill()
            killed_run.wait()
    build = Build(killed_run.returncode, log.read_text(), time.monotonic() - started)
    return Kill(pid, worker, staged, listed, refs, build)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if shutil.which("redis-server") is None:
        pytest.fail(MISSING_REDIS, pytrace=False)  # a failure, not a skip: CI must have it
    root = tmp_path_factory.mktemp("celery")
    in_process, on_celery = make_env(root / "in-process"), make_env(root / "celery")
    landed = on_celery.run_ok(AIENG, "demo-data", "--json")
    assert json.loads(landed.stdout)["partitions"] == PARTITIONS
    shutil.copytree(on_celery.home / "raw", in_process.home / "raw")
    builds = {"in_process": materialize(in_process)}
    release = root / "release"  # absent: a step that reaches PAUSE_POINT is held there
    # The instance's SQLite storage is created before the two workers load it side by side: two
    # processes creating it at once can both stamp its schema (alembic: "more than one head").
    instance_of(on_celery).dispose()
    with running_redis(root / "redis") as redis:
        on_celery.vars.update(redis.celery_env(), AIENG_EXECUTOR="celery")
        armed = {**on_celery.vars, "AIENG_PAUSE_AT": PAUSE_POINT, "AIENG_PAUSE_FILE": str(release)}
        started = time.monotonic()
        with running_workers(WORKERS, armed, root) as workers:
            ready_s = time.monotonic() - started
            kill = kill_mid_step(on_celery, workers, release, root)
            release.touch()  # the pool process Celery started in the killed one's place passes the point at once
            builds["rerun"] = materialize(on_celery, "-c", str(CELERY_RUN_CONFIG))
    figures: dict[str, float | int | str] = {
        "workers_ready_s": round(ready_s, 1),
        "in_process_s": round(builds["in_process"].wall_s, 1),
        "killed_run_s": round(kill.build.wall_s, 1),
        "rerun_s": round(builds["rerun"].wall_s, 1),
        "killed_on": kill.worker,
    }
    print(f"\ncelery executor, data half {PARTITION_RANGE}: {json.dumps(figures)}")
    (root / "celery.json").write_text(json.dumps(figures, indent=2))
    yield Cluster(in_process, on_celery, builds, kill, figures)


def test_a_worker_killed_mid_step_fails_the_run_naming_the_step(cluster: Cluster) -> None:
    kill = cluster.kill
    assert kill.build.returncode != 0, kill.build.output[-6000:]
    assert f"[{KILLED_STEP}]: billiard.exceptions.WorkerLostError: Worker exited prematurely: signal 9 (SIGKILL)" in (
        kill.build.output
    )
    killed_run = runs_oldest_first(cluster.on_celery)[0]
    assert killed_run.status == dg.DagsterRunStatus.FAILURE
    succeeded = succeeded_steps(cluster.on_celery, killed_run.run_id)
    assert KILLED_STEP not in succeeded and {"raw_documents", "clean_documents", "bpe_tokenizer"} <= succeeded
    assert steps_by_worker(cluster.on_celery, killed_run.run_id)[KILLED_STEP] == kill.worker


def test_nothing_the_killed_step_staged_is_visible(cluster: Cluster) -> None:
    kill = cluster.kill
    [staged] = kill.staged
    assert staged.parent == cluster.on_celery.home / "artifacts" / KILLED_STEP and (staged / "manifest.json").is_file()
    # Complete on disk, yet in no view of the store: not listed, no partition's ref names it.
    assert kill.listed_while_held[KILLED_STEP] == [] and all(kill.listed_while_held[kind] for kind in DATA_KINDS[:3])
    assert kill.refs_while_held == dict.fromkeys(PARTITIONS)
    result = verify_store(cluster.on_celery.home)
    assert result["ok"] is True, result
    # The one stale entry is the dead step's staging, whose owner is gone (`aieng store verify --gc` takes it).
    assert [(entry["path"], entry["owner_alive"]) for entry in result["staging"]] == [(str(staged), False)]


def test_the_rerun_completes_on_both_workers(cluster: Cluster) -> None:
    rerun = cluster.builds["rerun"]
    assert rerun.returncode == 0, rerun.output[-6000:]
    last = runs_oldest_first(cluster.on_celery)[-1]
    assert last.status == dg.DagsterRunStatus.SUCCESS
    ran = steps_by_worker(cluster.on_celery, last.run_id)
    # Every step of the run (5 assets, 6 checks) went to a worker, and both workers took some:
    # two checks of bpe_tokenizer are ready at once, and a worker whose one process is busy
    # takes no second task (task_acks_late, prefetch 1).
    assert set(ran) == succeeded_steps(cluster.on_celery, last.run_id)
    assert len(ran) == 11
    assert set(ran.values()) == {f"{name}@{os.uname().nodename}" for name in WORKERS}, Counter(ran.values())


def test_celery_and_in_process_runs_build_the_same_artifacts(cluster: Cluster) -> None:
    assert cluster.builds["in_process"].returncode == 0, cluster.builds["in_process"].output[-6000:]
    assert cluster.builds["rerun"].returncode == 0
    in_process_ids = artifact_ids(cluster.in_process.home)
    assert len(in_process_ids) == 3 * len(PARTITIONS) + 2
    assert artifact_ids(cluster.on_celery.home) == in_process_ids
    store = cluster.on_celery.store
    for partition in PARTITIONS:
        assert store.verify(store.require_current(KILLED_STEP, partition)) == []
