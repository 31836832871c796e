"""A stress level is bounded in time: http_load's max_seconds, against a server that never answers."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from aieng_core.loadgen.http_load import NOT_FINISHED, LoadRequest, closed_loop, poisson


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.05)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for connection in accepted:
            connection.close()
        listener.close()


REQUESTS = [LoadRequest("hello", 1, 4)] * 6


def test_a_closed_loop_stops_sending_at_the_deadline(silent_port: int) -> None:
    started = time.perf_counter()
    records = closed_loop(silent_port, REQUESTS, concurrency=2, stream=True, max_seconds=0.3)
    assert time.perf_counter() - started < 5
    # The two clients each sent one request, which never finished; the other four were never sent.
    assert len(records) == 2
    assert all(not r.ok and r.error.startswith(NOT_FINISHED) for r in records)


def test_poisson_arrivals_after_the_deadline_are_not_sent(silent_port: int) -> None:
    records = poisson(silent_port, REQUESTS, rate=1000.0, seed=7, stream=True, max_seconds=0.3)
    # At 1000 req/s every arrival falls inside the bound: all sent, none finished.
    assert len(records) == 6 and all(r.error.startswith(NOT_FINISHED) for r in records)
    slow = poisson(silent_port, REQUESTS, rate=0.01, seed=7, stream=True, max_seconds=0.3)
    assert len(slow) == 1  # the first arrival is at 0 s; the next ones come minutes later
