"""`aieng serve` under load and faults, as the issue words it: 10,000 requests at concurrency 64
(no 5xx, flat RSS, P50/P99), SIGTERM under load (no accepted request lost), promote and
rollback under load (no failed request), and slow streaming readers (they hold no more than
their own KV slot and slow nobody else down).

Each test runs a real `aieng serve` on 127.0.0.1 with the tiny bundle (serve_helpers.py, and
the bundles of conftest.py); the load comes from aieng_core.loadgen.http_load (the benchmark's
and the gate's load generator). Every load is bounded in requests and seconds. Figures are
printed (`-s` shows them) and written to a JSON file in the test's tmp dir.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from aieng_core.loadgen.http_client import request
from aieng_core.loadgen.http_load import COMPLETIONS, GENERATE, LoadRequest, closed_loop
from aieng_core.loadgen.stats import RequestRecord, percentile
from tests.e2e.serve_helpers import STOP_TIMEOUT_S, Server, deploy, home_with_both_bundles, poll, serving, start_server

pytestmark = pytest.mark.e2e

TOTAL_REQUESTS = 10_000  # the figures: do not lower them to save time
CONCURRENCY = 64
SEGMENT = 1_000  # RSS is sampled after every thousand responses
SEGMENT_BOUND_S = 60  # a thousand take 5 to 20 s here; none is sent after this bound
MAX_RSS_DRIFT = 0.10
# The queue holds every client (16 slots + 48 waiting < 64): the run measures the server
# serving, not shedding; a 429 would still be counted, never taken for a failure.
MAX_WAITING = CONCURRENCY
MAX_SLOTS = 16  # the tiny bundle's max_batch
PROMPTS = [f"request {n} of the data pipeline" for n in range(64)]


def report(tmp_path: Path, name: str, figures: dict[str, Any]) -> None:
    text = json.dumps(figures, indent=2, sort_keys=True)
    (tmp_path / f"{name}.json").write_text(text + "\n", encoding="utf-8")
    print(f"\n{name}: {text}")


def status_of(record: RequestRecord) -> int | None:
    """The HTTP status a request got: 200 when answered in full, the status of a refusal,
    None when no status line came back (a transport error)."""
    if record.ok:
        return 200
    if record.error is not None and record.error.startswith("HTTP "):
        return int(record.error.split()[1].rstrip(":"))
    return None


@pytest.fixture(scope="module")
def prompt_tokens(bundle_path: Path) -> dict[str, int]:
    """How many tokens the bundle's tokenizer makes of each prompt (the server's usage is checked against it)."""
    from aieng_core.tokenizer.bpe import load_tokenizer

    tokenizer = load_tokenizer(bundle_path)
    return {prompt: len(tokenizer.encode(prompt, add_special_tokens=False).ids) for prompt in PROMPTS}


def mixed_requests(count: int, prompt_tokens: dict[str, int]) -> list[LoadRequest]:
    """/generate, /v1/completions and /v1/completions streamed in turn, 1 to 8 new tokens."""
    kinds = [(GENERATE, False), (COMPLETIONS, False), (COMPLETIONS, True)]
    requests = []
    for n in range(count):
        endpoint, stream = kinds[n % len(kinds)]
        prompt = PROMPTS[n % len(PROMPTS)]
        requests.append(LoadRequest(prompt, prompt_tokens[prompt], 1 + n % 8, endpoint=endpoint, stream=stream))
    return requests


@pytest.fixture(scope="module")
def load_server(tmp_path_factory: pytest.TempPathFactory, bundle_path: Path) -> Any:
    with serving(tmp_path_factory.mktemp("serve-load"), bundle_path, max_waiting=MAX_WAITING) as running:
        yield running


# ---- 10,000 requests at concurrency 64 --------------------------------------------------------------


def test_ten_thousand_requests_at_concurrency_64(
    load_server: Server, prompt_tokens: dict[str, int], tmp_path: Path
) -> None:
    server = load_server
    requests = mixed_requests(TOTAL_REQUESTS, prompt_tokens)
    process = psutil.Process(server.proc.pid)
    records: list[RequestRecord] = []
    rss_mib: list[float] = []
    cpu_before, client_cpu_before = process.cpu_times(), time.process_time()
    started = time.perf_counter()
    for first in range(0, TOTAL_REQUESTS, SEGMENT):
        segment = requests[first : first + SEGMENT]
        records += closed_loop(server.port, segment, CONCURRENCY, stream=False, max_seconds=SEGMENT_BOUND_S)
        rss_mib.append(process.memory_info().rss / 2**20)
    seconds = time.perf_counter() - started
    cpu_after = process.cpu_times()
    server_cpu_s = cpu_after.user + cpu_after.system - cpu_before.user - cpu_before.system
    client_cpu_s = time.process_time() - client_cpu_before

    statuses = Counter(status_of(record) for record in records)
    latencies = [record.e2el for record in records if record.ok]
    figures = {
        "requests_sent": len(requests),
        "responses_received": sum(status is not None for status in statuses.elements()),
        "status_counts": {str(status): count for status, count in sorted(statuses.items(), key=str)},
        "server_5xx": sum(count for status, count in statuses.items() if status is not None and status >= 500),
        "server_429": statuses[429],
        "concurrency": CONCURRENCY,
        "seconds": round(seconds, 1),
        "requests_per_second": round(len(records) / seconds, 1),
        # What the run costs whatever else the machine does: on two idle cores it cannot take
        # less than max(server, (server + client) / 2) seconds.
        "server_cpu_seconds": round(server_cpu_s, 1),
        "client_cpu_seconds": round(client_cpu_s, 1),
        "load_average_1min": round(os.getloadavg()[0], 1),
        "latency_ms": {f"p{q}": round(percentile(latencies, q) * 1000, 1) for q in (50, 90, 99)} if latencies else {},
        "rss_mib_after_each_thousand": [round(mib, 1) for mib in rss_mib],
        "rss_drift": round(rss_mib[-1] / rss_mib[0] - 1, 4),
    }
    report(tmp_path, "load", figures)

    assert len(records) == TOTAL_REQUESTS, f"{TOTAL_REQUESTS - len(records)} requests not sent within the bound"
    failures = [r.error for r in records if not r.ok and status_of(r) != 429]
    assert not failures, f"{len(failures)} failed requests, e.g. {Counter(failures).most_common(3)}"
    assert figures["server_5xx"] == 0
    assert figures["responses_received"] == TOTAL_REQUESTS
    assert statuses[200] + statuses[429] == TOTAL_REQUESTS
    assert abs(figures["rss_drift"]) <= MAX_RSS_DRIFT, figures["rss_mib_after_each_thousand"]
    # The server counted exactly what the client saw.
    counted = sum(
        server.metric("aieng_http_requests_total", endpoint=endpoint, status="200")
        for endpoint in (GENERATE, COMPLETIONS)
    )
    assert counted == statuses[200]
    assert server.metric("aieng_requests_rejected_total", reason="overloaded") == statuses[429]
    server.wait_idle()


# ---- slow streaming readers ---------------------------------------------------------------------------

SLOW_READERS = 4
SLOW_TOKENS = 48
SLOW_EVENTS = 4  # events each slow reader reads at one per second, before it reads the rest at once
RECEIVE_BUFFER = 2048  # bytes: a small window, so what the reader has not read stays with the server


class SlowReader:
    """A client that streams a completion over a socket with a small receive buffer and reads
    it one server-sent event at a time: the chunked body is decoded by hand, 256 bytes a read,
    so the client never reads much ahead of the event it is asked for."""

    def __init__(self, port: int, prompt: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        self.sock.settimeout(60)
        self.sock.connect(("127.0.0.1", port))
        body = json.dumps(
            {"prompt": prompt, "max_tokens": SLOW_TOKENS, "ignore_eos": True, "temperature": 0, "stream": True,
             "stream_options": {"include_usage": True}}
        ).encode()  # fmt: skip
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        self.sock.sendall(head.encode() + body)
        self.buffer = b""
        self.pending = b""  # decoded body bytes not yet returned as events
        self.events: list[bytes] = []
        status_line = self._line()
        assert status_line.startswith(b"HTTP/1.1 200"), status_line
        while self._line():
            pass  # headers (the body is chunked: SSE)

    def _more(self) -> None:
        data = self.sock.recv(256)
        if not data:
            raise ConnectionError("the server closed the stream")
        self.buffer += data

    def _line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            self._more()
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def _exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            self._more()
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def next_event(self) -> bytes | None:
        """The next event's data, None once the body has ended."""
        while b"\n\n" not in self.pending:
            size = int(self._line(), 16)
            if size == 0:
                return None
            self.pending += self._exactly(size)
            self._exactly(2)
        event, self.pending = self.pending.split(b"\n\n", 1)
        assert event.startswith(b"data: "), event
        self.events.append(event[6:])
        return event[6:]

    def close(self) -> None:
        self.sock.close()


