"""One rank of data-parallel training: `torchrun ... -m aieng_core.training.ddp_worker JOB`.

torchrun gives each rank RANK, WORLD_SIZE and LOCAL_RANK and a rendezvous for
torch.distributed (gloo on CPU, NCCL on CUDA, one device per rank). The job file
(aieng_core/training/torchrun.py) says what to train; this process opens the token files
read-only, trains its share of every batch (aieng_core/training/trainer.py) and, on rank 0,
writes the weights and the outcome into the work directory's result/ atomically.

Launched by a Dagster Pipes client (DAGSTER_PIPES_CONTEXT in the environment), rank 0 logs
through Pipes, so its progress lines reach the Dagster run as they happen; the other ranks log
nothing but errors (each rank's traceback reaches torchrun's output).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
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
from aieng_core.store.atomic import atomic_directory
from aieng_core.training.corpus import TokenFile
from aieng_core.training.torchrun import RESULT_DIR, RESULT_OUTCOME, RESULT_WEIGHTS
from aieng_core.training.trainer import Ranks, TrainOutcome, train

PIPES_CONTEXT_ENV = "DAGSTER_PIPES_CONTEXT"  # set by a Pipes client for the process it launches


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


def _write_result(work_dir: Path, outcome: TrainOutcome) -> None:
    fields = {name: value for name, value in vars(outcome).items() if name != "model"}
    with atomic_directory(work_dir / RESULT_DIR) as staging:  # the launcher removed any earlier one
        save_file(unique_state_dict(outcome.model), staging / RESULT_WEIGHTS)
        (staging / RESULT_OUTCOME).write_text(json.dumps(fields, indent=2), encoding="utf-8")


def main(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    config = TrainingConfig(**job["training"])
    ranks = Ranks(rank=int(os.environ["RANK"]), world=int(os.environ["WORLD_SIZE"]))
    cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    try:
        with _leader_logger(ranks.leader) as logger:
            if ranks.leader:
                share = config.batch_size // ranks.world
                threads = f"{config.threads} thread" + ("" if config.threads == 1 else "s")
                logger.info(
                    f"data-parallel training: {ranks.world} processes, {share} sequences of each batch of "
                    f"{config.batch_size} per process, {threads} each"
                )
            work_dir = Path(job["work_dir"])
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
                _write_result(work_dir, outcome)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: torchrun ... -m {__spec__.name if __spec__ else 'ddp_worker'} JOB_FILE")
    main(sys.argv[1])
