"""Helpers of the in-process HTTP tests: the app of `aieng serve` under a real uvicorn on a
loopback port, in a thread of the test process, stopped when the block ends."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI

from aieng_core.loadgen.http_client import Reply, request
from aieng_core.loadgen.server_process import free_port
from aieng_core.serving.http.state import ServingState

READY_TIMEOUT_S = 60.0


@dataclass
class InProcessServer:
    port: int
    state: ServingState

    def call(self, method: str, path: str, body: Any = None, headers: dict[str, Any] | None = None) -> Reply:
        return request(self.port, method, path, body, headers, timeout=30)

    def post(self, path: str, body: Any, headers: dict[str, Any] | None = None) -> Reply:
        return self.call("POST", path, body, headers)

    def get(self, path: str) -> Reply:
        return self.call("GET", path)


@contextmanager
def serving(app: FastAPI, ready_path: str = "/health/ready") -> Iterator[InProcessServer]:
    """The app under uvicorn in a thread, once `ready_path` answers 200."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="on"))
    thread = threading.Thread(target=server.run, name="uvicorn-under-test", daemon=True)
    thread.start()
    running = InProcessServer(port, app.state.serving)
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while True:
            try:
                if running.get(ready_path).status == 200:
                    break
            except OSError:
                pass  # not listening yet
            if not thread.is_alive():
                raise AssertionError("uvicorn exited before the app was ready")
            if time.monotonic() > deadline:
                raise AssertionError(f"{ready_path} did not answer 200 within {READY_TIMEOUT_S} s")
            time.sleep(0.02)
        yield running
    finally:
        server.should_exit = True
        thread.join(READY_TIMEOUT_S)