def fast_batch(server: Server, prompt_tokens: dict[str, int]) -> tuple[float, list[RequestRecord]]:
    requests = [LoadRequest(p, prompt_tokens[p], 8, endpoint=GENERATE) for p in PROMPTS[:48]]
    started = time.perf_counter()
    records = closed_loop(server.port, requests, 8, stream=False, max_seconds=60)
    return time.perf_counter() - started, records


def test_slow_streaming_readers_hold_only_their_own_slots(
    load_server: Server, prompt_tokens: dict[str, int], tmp_path: Path
) -> None:
    server = load_server
    server.wait_idle()
    baseline_s, baseline = fast_batch(server, prompt_tokens)
    assert all(r.ok for r in baseline), [r.error for r in baseline if not r.ok]
    generated_before = server.metric("aieng_generation_tokens_total")

    readers = [SlowReader(server.port, f"slow reader {n}") for n in range(SLOW_READERS)]
    try:
        for reader in readers:
            assert reader.next_event() is not None
        # The engine does not wait for a reader: every slow stream's tokens are generated at
        # once and its slot freed, while its reader has read one event. What it has not read
        # waits in the request's output queue (at most max_tokens outputs) and socket buffers.
        poll(
            lambda: server.metric("aieng_generation_tokens_total") - generated_before == SLOW_READERS * SLOW_TOKENS,
            10,
            "the slow streams' tokens to be generated",
        )
        read_when_generated = [len(reader.events) for reader in readers]
        running_while_slow = server.metric("aieng_num_requests_running")
        free_while_slow = server.metric("aieng_kv_cache_free_slots")

        # Fast clients meanwhile: served at the speed they had without slow readers.
        paced_started = time.monotonic()
        with_slow_s, with_slow = fast_batch(server, prompt_tokens)
        assert all(r.ok for r in with_slow), [r.error for r in with_slow if not r.ok]
        running_after_fast = server.metric("aieng_num_requests_running")
        free_after_fast = server.metric("aieng_kv_cache_free_slots")

        # One event per second each, the readers in turn (the wait paces them, not luck).
        for second in range(1, SLOW_EVENTS):
            time.sleep(max(0.0, paced_started + second - time.monotonic()))
            for reader in readers:
                assert reader.next_event() is not None
        read_slowly = [len(reader.events) for reader in readers]
        in_flight_slow = server.metric("aieng_num_requests_running")
        for reader in readers:  # then the rest at once: every token arrives, in order, then [DONE]
            while reader.next_event() is not None:
                pass
    finally:
        for reader in readers:
            reader.close()

    figures = {
        "slow_readers": SLOW_READERS,
        "slow_tokens_each": SLOW_TOKENS,
        "events_read_when_all_tokens_were_generated": read_when_generated,
        "events_read_at_one_per_second": read_slowly,
        "kv_slots_busy_while_slow_readers_read": MAX_SLOTS - free_while_slow,
        "requests_running_while_slow_readers_read": running_while_slow,
        "requests_running_after_fast_batch": running_after_fast,
        "requests_running_after_slow_reading": in_flight_slow,
        "fast_batch_seconds_without_slow_readers": round(baseline_s, 3),
        "fast_batch_seconds_with_slow_readers": round(with_slow_s, 3),
    }
    report(tmp_path, "slow-readers", figures)

    # A slow reader holds no more than its own slot: here none, since its generation is over.
    assert running_while_slow == 0 and free_while_slow == MAX_SLOTS
    assert running_after_fast == 0 and free_after_fast == MAX_SLOTS and in_flight_slow == 0
    assert all(read < SLOW_TOKENS for read in read_when_generated)
    assert with_slow_s <= 3 * baseline_s + 1.0, figures
    for reader in readers:
        *tokens, usage, done = reader.events
        assert done == b"[DONE]"
        assert json.loads(usage)["usage"]["completion_tokens"] == SLOW_TOKENS
        choices = [json.loads(event)["choices"][0] for event in tokens]
        assert [c["finish_reason"] for c in choices] == [None] * (len(choices) - 1) + ["length"]
    server.wait_idle()


