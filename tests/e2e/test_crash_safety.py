"""Crash safety of the pipeline, through real `dagster asset materialize` processes.

The kill chain: the graph (raw_documents ... serving_bundle, two partitions) is materialized
again and again on one AIENG_HOME, each run SIGKILLed by itself at the next named crash point
(aieng_core/faults.py), in graph order: inside writes, between an artifact and its ref, during
training checkpoints, while the bundle is built. Each run re-runs the asset the run before it
was killed in, and on down the graph, so every re-run has to pick up what a killed run left
(stale staging is not collected between runs). After each kill: the process died by SIGKILL (a
point never reached fails the test), and nothing half-written is visible: every artifact
verifies and every ref resolves, so `aieng store verify` finds no damage. Then one uninterrupted
run completes, `aieng store verify --gc` collects every kill's leftovers, and the ids and
content hashes must equal those of an uninterrupted run in a home of its own (run concurrently,
to save wall time).

Promotion is killed through `aieng deploy promote` (between the history line and the pointer
write, and with the pointer's temporary file written but not renamed), not through the
production_deployment gate: one gate materialization takes about 30 s here (verify 5 s, warmup
1 s, stress 8 s, drill 9 s, plus start-up), so every kill inside it would cost that again; its
promote is the same Deployments.promote.

Racing: two `dagster asset materialize` processes build the same partition on one home, both
held (AIENG_PAUSE_AT) with their staging complete until both are there, so they overlap for
certain; one wins the rename, the other reuses its artifact.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from aieng_core.hashing import sha256_file
from aieng_core.store import ArtifactStore
from aieng_core.store.verify import find_staging, verify_store
from tests.graph import ASSET_GRAPH

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
AIENG = str(BIN / "aieng")
DAGSTER = str(BIN / "dagster")
PARTITIONS = ["2026-01-01", "2026-01-02"]
PARTITION_RANGE = f"{PARTITIONS[0]}...{PARTITIONS[-1]}"
# Everything up to the bundle; production_deployment (the gate) is left out, see above.
SELECTION = "*serving_bundle"
RUN_TIMEOUT_S = 300
# tiny.yaml (150 training steps, a checkpoint every 50) with the lightest benchmark, and
# max_minutes and max_seconds so long that a loaded machine never stops a run early (an early
# stop publishes under another id, and the ids are what is compared).
OVERRIDES: dict[str, dict[str, Any]] = {
    "training": {"max_minutes": 60},
    "benchmark": {
        "batch_sizes": [1],
        "concurrencies": [1],
        "requests_per_level": 2,
        "compare_transformers": False,
        "max_seconds": 3600,
    },
}
# The graph in order, without production_deployment: promotion is killed through `aieng deploy promote`.
ASSETS = ASSET_GRAPH[:-1]


@dataclass(frozen=True)
class KillPoint:
    point: str  # AIENG_CRASH_AT: NAME or NAME@N (the N-th time the run reaches NAME)
    asset: str  # the asset being written when it fires
    moment: str
    staging: int = 0  # staging entries it leaves (killed inside a write); its writer is dead
    unreferenced: bool = False  # killed between an artifact and its ref: one new artifact no ref names


# In graph order. Which partition a point hits follows from what the runs before it finished (a
# re-run reuses those artifacts and writes only their refs).
CHAIN = [
    KillPoint("raw_documents.file_copied@2", "raw_documents", "2026-01-02 staged: 1 of its 2 files copied", 1),
    KillPoint("atomic_dir.synced", "raw_documents", "staging fsynced, before the rename", 1),
    KillPoint("artifact.published:raw_documents", "raw_documents", "renamed into place, ref not written", 0, True),
    KillPoint("atomic_file.synced@3", "clean_documents", "2026-01-01 published; ref temp fsynced, not renamed", 1),
    KillPoint("clean_documents.batch_written", "clean_documents", "2026-01-02 Parquet half written", 1),
    # Renamed, its lock file not yet removed: the one staging entry left (a lock file, collected by --gc).
    KillPoint("atomic_dir.renamed", "clean_documents", "renamed, parent not fsynced, ref not written", 1, True),
    KillPoint("artifact.staged:bpe_tokenizer", "bpe_tokenizer", "tokenizer files staged, before the rename", 1),
    KillPoint("artifact.published:bpe_tokenizer", "bpe_tokenizer", "renamed into place, ref not written", 0, True),
    KillPoint("tokenized_documents.batch_written", "tokenized_documents", "token Parquet half written", 1),
    KillPoint("artifact.published:tokenized_documents", "tokenized_documents", "published, ref not written", 0, True),
    KillPoint("dataset_manifest.partition_split", "dataset_manifest", "train/validation.bin half written", 1),
    KillPoint("artifact.published:dataset_manifest", "dataset_manifest", "published, ref not written", 0, True),
    # Training runs inside the model artifact's (empty) staging directory: each kill during it leaves that one too.
    KillPoint("training.checkpoint_weights_written", "model_checkpoint", "step-50 checkpoint half written", 2),
    KillPoint("training.checkpointed", "model_checkpoint", "step-50 checkpoint complete, older not yet dropped", 1),
    KillPoint("model_checkpoint.weights_saved", "model_checkpoint", "resumed from 50 to 150; weights staged only", 1),
    KillPoint("artifact.published:model_checkpoint", "model_checkpoint", "resumed from 100; ref not written", 0, True),
    KillPoint("benchmark_report.json_written", "benchmark_report", "benchmark.json staged, plots not", 1),
    KillPoint("artifact.published:benchmark_report", "benchmark_report", "published, ref not written", 0, True),
    KillPoint("serving_bundle.model_copied", "serving_bundle", "model files staged, goldens not recorded", 1),
    KillPoint("artifact.published:serving_bundle", "serving_bundle", "published, ref not written", 0, True),
]
PROMOTE_CHAIN = [
    KillPoint("deploy.history_appended", "production_deployment", "history line appended, pointer not written"),
    KillPoint("atomic_file.synced", "production_deployment", "pointer temp fsynced, not renamed", 1),
]


@dataclass
class Home:
    root: Path
    home: Path
    env: dict[str, str]

    @property
    def store(self) -> ArtifactStore:
        return ArtifactStore(self.home)

    def run(self, *args: str, crash_at: str | None = None, timeout: float = RUN_TIMEOUT_S) -> Outcome:
        return run_process(list(args), self.env, crash_at, timeout)

    def materialize(self, selection: str = SELECTION, crash_at: str | None = None) -> Outcome:
        command = [DAGSTER, "asset", "materialize", "-m", "orchestration.definitions"]
        command += ["--select", selection, "--partition-range", PARTITION_RANGE]
        return run_process(command, self.env, crash_at, RUN_TIMEOUT_S)


@dataclass
class Outcome:
    returncode: int
    output: str
    seconds: float


def run_process(command: list[str], env: dict[str, str], crash_at: str | None, timeout: float) -> Outcome:
    """Run to the end in its own process group; whatever it started (servers) dies with the group."""
    env = {k: v for k, v in env.items() if k not in ("AIENG_CRASH_AT", "AIENG_PAUSE_AT")}
    if crash_at is not None:
        env["AIENG_CRASH_AT"] = crash_at
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    finally:
        kill_group(process)
    return Outcome(process.returncode, output, time.monotonic() - started)


def kill_group(process: subprocess.Popen[str]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def make_home(root: Path, config: Path) -> Home:
    root = root.resolve()
    home, dagster_home = root / "aieng-home", root / "dagster"
    dagster_home.mkdir(parents=True)
    shutil.copy(REPO_ROOT / "configs" / "dagster.yaml", dagster_home / "dagster.yaml")
    env = {
        **os.environ,
        "AIENG_HOME": str(home),
        "DAGSTER_HOME": str(dagster_home),
        "AIENG_CONFIG": str(config),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    made = Home(root, home, env)
    landed = made.run(AIENG, "demo-data", "--days", str(len(PARTITIONS)), "--json")
    assert landed.returncode == 0, landed.output[-3000:]
    return made


@pytest.fixture(scope="module")
def crash_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = yaml.safe_load((REPO_ROOT / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    for section, values in OVERRIDES.items():
        config[section].update(values)
    path = tmp_path_factory.mktemp("config") / "crash.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


@dataclass
class Reference:
    home: Home
    process: subprocess.Popen[str]
    log: Path


@pytest.fixture
def reference_run(tmp_path: Path, crash_config: Path) -> Iterator[Reference]:
    """An uninterrupted run in a home of its own, started now, running beside the kill chain
    (its output goes to a file: a pipe nobody reads would stop it once full)."""
    reference = make_home(tmp_path / "reference", crash_config)
    command = [DAGSTER, "asset", "materialize", "-m", "orchestration.definitions"]
    command += ["--select", SELECTION, "--partition-range", PARTITION_RANGE]
    log = reference.root / "materialize.log"
    with log.open("w") as sink:
        process = subprocess.Popen(
            command, cwd=REPO_ROOT, env=reference.env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield Reference(reference, process, log)
    finally:
        kill_group(process)


def referenced_ids(store: ArtifactStore) -> set[tuple[str, str]]:
    """(kind, id) of every artifact some ref names."""
    named = set()
    for ref in store.refs.glob("*/*.json"):
        record = json.loads(ref.read_text(encoding="utf-8"))
        named.add((record["kind"], record["id"]))
    return named


def artifact_ids(store: ArtifactStore) -> set[tuple[str, str]]:
    return {(kind, artifact_id) for kind in ASSETS for artifact_id in store.list_ids(kind)}


def checkpoint_steps(home: Path) -> list[str]:
    return sorted(p.name for p in (home / "work").glob("model_checkpoint/*/step-*"))


def assert_nothing_partial_is_visible(store: ArtifactStore) -> dict[str, Any]:
    """Every artifact directory has its manifest and verifies; every ref names an intact artifact."""
    result = verify_store(store.home)
    assert result["damaged"] == [] and result["bad_refs"] == [], json.dumps(result, indent=2)
    assert result["ok"] is True and result["unexpected"] == []
    assert all(not entry["owner_alive"] for entry in result["staging"])  # its writer is dead
    for kind in ASSETS:
        for partition in store.current_partitions(kind) or [None]:
            artifact = store.current(kind, partition)
            if artifact is not None:
                assert store.verify(artifact) == []
    return result


def test_killed_at_every_point_then_rerun_equals_an_uninterrupted_run(
    tmp_path: Path, crash_config: Path, reference_run: Reference
) -> None:
    chain = make_home(tmp_path / "chain", crash_config)
    store = chain.store
    rows: list[str] = []
    staging_before: set[str] = set()
    dropped: list[str] = []  # stale staging a later run removed itself
    for number, kill in enumerate(CHAIN, start=1):
        artifacts_before = artifact_ids(store)
        # Re-run the asset the last kill interrupted, and on down the graph. (Everything above it
        # completed, refs included, before its step started: re-running that only reuses it.)
        rerun = ASSETS[ASSETS.index(CHAIN[number - 2].asset) if number > 1 else 0 :]
        outcome = chain.materialize(",".join(rerun), crash_at=kill.point)
        assert outcome.returncode == -signal.SIGKILL, (
            f"kill point {number} {kill.point} was never reached (exit {outcome.returncode}):\n{outcome.output[-4000:]}"
        )
        result = assert_nothing_partial_is_visible(store)
        new = sorted(artifact_ids(store) - artifacts_before)
        staging = {entry["path"] for entry in result["staging"]}
        assert len(staging - staging_before) == kill.staging, f"{kill.point}: {sorted(staging - staging_before)}"
        dropped += sorted(staging_before - staging)
        if kill.unreferenced:
            unnamed = [item for item in new if item[0] == kill.asset and item not in referenced_ids(store)]
            assert len(unnamed) == 1, f"{kill.point}: expected one new {kill.asset} no ref names, got {new}"
        rows.append(
            f"{number:>2} {kill.point:<40} {kill.asset:<20} -9 {outcome.seconds:5.1f}s staging +{kill.staging} "
            f"new {','.join(k[:5] + ':' + i[-6:] for k, i in new) or '-':<28} {kill.moment}"
        )
        staging_before = staging
    # The first run to find the model published removed its training work dir, and with it the
    # staging of the checkpoint killed half-written: the only stale entry that disappears by itself.
    assert [Path(path).relative_to(chain.home).parts[:2] for path in dropped] == [("work", "model_checkpoint")]
    assert checkpoint_steps(chain.home) == []

    published = artifact_ids(store)
    final = chain.materialize()
    assert final.returncode == 0, final.output[-6000:]
    assert artifact_ids(store) == published  # the kills left every artifact published: all reused
    for kind in ASSETS:
        assert store.current_partitions(kind) == (PARTITIONS if kind.endswith("_documents") else [])

    promoted = promote_with_kills(chain, store.require_current("serving_bundle").id, rows)

    # Every kill's leftovers at once: listed as stale by the CLI, collected by --gc, then clean.
    before_gc = cli_verify(chain)
    stale = [entry["path"] for entry in before_gc["staging"]]
    assert len(stale) == before_gc["stale_staging"] == sum(k.staging for k in CHAIN + PROMOTE_CHAIN) - 1 == 14, stale
    collected = cli_verify(chain, "--gc")
    assert collected["removed"] == stale and collected["stale_staging"] == 0
    clean = cli_verify(chain)
    assert clean["staging"] == [] and clean["artifacts_checked"] == len(artifact_ids(store))

    assert reference_run.process.wait(timeout=RUN_TIMEOUT_S) == 0, reference_run.log.read_text()[-6000:]
    compare_with_reference(store, reference_run.home.store)

    print(f"\nkill chain: {len(rows)} kill points ({len(CHAIN)} dagster runs, {len(PROMOTE_CHAIN)} promotes)")
    print("\n".join(rows))
    print(f"final run: exit 0 in {final.seconds:.1f}s; deployed {promoted}; {len(stale)} stale staging collected")


def promote_with_kills(chain: Home, bundle_id: str, rows: list[str]) -> str:
    """Kill `aieng deploy promote` between its two writes, then promote for real."""
    start = len(rows)
    for number, kill in enumerate(PROMOTE_CHAIN, start=start + 1):
        staging_before = len(find_staging(chain.home))
        outcome = chain.run(AIENG, "deploy", "promote", bundle_id, "--json", crash_at=kill.point)
        assert outcome.returncode == -signal.SIGKILL, f"{kill.point} was never reached:\n{outcome.output[-3000:]}"
        result = assert_nothing_partial_is_visible(chain.store)
        assert len(result["staging"]) - staging_before == kill.staging, result["staging"]
        assert not (chain.home / "deployments" / "production" / "current.json").exists()
        rows.append(
            f"{number:>2} {kill.point:<40} {kill.asset:<20} -9 {outcome.seconds:5.1f}s staging +{kill.staging} "
            f"new {'-':<28} {kill.moment}"
        )
    promoted = chain.run(AIENG, "deploy", "promote", bundle_id, "--json")
    assert promoted.returncode == 0, promoted.output[-3000:]
    status = json.loads(chain.run(AIENG, "deploy", "status", "--json").output)
    assert status["current"]["bundle_id"] == bundle_id
    # Both killed promotes left a history line whose change never reached the pointer.
    assert status["unapplied"] == [1, 2] and status["sequence"] == 3
    return bundle_id


def cli_verify(chain: Home, *args: str) -> dict[str, Any]:
    outcome = chain.run(AIENG, "store", "verify", "--json", *args)
    assert outcome.returncode == 0, outcome.output[-3000:]
    result = json.loads(outcome.output)
    assert result["ok"] is True and result["damaged"] == [] and result["bad_refs"] == []
    return result


def compare_with_reference(chain: ArtifactStore, reference: ArtifactStore) -> None:
    """Same ids and bytes as the uninterrupted run, wherever the recipe decides them."""
    for kind in ("dataset_manifest", "bpe_tokenizer"):
        ours, theirs = chain.require_current(kind), reference.require_current(kind)
        assert (ours.id, ours.content_sha256) == (theirs.id, theirs.content_sha256), kind
    for partition in PARTITIONS:
        for kind in ("raw_documents", "clean_documents", "tokenized_documents"):
            ours, theirs = chain.require_current(kind, partition), reference.require_current(kind, partition)
            assert (ours.id, ours.content_sha256) == (theirs.id, theirs.content_sha256), (kind, partition)
    # The model was killed during training twice, resumed from step 50, killed, resumed from step 100:
    # the same id, and bit for bit the same weights as the model trained in one go.
    ours, theirs = chain.require_current("model_checkpoint"), reference.require_current("model_checkpoint")
    assert ours.id == theirs.id and ours.metrics["steps"] == theirs.metrics["steps"] == 150
    assert ours.metrics["resumed_from_step"] == 100 and theirs.metrics["resumed_from_step"] is None
    assert sha256_file(ours.file("model.safetensors")) == sha256_file(theirs.file("model.safetensors"))
    assert ours.content_sha256 == theirs.content_sha256
    report, their_report = chain.require_current("benchmark_report"), reference.require_current("benchmark_report")
    assert report.id == their_report.id
    # A bundle's id includes its benchmark report's content hash (measured timings), so two homes'
    # bundles differ in id by design; what they serve (model, tokenizer, serving.json, goldens) must not.
    bundle, their_bundle = chain.require_current("serving_bundle"), reference.require_current("serving_bundle")
    assert bundle.content_sha256 == their_bundle.content_sha256
    assert bundle.metrics["model_checkpoint_id"] == their_bundle.metrics["model_checkpoint_id"] == ours.id


def test_two_racing_materializations_one_wins_the_other_reuses(tmp_path: Path, crash_config: Path) -> None:
    """Both racers are held with a complete staging directory of the same artifact until both are
    there; released together, one renames it into place and the other finds it there.

    The second starts once the first is held: two processes cannot be the first to open a fresh
    SQLite DAGSTER_HOME at once (Dagster's schema creation races: UNIQUE constraint failed:
    alembic_version), and a shared instance in use is never fresh."""
    home = make_home(tmp_path / "race", crash_config)
    release = tmp_path / "release"
    env = {**home.env, "AIENG_PAUSE_AT": "artifact.staged:raw_documents", "AIENG_PAUSE_FILE": str(release)}
    command = [DAGSTER, "asset", "materialize", "-m", "orchestration.definitions"]
    command += ["--select", "raw_documents", "--partition", PARTITIONS[0]]
    logs = [tmp_path / f"racer-{n}.log" for n in (1, 2)]
    racers: list[subprocess.Popen[str]] = []
    try:
        for log in logs:
            with log.open("w") as sink:
                racers.append(
                    subprocess.Popen(
                        command, cwd=REPO_ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
                    )
                )
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while len(list(tmp_path.glob("release.*.waiting"))) < len(racers):
                if any(racer.poll() is not None for racer in racers) or time.monotonic() > deadline:
                    pytest.fail(f"a racer exited or never staged its artifact:\n{racer_logs(logs)}")
                time.sleep(0.05)
        # Both hold a complete staging directory of the same artifact now.
        staged = find_staging(home.home)
        assert len(staged) == 2 and all(path.parent == home.home / "artifacts" / "raw_documents" for path in staged)
        release.touch()
        for racer in racers:
            racer.wait(timeout=RUN_TIMEOUT_S)
    finally:
        for racer in racers:
            kill_group(racer)
    assert [racer.returncode for racer in racers] == [0, 0], racer_logs(logs)
    outputs = [log.read_text() for log in logs]
    store = home.store
    [artifact_id] = store.list_ids("raw_documents")
    assert sorted(p.name for p in (home.home / "artifacts" / "raw_documents").iterdir()) == [artifact_id]
    current = store.require_current("raw_documents", PARTITIONS[0])
    assert current.id == artifact_id and store.verify(current) == []
    # One wrote it, the other found it renamed into place under its feet and reused it.
    verbs = sorted(
        verb for output in outputs for verb in ("wrote", "reused") if f"{PARTITIONS[0]}: {verb} {artifact_id}" in output
    )
    assert verbs == ["reused", "wrote"], racer_logs(logs)
    result = verify_store(home.home)
    assert result["ok"] is True and result["staging"] == [] and result["artifacts_checked"] == 1


def racer_logs(logs: list[Path]) -> str:
    return "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in logs if log.exists())
