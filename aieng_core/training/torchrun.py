"""Data-parallel training in N processes on this machine, launched with `torchrun`.

The launching process (model_checkpoint's build) verifies its inputs, then writes a job file
into the recipe's work directory: the model's shape, the training section, the two token
files and where to put the result. `torchrun` starts N ranks of
aieng_core/training/ddp_worker.py, which read only that file; rank 0 writes the trained
weights and the outcome into `result/` of the work directory, atomically, and the launching
process builds the artifact from them as it does from a model it trained itself.

How the command is run is the caller's: `run_torchrun` by default (a child process whose
output goes to this one's), or, from Dagster, a Pipes client (orchestration/assets/model.py),
so rank 0's logs and progress stream into the run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from aieng_core.config import TrainingConfig
from aieng_core.training.corpus import TokenFile, TokenStream

JOB_FILE = "job.json"
RESULT_DIR = "result"
RESULT_WEIGHTS = "model.safetensors"
RESULT_OUTCOME = "outcome.json"
WORKER_MODULE = "aieng_core.training.ddp_worker"

# Runs the command with the environment added to this process's; raises if it fails.
Launcher = Callable[[Sequence[str], Mapping[str, str]], None]


class DistributedTrainingFailed(RuntimeError):
    """torchrun or one of its ranks failed; the last checkpoint stays for the next run."""


def threads_per_rank(config: TrainingConfig, cores: int) -> int:
    """training.threads for each rank, else the cores shared out: N ranks with torch's default
    each would oversubscribe the machine N times."""
    return config.threads or max(1, cores // config.processes)


def torchrun_command(processes: int, job: Path) -> list[str]:
    """`torchrun --standalone` (one machine, a free rendezvous port) with no restarts: a failed
    rank fails the launch, and the next materialization resumes from the checkpoint."""
    launcher = [sys.executable, "-m", "torch.distributed.run"]  # what the `torchrun` script runs
    return [*launcher, "--standalone", f"--nproc-per-node={processes}", "--max-restarts=0"] + [
        "-m",
        WORKER_MODULE,
        str(job),
    ]


def run_torchrun(command: Sequence[str], env: Mapping[str, str]) -> None:
    done = subprocess.run(list(command), env={**os.environ, **env}, check=False)
    if done.returncode != 0:
        raise DistributedTrainingFailed(f"torchrun exited with status {done.returncode}")


def _stream_entry(stream: TokenStream) -> dict[str, Any]:
    if not isinstance(stream, TokenFile):
        raise TypeError("data-parallel training reads token files, not in-memory arrays")
    return {"path": str(stream.path), "dtype": stream.dtype.str, "length": stream.length}


def write_job(
    work_dir: Path,
    model_config: Any,
    config: TrainingConfig,
    train_tokens: TokenStream,
    validation_tokens: TokenStream,
    threads: int,
) -> Path:
    work_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(work_dir / RESULT_DIR, ignore_errors=True)  # never read a result of an earlier launch
    job = {
        "model": asdict(model_config),
        # The ranks run with the recipe's thread count, whatever their environment says.
        "training": {**config.model_dump(mode="json"), "threads": threads},
        "train": _stream_entry(train_tokens),
        "validation": _stream_entry(validation_tokens),
        "work_dir": str(work_dir),
    }
    path = work_dir / JOB_FILE
    temporary = path.with_name(f".{JOB_FILE}.tmp")
    temporary.write_text(json.dumps(job, indent=2), encoding="utf-8")
    temporary.replace(path)
    return path


def launch(job: Path, launcher: Launcher = run_torchrun) -> tuple[dict[str, Any], Path]:
    """Train the job write_job wrote in its training.processes ranks; returns rank 0's outcome
    (TrainOutcome's fields but the model) and the file of the trained weights."""
    spec = json.loads(job.read_text(encoding="utf-8"))
    processes, threads, work_dir = spec["training"]["processes"], spec["training"]["threads"], job.parent
    # OMP_NUM_THREADS set, torchrun does not override it with 1 (and warns that it did).
    env = {"OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    try:
        launcher(torchrun_command(processes, job), env)
    except Exception as error:  # torchrun's status, or a Pipes client's error saying it
        raise DistributedTrainingFailed(
            f"{processes}-process training failed ({error}); the next run resumes from the last "
            f"checkpoint in {work_dir}"
        ) from error
    result = work_dir / RESULT_DIR
    outcome_file = result / RESULT_OUTCOME
    if not outcome_file.is_file():
        raise DistributedTrainingFailed(f"torchrun exited 0 but rank 0 wrote no result in {result}")
    return json.loads(outcome_file.read_text(encoding="utf-8")), result / RESULT_WEIGHTS
