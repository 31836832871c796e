"""The launching side of data-parallel training, without starting torchrun: the section's
checks, what a one-process section hashes as, the threads each rank gets, the command, and
what a failed or silent launch reports. (tests/e2e/test_data_parallel_training.py runs it.)"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from aieng_core.config import TrainingConfig
from aieng_core.model.llama import LlamaConfig
from aieng_core.training import ddp_worker
from aieng_core.training.corpus import TokenFile
from aieng_core.training.torchrun import (
    DistributedTrainingFailed,
    Launcher,
    launch,
    threads_per_rank,
    torchrun_command,
    write_job,
)
from aieng_core.training.trainer import TimeBudgetTooSmall


def test_batch_size_must_split_evenly_between_the_processes() -> None:
    with pytest.raises(ValidationError) as raised:
        TrainingConfig(batch_size=10, processes=4)
    assert "batch_size (10) must be a multiple of processes (4)" in str(raised.value)
    assert TrainingConfig(batch_size=12, processes=4).processes == 4


@pytest.mark.parametrize("processes", [0, 65])
def test_processes_out_of_range_are_refused(processes: int) -> None:
    with pytest.raises(ValidationError, match="processes"):
        TrainingConfig(batch_size=64, processes=processes)


def test_one_process_is_left_out_of_the_dump_and_another_count_is_not() -> None:
    assert "processes" not in TrainingConfig().model_dump()
    assert TrainingConfig(processes=1).model_dump() == TrainingConfig().model_dump()
    assert TrainingConfig(batch_size=16, processes=2).model_dump()["processes"] == 2


def test_threads_per_rank_shares_the_cores_unless_threads_is_set() -> None:
    assert threads_per_rank(TrainingConfig(batch_size=16, processes=2), cores=8) == 4
    assert threads_per_rank(TrainingConfig(batch_size=16, processes=4), cores=2) == 1
    assert threads_per_rank(TrainingConfig(batch_size=16, processes=2, threads=3), cores=8) == 3
    assert threads_per_rank(TrainingConfig(), cores=6) == 6


def test_torchrun_command_is_standalone_without_restarts(tmp_path: Path) -> None:
    command = torchrun_command(3, tmp_path / "job.json")
    assert command == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=3",
        "--max-restarts=0",
        "-m",
        "aieng_core.training.ddp_worker",
        str(tmp_path / "job.json"),
    ]


def _token_file(path: Path, length: int) -> TokenFile:
    np.arange(length, dtype=np.uint16).tofile(path)
    return TokenFile(path, np.dtype(np.uint16), length)


def _job_inputs(tmp_path: Path) -> tuple[LlamaConfig, TrainingConfig, TokenFile, TokenFile]:
    model = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    config = TrainingConfig(batch_size=4, processes=2, block_size=8)
    return model, config, _token_file(tmp_path / "train.bin", 100), _token_file(tmp_path / "val.bin", 50)


def test_the_job_carries_the_recipe_device_and_threads_and_earlier_results_are_removed(tmp_path: Path) -> None:
    work = tmp_path / "work"
    for earlier in ("result/outcome.json", "errors/rank-1.json"):
        (work / earlier).parent.mkdir(parents=True)
        (work / earlier).write_text("{}")
    model, config, train, validation = _job_inputs(tmp_path)
    assert config.device == "auto"
    first = json.loads(write_job(work, model, config, train, validation, device="cuda", threads=5).read_text())
    job = json.loads(write_job(work, model, config, train, validation, device="cpu", threads=5).read_text())
    assert not (work / "result").exists()
    assert not (work / "errors").exists()
    assert first["training"]["device"] == "cuda"
    assert job["training"]["device"] == "cpu"
    assert len(job["launch_id"]) == 32
    assert job["launch_id"] != first["launch_id"]
    assert job["launcher"] == {"host": socket.gethostname(), "pid": os.getpid()}
    assert job["training"]["threads"] == 5
    assert job["training"]["processes"] == 2
    assert job["train"] == {"path": str(tmp_path / "train.bin"), "dtype": "<u2", "length": 100}
    assert TrainingConfig(**job["training"]).batch_size == 4


def test_in_memory_streams_are_refused(tmp_path: Path) -> None:
    model, config, _, validation = _job_inputs(tmp_path)
    with pytest.raises(TypeError, match="token files"):
        write_job(
            tmp_path / "work", model, config, np.arange(100, dtype=np.uint16), validation, device="cpu", threads=1
        )


def test_a_failed_launch_names_the_count_the_error_and_where_it_resumes(tmp_path: Path) -> None:
    seen: list[tuple[list[str], dict[str, str]]] = []

    def fails(command: Sequence[str], env: Mapping[str, str]) -> None:
        seen.append((list(command), dict(env)))
        raise RuntimeError("rank 1 exited with -9")

    work = tmp_path / "work"
    with pytest.raises(DistributedTrainingFailed) as raised:
        launch(write_job(work, *_job_inputs(tmp_path), device="cpu", threads=2), launcher=fails)
    assert str(raised.value) == (
        f"2-process training failed (rank 1 exited with -9); the next run resumes from the last checkpoint in {work}"
    )
    assert len(seen) == 1
    assert seen[0][0][-1] == str(work / "job.json")
    assert seen[0][1] == {"OMP_NUM_THREADS": "2", "PYTHONUNBUFFERED": "1"}


def test_a_launch_that_writes_no_result_is_an_error(tmp_path: Path) -> None:
    def silent(command: Sequence[str], env: Mapping[str, str]) -> None:
        return None

    with pytest.raises(DistributedTrainingFailed, match="rank 0 wrote no result"):
        launch(write_job(tmp_path / "work", *_job_inputs(tmp_path), device="cpu", threads=1), launcher=silent)


def _failing_with(errors: dict[int, tuple[str, str]]) -> Launcher:
    """A launcher whose ranks wrote these errors (rank: type, message), then failed."""

    def launcher(command: Sequence[str], env: Mapping[str, str]) -> None:
        work = Path(command[-1]).parent
        (work / "errors").mkdir()
        for rank, (kind, message) in errors.items():
            said = {"rank": rank, "type": kind, "message": message}
            (work / "errors" / f"rank-{rank}.json").write_text(json.dumps(said))
        raise RuntimeError("External execution process failed with code 1")

    return launcher


def test_what_the_ranks_raised_is_in_the_error_by_rank(tmp_path: Path) -> None:
    work = tmp_path / "work"
    job = write_job(work, *_job_inputs(tmp_path), device="cpu", threads=1)
    errors = {1: ("OSError", "disk full\ntraceback line"), 0: ("RuntimeError", "Connection closed by peer")}
    with pytest.raises(DistributedTrainingFailed) as raised:
        launch(job, launcher=_failing_with(errors))
    assert str(raised.value) == (
        "2-process training failed (External execution process failed with code 1); rank 0 raised RuntimeError: "
        "Connection closed by peer; rank 1 raised OSError: disk full; the next run resumes from the last "
        f"checkpoint in {work}"
    )


def test_a_budget_too_small_for_a_step_is_that_error_as_in_one_process(tmp_path: Path) -> None:
    job = write_job(tmp_path / "work", *_job_inputs(tmp_path), device="cpu", threads=1)
    message = "max_minutes (0.0001) ran out before the first step"
    with pytest.raises(TimeBudgetTooSmall, match=r"^max_minutes \(0\.0001\) ran out before the first step$"):
        launch(job, launcher=_failing_with({0: ("TimeBudgetTooSmall", message), 1: ("TimeBudgetTooSmall", message)}))


def test_a_result_of_another_launch_is_never_read(tmp_path: Path) -> None:
    job = write_job(tmp_path / "work", *_job_inputs(tmp_path), device="cpu", threads=1)

    def stale(command: Sequence[str], env: Mapping[str, str]) -> None:
        result = Path(command[-1]).parent / "result"
        result.mkdir()
        (result / "outcome.json").write_text(json.dumps({"launch_id": "0" * 32, "steps": 3}))

    with pytest.raises(DistributedTrainingFailed, match="is not this launch's"):
        launch(job, launcher=stale)


def test_a_rank_refuses_a_cuda_recipe_without_cuda_and_says_so_to_the_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(ddp_worker, "_stop_with_the_launcher", lambda launcher: None)  # tested below
    work = tmp_path / "work"
    job = write_job(work, *_job_inputs(tmp_path), device="cuda", threads=1)
    for name, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(RuntimeError, match="the recipe trains on cuda"):
        ddp_worker.main(str(job))
    assert json.loads((work / "errors" / "rank-1.json").read_text()) == {
        "rank": 1,
        "type": "RuntimeError",
        "message": "the recipe trains on cuda (training.device) but this rank sees no CUDA device",
    }


def test_ranks_stop_when_their_launcher_is_gone(tmp_path: Path) -> None:
    """A step SIGKILLed takes no torchrun with it: its ranks must not train on as orphans."""
    launcher = subprocess.Popen(["sleep", "60"])
    rank = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from aieng_core.training import ddp_worker; "
            "ddp_worker._stop_with_the_launcher({'host': sys.argv[1], 'pid': int(sys.argv[2])}); "
            "print('watching', flush=True); time.sleep(60)",
            socket.gethostname(),
            str(launcher.pid),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert rank.stdout is not None and rank.stdout.readline() == "watching\n"
        assert rank.poll() is None
        launcher.kill()  # not reaped yet: a zombie is gone too
        assert rank.wait(timeout=15) == ddp_worker.LAUNCHER_GONE_STATUS
        assert rank.stderr is not None and f"the launching process {launcher.pid} is gone" in rank.stderr.read()
    finally:
        for process in (launcher, rank):
            process.kill()
            process.wait(timeout=10)