# ---- SIGTERM under load ---------------------------------------------------------------------------

DRAIN_CLIENTS = 32
DRAIN_TOKENS = 24
DRAIN_BOUND_S = 120  # no client runs longer, whatever the server does


@dataclass
class Outcome:
    """One request of the drain test, as its client saw it."""

    kind: str  # completed | refused | failed
    sent: float
    answered: float | None = None  # when the status line arrived
    finished: float | None = None  # when the whole answer had arrived
    detail: str = ""


def send_and_classify(port: int, n: int) -> Outcome:
    """One request: completed (200 and the whole answer); refused (503 draining, connection
    refused, or the connection closed before any byte of a response: a request the server
    never read, sent as it closed); else failed, with why (a truncated 200 among them).

    By hand (http.client), not through http_client.request: the status line's arrival is timed
    apart from the body's end, and each way a transport can fail is told apart."""
    streamed = n % 2 == 1
    path = "/v1/completions" if streamed else "/generate"
    body: dict[str, Any] = {"prompt": f"drain {n}", "ignore_eos": True, "temperature": 0}
    if streamed:
        body.update(max_tokens=DRAIN_TOKENS, stream=True, stream_options={"include_usage": True})
    else:
        body["max_new_tokens"] = DRAIN_TOKENS
    outcome = Outcome("failed", time.monotonic())
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        try:
            connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            response = connection.getresponse()
        except ConnectionRefusedError:
            outcome.kind, outcome.detail = "refused", "connection refused"
            return outcome
        except (ConnectionError, http.client.RemoteDisconnected) as exc:
            outcome.kind, outcome.detail = "refused", f"closed before any response byte ({type(exc).__name__})"
            return outcome
        outcome.answered = time.monotonic()
        try:
            data = response.read()
        except (http.client.IncompleteRead, ConnectionError) as exc:
            outcome.detail = f"{response.status} cut short: {type(exc).__name__}"
            return outcome
        outcome.finished = time.monotonic()
        if response.status == 503 and json.loads(data)["error"]["code"] == "draining":
            outcome.kind, outcome.detail = "refused", "503"
        elif response.status != 200:
            outcome.detail = f"HTTP {response.status}: {data[:200]!r}"
        elif streamed:
            events = [line[6:] for line in data.decode().split("\n\n") if line.startswith("data: ")]
            usage = json.loads(events[-2])["usage"] if len(events) >= 2 and events[-1] == "[DONE]" else {}
            complete = usage.get("completion_tokens") == DRAIN_TOKENS
            outcome.kind, outcome.detail = ("completed", "") if complete else ("failed", f"stream: {data[-300:]!r}")
        else:
            complete = json.loads(data)["tokens"] == DRAIN_TOKENS
            outcome.kind, outcome.detail = ("completed", "") if complete else ("failed", f"body: {data[:300]!r}")
        return outcome
    finally:
        connection.close()


