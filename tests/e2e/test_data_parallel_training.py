"""training.processes: 2, run for real: model_checkpoint materialized by `dagster asset
materialize` starts `torchrun` (2 ranks, gloo on CPU) through Dagster Pipes, on the data half
of configs/tiny.yaml for three days.

- Rank 0's progress lines reach the Dagster run's event log through Pipes.
- The 2-process run follows the 1-process run's loss trajectory with the same global batch
  (within LOSS_TOLERANCE nats at every logged step), and is another recipe (another id).
- One rank SIGKILLed mid-training (rank 0 held just after its first checkpoint): the run fails
  naming the 2-process training, nothing is published; the re-run resumes from that
  checkpoint and ends with the id and the bytes of the uninterrupted 2-process run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import psutil
import pytest

from aieng_core.store import Artifact
from aieng_core.store.recipes import read_recipe, recipe_path
from aieng_core.training.model_checkpoint import KIND, TRAINING_STATE_FILE
from tests.e2e.cli_helpers import AIENG, DAGSTER, DATA_HALF, PARTITION_RANGE, REPO_ROOT, TIMEOUT_S, Env, make_env

pytestmark = pytest.mark.e2e

# Observed here: at most 2e-4 nats apart over 150 steps (float summation order of the gradient
# average); a bug in the sharding (ranks on the same windows, a share skipped) is 0.05 and more.
LOSS_TOLERANCE = 5e-3
PAUSE_POINT = "training.checkpointed"  # rank 0, its first checkpoint (step 50 of 150) complete
CHECKPOINT_STEP = 50


@dataclass
class Materialized:
    returncode: int
    output: str
    wall_s: float


@dataclass
class Runs:
    one: Env
    two: Env
    killed: Env
    one_model: Artifact
    two_model: Artifact
    two_run: Materialized
    killed_run: Materialized
    rerun: Materialized
    killed_rank: dict[str, Any]
    figures: dict[str, Any]


def config_with(root: Path, processes: int) -> Path:
    text = (REPO_ROOT / "configs" / "tiny.yaml").read_text(encoding="utf-8")
    old = "  device: auto\n\nbundle:"
    assert old in text
    path = root / f"tiny-{processes}.yaml"
    path.write_text(text.replace(old, f"  device: auto\n  processes: {processes}\n\nbundle:", 1), encoding="utf-8")
    return path


def home_with_data(data: Env, root: Path, config: Path) -> Env:
    env = make_env(root)
    shutil.copytree(data.home, env.home)
    env.vars["AIENG_CONFIG"] = str(config)
    return env


def materialize_model(env: Env) -> Materialized:
    started = time.monotonic()
    done = env.materialize("--select", KIND)
    return Materialized(done.returncode, done.stdout + done.stderr, time.monotonic() - started)


def history(model: Artifact) -> list[dict[str, Any]]:
    return json.loads(model.file(TRAINING_STATE_FILE).read_text(encoding="utf-8"))["history"]


def recorded_training(env: Env, model: Artifact) -> dict[str, Any]:
    recipe = read_recipe(recipe_path(env.home, KIND, model.id))
    return recipe["config_sections"]["training"]


def run_messages(env: Env) -> list[str]:
    with dg.DagsterInstance.from_config(env.vars["DAGSTER_HOME"]) as instance:
        [run] = instance.get_runs(limit=1)
        return [entry.user_message for entry in instance.all_logs(run.run_id)]


def kill_rank_one(env: Env, release: Path, root: Path) -> tuple[Materialized, dict[str, Any]]:
    """The run held with rank 0 at PAUSE_POINT; rank 1 (waiting for rank 0 in its next gradient
    reduction) SIGKILLed, as the OOM killer would."""
    log = root / "killed-run.log"
    command = [DAGSTER, "asset", "materialize", "-m", "orchestration.definitions", "--select", KIND]
    armed = {**env.vars, "AIENG_PAUSE_AT": PAUSE_POINT, "AIENG_PAUSE_FILE": str(release)}
    started = time.monotonic()
    with log.open("w") as sink:
        run = subprocess.Popen(command, cwd=REPO_ROOT, env=armed, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not (waiting := list(root.glob(f"{release.name}.*.waiting"))):
            if run.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"rank 0 was never held at {PAUSE_POINT}:\n{log.read_text()[-6000:]}")
            time.sleep(0.05)
        rank_zero = psutil.Process(int(waiting[0].name.split(".")[-2]))
        [rank_one] = [p for p in rank_zero.parent().children() if p.pid != rank_zero.pid]
        killed = {
            "rank_zero_env": rank_zero.environ().get("RANK"),
            "rank": rank_one.environ().get("RANK"),
            "checkpoints": sorted(path.name for path in (env.home / "work" / KIND).glob("*/step-*")),
        }
        rank_one.send_signal(signal.SIGKILL)
        run.wait(timeout=TIMEOUT_S)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    return Materialized(run.returncode, log.read_text(), time.monotonic() - started), killed


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    root = tmp_path_factory.mktemp("ddp")
    data = make_env(root / "data")
    data.run_ok(AIENG, "demo-data", "--json")
    built = data.materialize("--select", DATA_HALF, "--partition-range", PARTITION_RANGE)
    assert built.returncode == 0, built.stderr[-6000:]
    one = home_with_data(data, root / "one", config_with(root, 1))
    two = home_with_data(data, root / "two", config_with(root, 2))
    killed = home_with_data(data, root / "killed", config_with(root, 2))

    trained = json.loads(one.run_ok(AIENG, "model", "train", "--json").stdout)
    two_run = materialize_model(two)
    assert two_run.returncode == 0, two_run.output[-6000:]
    release = root / "release"  # absent: rank 0 is held at PAUSE_POINT
    killed_run, killed_rank = kill_rank_one(killed, release, root)
    release.touch()
    rerun = materialize_model(killed)
    one_model, two_model = one.store.require_current(KIND), two.store.require_current(KIND)
    assert one_model.id == trained["id"]
    figures = {
        "tokens_per_second_1_process": round(one_model.metrics["tokens_per_second"]),
        "tokens_per_second_2_processes": round(two_model.metrics["tokens_per_second"]),
        "max_loss_difference": max(
            abs(a[key] - b[key])
            for a, b in zip(history(one_model), history(two_model), strict=True)
            for key in ("train_loss", "validation_loss")
            if key in a
        ),
        "two_process_run_s": round(two_run.wall_s, 1),
        "killed_run_s": round(killed_run.wall_s, 1),
        "rerun_s": round(rerun.wall_s, 1),
        "kill_outcome": next(
            (line.strip() for line in killed_run.output.splitlines() if "2-process training failed" in line), None
        ),
    }
    print(f"\ndata-parallel training, tiny config: {json.dumps(figures)}")
    (root / "ddp.json").write_text(json.dumps(figures, indent=2))
    yield Runs(one, two, killed, one_model, two_model, two_run, killed_run, rerun, killed_rank, figures)


def test_two_processes_follow_the_one_process_trajectory(runs: Runs) -> None:
    one, two = history(runs.one_model), history(runs.two_model)
    assert [entry["step"] for entry in one] == [entry["step"] for entry in two] == [25, 50, 75, 100, 125, 150]
    assert runs.figures["max_loss_difference"] <= LOSS_TOLERANCE, (one, two)
    # The same global batch: the same tokens per step, and another recipe, so another model id.
    assert runs.one_model.metrics["tokens_seen"] == runs.two_model.metrics["tokens_seen"] == 150 * 16 * 32
    assert (runs.one_model.metrics["processes"], runs.two_model.metrics["processes"]) == (1, 2)
    assert runs.two_model.metrics["threads"] == 1  # the machine's cores shared out between the ranks
    assert runs.one_model.id != runs.two_model.id
    # The recipe records the count; one process is left unsaid, so models trained before the key keep their ids.
    assert recorded_training(runs.two, runs.two_model)["processes"] == 2
    assert "processes" not in recorded_training(runs.one, runs.one_model)


def test_rank_zero_streams_progress_into_the_dagster_run(runs: Runs) -> None:
    messages = run_messages(runs.two)
    assert "[pipes] external process successfully opened dagster pipes." in messages
    expected = "data-parallel training: 2 processes, 8 sequences of each batch of 16 per process, 1 thread each"
    assert expected in messages
    progress = [message for message in messages if message.startswith("step ") and " tok/s " in message]
    assert [message.split()[1] for message in progress] == [f"{step}/150" for step in (25, 50, 75, 100, 125, 150)]
    assert f"model_checkpoint: trained {runs.two_model.id}" in messages


def test_a_rank_killed_fails_the_run_and_publishes_nothing(runs: Runs) -> None:
    assert (runs.killed_rank["rank_zero_env"], runs.killed_rank["rank"]) == ("0", "1")
    assert runs.killed_rank["checkpoints"] == [f"step-{CHECKPOINT_STEP:08d}"]
    killed = runs.killed_run
    assert killed.returncode != 0, killed.output[-6000:]
    assert "2-process training failed (External execution process failed with code 1)" in killed.output
    assert "the next run resumes from the last checkpoint in" in killed.output
    assert "exitcode  : -9" in killed.output  # torchrun's summary of the rank that was killed
    with dg.DagsterInstance.from_config(runs.killed.vars["DAGSTER_HOME"]) as instance:
        first = instance.get_runs()[-1]
        assert first.status == dg.DagsterRunStatus.FAILURE
    assert runs.killed.store.list_ids(KIND) == [runs.two_model.id]  # only the re-run's


def test_the_rerun_resumes_and_ends_with_the_uninterrupted_bytes(runs: Runs) -> None:
    assert runs.rerun.returncode == 0, runs.rerun.output[-6000:]
    assert f"resuming training from step {CHECKPOINT_STEP}" in runs.rerun.output
    resumed = runs.killed.store.require_current(KIND)
    assert resumed.metrics["resumed_from_step"] == CHECKPOINT_STEP
    # Same recipe, same id, same bytes: the 2-process run is deterministic, across a kill too.
    assert resumed.id == runs.two_model.id
    assert resumed.manifest["content_sha256"] == runs.two_model.manifest["content_sha256"]
    assert runs.killed.store.verify(resumed) == []
    assert not (runs.killed.home / "work" / KIND / resumed.id).exists()  # resume state removed once published
    assert os.environ.get("AIENG_PAUSE_AT") is None
