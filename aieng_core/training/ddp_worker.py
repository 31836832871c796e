"""One rank of data-parallel training: `torchrun ... -m aieng_core.training.ddp_worker JOB`.

torchrun gives each rank RANK, WORLD_SIZE and LOCAL_RANK and a rendezvous for
torch.distributed (gloo on CPU, NCCL on CUDA, one device per rank). The job file
(aieng_core/training/torchrun.py) says what to train; this process opens the token files
read-only, trains its share of every batch (aieng_core/training/trainer.py) and, on rank 0,
writes the weights and the outcome into the work directory's result/ atomically. A rank that
raises writes what it raised into errors/rank-N.json, for the launcher's error message.

Launched by a Dagster Pipes client (DAGSTER_PIPES_CONTEXT in the environment), rank 0 logs
through Pipes, so its progress lines reach the Dagster run as they happen; the other ranks log
nothing but errors (each rank's traceback reaches torchrun's output).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import save_file

from aieng_core.config import TrainingConfig
from aieng_core.model.llama import LlamaConfig
from aieng_core.model.weights import unique_state_dict
from aieng_core.store.atomic import atomic_directory, atomic_write_bytes
from aieng_core.training.corpus import TokenFile
from aieng_core.training.torchrun import ERRORS_DIR, RESULT_DIR, RESULT_OUTCOME, RESULT_WEIGHTS
from aieng_core.training.trainer import Ranks, TrainOutcome, train

PIPES_CONTEXT_ENV = "DAGSTER_PIPES_CONTEXT"  # set by a Pipes client for the process it launches
COLLECTIVE_TIMEOUT = dt.timedelta(minutes=30)
LAUNCHER_POLL_S = 1.0
LAUNCHER_GONE_STATUS = 70


def _token_file(entry: dict[str, Any]) -> TokenFile:
    return TokenFile(Path(entry["path"]), np.dtype(entry["dtype"]), int(entry["length"]))


@contextlib.contextmanager
def _leader_logger(leader: bool) -> Iterator[Any]:
    if not leader:
        quiet = logging.getLogger("aieng.training.rank")
        quiet.setLevel(logging.ERROR)
        yield quiet
    elif PIPES_CONTEXT_ENV in os.environ:
        # dagster_pipes is the Pipes protocol alone (no dagster import): what a launched process uses.
        from dagster_pipes import open_dagster_pipes

        with open_dagster_pipes() as pipes:
            yield pipes.log
    else:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s rank 0 %(message)s", stream=sys.stderr)
        yield logging.getLogger("aieng.training")


def _write_result(work_dir: Path, outcome: TrainOutcome, launch_id: str) -> None:
    fields = {name: value for name, value in vars(outcome).items() if name != "model"}
    with atomic_directory(work_dir / RESULT_DIR) as staging:  # the launcher removed any earlier one
        save_file(unique_state_dict(outcome.model), staging / RESULT_WEIGHTS)
        outcome_json = json.dumps({**fields, "launch_id": launch_id}, indent=2)
        (staging / RESULT_OUTCOME).write_text(outcome_json, encoding="utf-8")


def _write_error(work_dir: Path, rank: int, error: BaseException) -> None:
    said = {"rank": rank, "type": type(error).__name__, "message": str(error)}
    atomic_write_bytes(work_dir / ERRORS_DIR / f"rank-{rank}.json", json.dumps(said).encode("utf-8"))


def _stop_with_the_launcher(launcher: dict[str, Any]) -> None:
    """Exit when the process that launched this run is gone: a step killed with SIGKILL takes
    no torchrun with it, and orphaned ranks would go on checkpointing into the work directory
    the next launch resumes from. Only where the launcher runs on this host (a Kubernetes pod
    is stopped with its step by Kubernetes)."""
    if launcher["host"] != socket.gethostname():
        return

    pid = int(launcher["pid"])

    def watch() -> None:
        while _alive(pid):
            time.sleep(LAUNCHER_POLL_S)
        print(f"the launching process {pid} is gone: stopping", file=sys.stderr, flush=True)
        os._exit(LAUNCHER_GONE_STATUS)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # there, another user's
    try:  # a zombie (killed, not yet reaped by its parent) is gone too
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _pick_rank_device(device: str) -> bool:
    """True for CUDA (NCCL, the rank's own GPU): the recipe's device, or an error saying why not."""
    if device != "cuda":
        return False
    if not torch.cuda.is_available():
        raise RuntimeError("the recipe trains on cuda (training.device) but this rank sees no CUDA device")
    local_world = int(os.environ["LOCAL_WORLD_SIZE"])
    if torch.cuda.device_count() < local_world:
        raise RuntimeError(
            f"{local_world} processes on this machine need a GPU each; it has {torch.cuda.device_count()}"
        )
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    return True


def main(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    work_dir = Path(job["work_dir"])
    ranks = Ranks(rank=int(os.environ["RANK"]), world=int(os.environ["WORLD_SIZE"]))
    _stop_with_the_launcher(job["launcher"])
    try:
        config = TrainingConfig(**job["training"])
        cuda = _pick_rank_device(config.device)
        # Longer than NCCL's default 10 minutes: the other ranks wait in a collective while rank 0
        # evaluates and checkpoints. A rank that dies is seen by torchrun at once, not by this.
        dist.init_process_group(backend="nccl" if cuda else "gloo", timeout=COLLECTIVE_TIMEOUT)
    except Exception as error:
        _write_error(work_dir, ranks.rank, error)
        raise
    try:
        with _leader_logger(ranks.leader) as logger:
            if ranks.leader:
                share = config.batch_size // ranks.world
                threads = f"{config.threads} thread" + ("" if config.threads == 1 else "s")
                logger.info(
                    f"data-parallel training: {ranks.world} processes, {share} sequences of each batch of "
                    f"{config.batch_size} per process, {threads} each"
                )
            outcome = train(
                LlamaConfig(**job["model"]),
                config,
                _token_file(job["train"]),
                _token_file(job["validation"]),
                work_dir,
                logger,
                ranks=ranks,
            )
            if ranks.leader:
                _write_result(work_dir, outcome, job["launch_id"])
    except Exception as error:
        _write_error(work_dir, ranks.rank, error)
        raise
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: torchrun ... -m {__spec__.name if __spec__ else 'ddp_worker'} JOB_FILE")
    main(sys.argv[1])