def test_sigterm_under_load_loses_no_accepted_request(load_server: Server, tmp_path: Path) -> None:
    """The last test of the module's server: it ends it (its teardown then finds it exited 0)."""
    server = load_server
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    deadline = time.monotonic() + DRAIN_BOUND_S

    def client(index: int) -> None:
        n = index
        while time.monotonic() < deadline:  # until the first refusal
            outcome = send_and_classify(server.port, n)
            with lock:
                outcomes.append(outcome)
            if outcome.kind == "refused":
                return
            n += DRAIN_CLIENTS

    try:
        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(DRAIN_CLIENTS)]
        for thread in threads:
            thread.start()
        poll(lambda: len(outcomes) >= DRAIN_CLIENTS, 60, "requests to complete under load")
        server.wait_running()
        sigterm = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(DRAIN_BOUND_S)
        assert not any(thread.is_alive() for thread in threads), "a client still runs after the bound"
        exit_code = server.proc.wait(STOP_TIMEOUT_S)
    finally:
        server.stop()

    kinds = Counter(outcome.kind for outcome in outcomes)
    accepted = [o for o in outcomes if o.answered is not None and o.kind != "refused"]
    in_flight_at_sigterm = [o for o in outcomes if o.kind == "completed" and o.sent < sigterm < (o.finished or 0.0)]
    refusals = Counter(o.detail for o in outcomes if o.kind == "refused")
    figures = {
        "clients": DRAIN_CLIENTS,
        "requests": len(outcomes),
        "accepted": len(accepted),
        "completed": kinds["completed"],
        "refused": kinds["refused"],
        "refused_by": dict(refusals),
        "failed": kinds["failed"],
        "completed_in_flight_at_sigterm": len(in_flight_at_sigterm),
        "exit_code": exit_code,
    }
    report(tmp_path, "drain", figures)

    assert kinds["failed"] == 0, [o.detail for o in outcomes if o.kind == "failed"][:5]
    assert len(accepted) == kinds["completed"]
    assert kinds["refused"] == DRAIN_CLIENTS  # each client stops at its first refusal
    # Only a request sent after SIGTERM may find its connection closed unanswered (the drain
    # ended as it arrived); every one sent before was answered.
    unanswered = [o for o in outcomes if o.kind == "refused" and o.detail.startswith("closed")]
    assert all(o.sent > sigterm for o in unanswered)
    assert in_flight_at_sigterm, "no request was in flight when SIGTERM came: the drain was not exercised"
    assert exit_code == 0, server.log_tail()
    messages = [line["message"] for line in server.log_lines()]
    assert "drained: no request in flight; shutting down" in messages


