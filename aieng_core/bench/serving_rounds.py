"""Running the serving benchmark's workers: each in a fresh process of its own, the peers'
order alternated from round to round (so drift in machine load over the run favours no peer).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def run_worker(
    name: str, plan_path: Path, env: dict[str, str], timeout: int, module: str = "aieng_core.bench.serving_bench"
) -> dict[str, Any]:
    """`python -m module --worker name plan_path` in a fresh process; its last stdout line's JSON."""
    command = [sys.executable, "-m", module, "--worker", name, str(plan_path)]
    started = time.perf_counter()
    # A session of its own, so a timeout stops the worker and anything it started (the server).
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise RuntimeError(f"serving benchmark worker {name!r} ran past {timeout} s and was stopped") from None
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    if process.returncode != 0:
        raise RuntimeError(f"serving benchmark worker {name!r} failed (exit {process.returncode}):\n{stderr[-4000:]}")
    return {**json.loads(stdout.strip().splitlines()[-1]), "process_wall_seconds": time.perf_counter() - started}


def peer_order(peers: Sequence[str], index: int) -> list[str]:
    """Round `index`'s order: the peers as given in even rounds, reversed in odd ones."""
    return list(peers) if index % 2 == 0 else list(reversed(peers))


def run_rounds(peers: Sequence[str], rounds: int, run: Callable[[str], dict[str, Any]]) -> list[dict[str, Any]]:
    """`rounds` records, each {"round", "order", and every peer's result}: run(peer) once per
    peer per round, one after another, in that round's order."""
    records: list[dict[str, Any]] = []
    for index in range(rounds):
        # Alternate who goes first, so drift in machine load over the run favours no peer.
        order = peer_order(peers, index)
        record: dict[str, Any] = {"round": index, "order": order}
        for peer in order:
            record[peer] = run(peer)
        records.append(record)
    return records
