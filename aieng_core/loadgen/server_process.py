"""A real `aieng serve` process for the serving benchmark and the promotion gate: started on a
free loopback port, waited on until /health/ready answers 200 (or, following a deployment
pointer, until /health/live does: the pointer may name no bundle), and always stopped
(SIGTERM, then SIGKILL).

Its log goes to a file, not a pipe: a pipe nobody reads fills up and stalls the server.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import psutil

from aieng_core.loadgen.http_client import status_of

READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class ServerProcess:
    """`with ServerProcess(bundle, log_path, env) as server:` ... server.port, server.pid.

    With `pointer` (and bundle None) the server follows that deployment pointer of the
    $AIENG_HOME in `env` (`aieng serve --deployment current --pointer NAME`)."""

    def __init__(self, bundle: Path | None, log_path: Path, env: dict[str, str], pointer: str | None = None) -> None:
        if (bundle is None) == (pointer is None):
            raise ValueError("serve either a bundle or a deployment pointer")
        self.bundle = bundle
        self.pointer = pointer
        self.log_path = log_path
        self.request_log_path = log_path.with_name(log_path.name + ".requests.jsonl")
        self.env = env
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.ready_seconds = 0.0

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def __enter__(self) -> ServerProcess:
        command = [sys.executable, "-m", "aieng_core.cli", "serve"]
        if self.pointer is not None:
            command += ["--deployment", "current", "--pointer", self.pointer]
        else:
            command += ["--bundle", str(self.bundle)]
        # Its request log beside its server log: a gate's or a benchmark's traffic is never
        # mixed into the home's own log of the answers production gave.
        command += ["--request-log", str(self.request_log_path)]
        command += ["--host", "127.0.0.1", "--port", str(self.port)]
        up_path = "/health/ready" if self.pointer is None else "/health/live"
        started = time.perf_counter()
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        try:
            while status_of(self.port, up_path) != 200:
                if self.process.poll() is not None:
                    raise RuntimeError(f"aieng serve exited with {self.process.returncode}:\n{self.log_tail()}")
                if time.perf_counter() - started > READY_TIMEOUT_S:
                    raise RuntimeError(f"aieng serve not ready after {READY_TIMEOUT_S:.0f} s:\n{self.log_tail()}")
                time.sleep(0.1)
        except BaseException:
            self.stop()
            raise
        self.ready_seconds = time.perf_counter() - started
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    def stop(self) -> int | None:
        """SIGTERM (the server drains and exits 0), SIGKILL if it does not within STOP_TIMEOUT_S."""
        process = self.process
        if process is None or process.poll() is not None:
            return None if process is None else process.returncode
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait(STOP_TIMEOUT_S)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process so far, all its threads."""
        times = psutil.Process(self.pid).cpu_times()
        return float(times.user + times.system)