# ---- promote and rollback under load ---------------------------------------------------------------

SWAP_CLIENTS = 32
SWAP_BOUND_S = 300  # no client runs longer, whatever the server does


def completion_model(port: int, n: int) -> str:
    """One /v1/completions (streamed every other time) that must succeed; the bundle id that served it."""
    streamed = n % 2 == 1
    body = {"prompt": PROMPTS[n % len(PROMPTS)], "max_tokens": 4, "ignore_eos": True, "temperature": 0}
    if streamed:
        body["stream"] = True
    reply = request(port, "POST", "/v1/completions", body, timeout=60)
    data = reply.body
    if reply.status != 200:
        raise AssertionError(f"HTTP {reply.status}: {data[:300]!r}")
    if not streamed:
        return str(reply.json["model"])
    events = [line[6:] for line in data.decode().split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]", data[-300:]
    models = {json.loads(event)["model"] for event in events[:-1]}
    assert len(models) == 1, models
    return models.pop()


def test_promote_and_rollback_under_load_fail_no_request(
    tmp_path: Path, serving_bundle_artifact: Any, second_bundle: Any
) -> None:
    first_id, second_id = serving_bundle_artifact.bundle.id, second_bundle.id
    home = home_with_both_bundles(second_bundle, tmp_path / "home", promote=first_id)
    server = start_server(tmp_path / "server", None, home=home, max_waiting=MAX_WAITING)
    stop = threading.Event()
    served: list[str] = []
    failures: list[str] = []
    lock = threading.Lock()
    deadline = time.monotonic() + SWAP_BOUND_S

    def client(index: int) -> None:
        n = index
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                model = completion_model(server.port, n)
            except (AssertionError, OSError, ValueError, KeyError) as exc:
                with lock:
                    failures.append(f"{type(exc).__name__}: {exc}")
            else:
                with lock:
                    served.append(model)
            n += SWAP_CLIENTS

    def serving(bundle_id: str) -> bool:
        ready = server.get("/health/ready")
        return ready.status == 200 and ready.json["bundle_id"] == bundle_id

    # With the clients running: `aieng deploy promote` of the second bundle, then `rollback`.
    switches = ((("promote", second_id), second_id), (("rollback",), first_id))
    try:
        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(SWAP_CLIENTS)]
        for thread in threads:
            thread.start()
        try:
            poll(lambda: len(served) >= SWAP_CLIENTS, 60, "the clients to be served")
            for arguments, expected in switches:
                deploy(home, *arguments, "--reason", "under load")
                poll(lambda expected=expected: serving(expected), 60, f"the server to serve {expected}")
                before = len(served)
                poll(lambda before=before: len(served) >= before + SWAP_CLIENTS, 60, "requests after the switch")
        finally:
            stop.set()
            for thread in threads:
                thread.join(120)
        assert not any(thread.is_alive() for thread in threads)
        swaps = [ln for ln in server.log_lines() if ln["message"].startswith("following the production pointer")]
    finally:
        assert server.stop() == 0, server.log_tail()

    by_bundle = Counter(served)
    figures = {
        "clients": SWAP_CLIENTS,
        "switches": [arguments[0] for arguments, _ in switches],
        "requests": len(served) + len(failures),
        "failed": len(failures),
        "served_by_bundle": dict(by_bundle),
        "seconds_to_load_verify_and_warm_each_bundle": [round(line["latency_ms"] / 1000, 2) for line in swaps],
    }
    report(tmp_path, "swap", figures)
    assert not failures, Counter(failures).most_common(3)
    assert set(by_bundle) == {first_id, second_id} and all(by_bundle.values())
    assert len(swaps) == len(switches)
