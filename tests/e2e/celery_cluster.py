"""A throwaway Celery cluster for tests: Debian's `redis-server` as broker and result backend on
127.0.0.1, and `dagster-celery worker start` workers reading configs/dagster-celery.yaml, each
in a process group of its own, stopped whatever the test did."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.e2e.cli_helpers import BIN, REPO_ROOT
from tests.e2e.postgres_server import HOST, free_port
from tests.e2e.test_dagster_dev import stop_group

READY_TIMEOUT_S = 90.0
CELERY_RUN_CONFIG = REPO_ROOT / "configs" / "dagster-celery.yaml"
MISSING_REDIS = "redis-server not found: install Debian's `redis-server` package (`make system-deps` does)"


@dataclass(frozen=True)
class RedisServer:
    port: int

    def celery_env(self) -> dict[str, str]:
        """The variables configs/dagster-celery.yaml reads: broker and result backend, two databases of one server."""
        return {
            "AIENG_CELERY_BROKER": f"redis://{HOST}:{self.port}/0",
            "AIENG_CELERY_BACKEND": f"redis://{HOST}:{self.port}/1",
        }


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1.0) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@contextmanager
def running_redis(root: Path) -> Iterator[RedisServer]:
    """redis-server with no persistence (nothing on disk to outlive the test)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise FileNotFoundError(MISSING_REDIS)
    port = free_port()
    root.mkdir(parents=True, exist_ok=True)
    command = [binary, "--bind", HOST, "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(root)]
    with (root / "redis.log").open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not _answers_ping(port):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not come up on port {port}: {(root / 'redis.log').read_text()}")
            time.sleep(0.05)
        yield RedisServer(port)
    finally:
        stop_group(process)


@dataclass
class CeleryWorker:
    name: str  # as the worker reports itself in a step's engine event: NAME@hostname
    process: subprocess.Popen[bytes]
    log: Path
    node: str = field(default="")

    def pool_pids(self) -> set[int]:
        """The pool processes that run its tasks (children of the `celery worker` process)."""
        try:
            return {child.pid for child in psutil.Process(self.process.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            return set()


def start_worker(name: str, env: dict[str, str], log_dir: Path) -> CeleryWorker:
    """`dagster-celery worker start` as docs/operations/scaling-out.md gives it, with one pool
    process (--concurrency=1), so a step on it is a step in that one process."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"celery-{name}.log"
    command = [str(BIN / "dagster-celery"), "worker", "start", "-A", "dagster_celery.app"]
    command += ["-y", str(CELERY_RUN_CONFIG), "-n", name, "--", "--concurrency=1"]
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command, cwd=REPO_ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    return CeleryWorker(name, process, log)


def wait_until_ready(workers: list[CeleryWorker]) -> None:
    """Until every worker's log says `NAME@host ready.` (it is consuming from the broker)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    for worker in workers:
        pattern = re.compile(rf"\b({re.escape(worker.name)}@\S+) ready\.")
        while not (found := pattern.search(worker.log.read_text(errors="replace"))):
            if worker.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"celery worker {worker.name} never became ready:\n{worker.log.read_text()[-4000:]}")
            time.sleep(0.1)
        worker.node = found.group(1)


@contextmanager
def running_workers(names: list[str], env: dict[str, str], log_dir: Path) -> Iterator[list[CeleryWorker]]:
    workers: list[CeleryWorker] = []
    try:
        workers = [start_worker(name, env, log_dir) for name in names]  # they start side by side
        wait_until_ready(workers)
        yield workers
    finally:
        for worker in workers:
            stop_group(worker.process)
