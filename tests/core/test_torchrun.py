"""The launching side of data-parallel training, without starting torchrun: the section's
checks, what a one-process section hashes as, the threads each rank gets, the command, and
what a failed or silent launch reports. (tests/e2e/test_data_parallel_training.py runs it.)"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from aieng_core.config import TrainingConfig
from aieng_core.model.llama import LlamaConfig
from aieng_core.training.corpus import TokenFile
from aieng_core.training.torchrun import (
    DistributedTrainingFailed,
    launch,
    threads_per_rank,
    torchrun_command,
    write_job,
)


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


def test_the_job_carries_the_recipe_threads_and_a_stale_result_is_removed(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "result").mkdir(parents=True)
    (work / "result" / "outcome.json").write_text("{}")
    model, config, train, validation = _job_inputs(tmp_path)
    job = json.loads(write_job(work, model, config, train, validation, threads=5).read_text())
    assert not (work / "result").exists()
    assert job["training"]["threads"] == 5
    assert job["training"]["processes"] == 2
    assert job["train"] == {"path": str(tmp_path / "train.bin"), "dtype": "<u2", "length": 100}
    assert TrainingConfig(**job["training"]).batch_size == 4


def test_in_memory_streams_are_refused(tmp_path: Path) -> None:
    model, config, _, validation = _job_inputs(tmp_path)
    with pytest.raises(TypeError, match="token files"):
        write_job(tmp_path / "work", model, config, np.arange(100, dtype=np.uint16), validation, threads=1)


def test_a_failed_launch_names_the_count_the_error_and_where_it_resumes(tmp_path: Path) -> None:
    seen: list[tuple[list[str], dict[str, str]]] = []

    def fails(command: Sequence[str], env: Mapping[str, str]) -> None:
        seen.append((list(command), dict(env)))
        raise RuntimeError("rank 1 exited with -9")

    work = tmp_path / "work"
    with pytest.raises(DistributedTrainingFailed) as raised:
        launch(write_job(work, *_job_inputs(tmp_path), threads=2), launcher=fails)
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
        launch(write_job(tmp_path / "work", *_job_inputs(tmp_path), threads=1), launcher=silent)
