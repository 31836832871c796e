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
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from aieng_core.config import TrainingConfig
from aieng_core.store.atomic import atomic_write_bytes
from aieng_core.training.corpus import TokenFile, TokenStream

JOB_FILE = "job.json"
RESULT_DIR = "result"
RESULT_WEIGHTS = "model.safetensors"
RESULT_OUTCOME = "outcome.json"
ERRORS_DIR = "errors"  # rank-N.json: what rank N raised
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
    torchrun = [sys.executable, "-m", "torch.distributed.run"]  # what the `torchrun` script runs
    return [
        *torchrun,
        "--standalone",
        f"--nproc-per-node={processes}",
        "--max-restarts=0",
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
    *,
    device: str,
    threads: int,
) -> Path:
    """The job for the ranks: the recipe's device and threads in place of what the section
    says (the ranks run on what the id says, wherever they run), and a launch id that rank 0's
    result must carry, so a result or an error left by an earlier launch is never read."""
    work_dir.mkdir(parents=True, exist_ok=True)
    for earlier in (work_dir / RESULT_DIR, work_dir / ERRORS_DIR):
        if earlier.exists():
            shutil.rmtree(earlier)
    job = {
        "launch_id": uuid.uuid4().hex,
        # The ranks stop themselves when the process that launched them is gone (killed with the
        # step), rather than train on as orphans beside the next launch.
        "launcher": {"host": socket.gethostname(), "pid": os.getpid()},
        "model": asdict(model_config),
        "training": {**config.model_dump(mode="json"), "device": device, "threads": threads},
        "train": _stream_entry(train_tokens),
        "validation": _stream_entry(validation_tokens),
        "work_dir": str(work_dir),
    }
    path = work_dir / JOB_FILE
    atomic_write_bytes(path, json.dumps(job, indent=2).encode("utf-8"))
    return path


def rank_errors(work_dir: Path) -> list[dict[str, Any]]:
    """What the ranks that raised wrote (rank, type, message), by rank."""
    errors = [json.loads(path.read_text(encoding="utf-8")) for path in (work_dir / ERRORS_DIR).glob("rank-*.json")]
    return sorted(errors, key=lambda error: int(error["rank"]))


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
        raise _launch_failure(processes, work_dir, error) from error
    result = work_dir / RESULT_DIR
    outcome_file = result / RESULT_OUTCOME
    if not outcome_file.is_file():
        raise DistributedTrainingFailed(f"torchrun exited 0 but rank 0 wrote no result in {result}")
    outcome = json.loads(outcome_file.read_text(encoding="utf-8"))
    if outcome.pop("launch_id", None) != spec["launch_id"]:
        raise DistributedTrainingFailed(f"the result in {result} is not this launch's ({spec['launch_id']})")
    return outcome, result / RESULT_WEIGHTS


def _launch_failure(processes: int, work_dir: Path, error: Exception) -> Exception:
    """What the ranks raised, with the launcher's error. A rank killed outright (SIGKILL, out of
    memory) writes nothing, and the others then raise a lost connection: only torchrun's output
    names the rank that died. A budget too small for one step is that error again, as in one
    process."""
    from aieng_core.training.trainer import TimeBudgetTooSmall  # trainer imports torch

    raised = rank_errors(work_dir)
    if raised and raised[0]["type"] == TimeBudgetTooSmall.__name__:
        return TimeBudgetTooSmall(raised[0]["message"])
    said = "".join(f"; rank {e['rank']} raised {e['type']}: {_first_line(e['message'])}" for e in raised)
    return DistributedTrainingFailed(
        f"{processes}-process training failed ({error}){said}; the next run resumes from the last checkpoint "
        f"in {work_dir}"
    )


def _first_line(message: str, limit: int = 300) -> str:
    lines = message.strip().splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"
