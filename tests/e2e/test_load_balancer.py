"""Two `aieng serve --deployment current` replicas behind Debian's HAProxy (configs/haproxy.cfg,
as shipped, its addresses from the environment), health-checked on /health/ready.

Under steady load through the balancer (8 clients, /v1/completions, half of them streamed):
a promotion, a rollback, then one replica SIGTERMed (it drains and exits 0) and restarted on
its port. Not one request through the balancer may fail, and every response names the bundle
that answered it (X-Aieng-Bundle-Id, equal to the body's `model`). Both replicas share one
AIENG_HOME and only read its bundles: nothing under artifacts/ changes.

Figures (requests, failures, per bundle counts, swap seconds, seconds the restarted replica
took to be back in rotation) are printed (`-s`) and written to balancer.json in the test's
tmp dir. HAProxy missing is a failure naming `make system-deps`, never a skip.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from aieng_core.loadgen.http_client import request
from aieng_core.loadgen.server_process import free_port
from tests.e2e.serve_helpers import (
    REPO_ROOT,
    STOP_TIMEOUT_S,
    Server,
    deploy,
    home_with_both_bundles,
    poll,
    start_server,
)

pytestmark = pytest.mark.e2e

HAPROXY_CONFIG = REPO_ROOT / "configs" / "haproxy.cfg"
CLIENTS = 8
MAX_WAITING = 64  # every client queued rather than shed: the run measures serving, not 429s
# serving.shutdown_delay_s: after SIGTERM a replica still serves new requests this long while its
# readiness says 503, above HAProxy's worst time to mark it down (fall 2 x (inter 250 ms +
# timeout check 1 s) = 2.5 s), so the balancer stops routing to it before it refuses any.
SHUTDOWN_DELAY_S = 3
LOAD_BOUND_S = 300  # no request is sent after this bound, whatever happens (swaps take 20-50 s here)
SWAP_BOUND_S = 120
RUN = 2 * CLIENTS  # consecutive answers of the new bundle that mark a swap done
PROMPTS = [f"request {n} through the balancer" for n in range(32)]


@dataclass(frozen=True)
class Answer:
    done: float  # time.monotonic() when the answer was read in full
    status: int | None  # None: no status line came back (a transport error)
    header: str | None  # X-Aieng-Bundle-Id
    model: str | None  # the body's model (every event's, streamed)
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200 and self.header is not None and self.header == self.model


def completion(port: int, n: int) -> Answer:
    streamed = n % 2 == 1
    body: dict[str, Any] = {"prompt": PROMPTS[n % len(PROMPTS)], "max_tokens": 4, "ignore_eos": True}
    body["temperature"] = 0
    if streamed:
        body["stream"] = True
    try:
        reply = request(port, "POST", "/v1/completions", body, timeout=60)
    except OSError as exc:
        return Answer(time.monotonic(), None, None, None, f"{type(exc).__name__}: {exc}")
    header = reply.headers.get("x-aieng-bundle-id")
    if reply.status != 200:
        return Answer(time.monotonic(), reply.status, header, None, f"HTTP {reply.status}: {reply.body[:200]!r}")
    try:
        if streamed:
            events = [part[6:] for part in reply.body.decode().split("\n\n") if part.startswith("data: ")]
            if events[-1] != "[DONE]":
                raise ValueError(f"no [DONE]: {reply.body[-200:]!r}")
            models = {json.loads(event)["model"] for event in events[:-1]}
            if len(models) != 1:
                raise ValueError(f"events name {models}")
            model = models.pop()
        else:
            model = str(reply.json["model"])
    except (ValueError, KeyError, IndexError) as exc:
        return Answer(time.monotonic(), reply.status, header, None, f"{type(exc).__name__}: {exc}")
    return Answer(time.monotonic(), 200, header, model, None)


def artifacts_snapshot(home: Path) -> set[tuple[str, int, int]]:
    root = home / "artifacts"
    return {
        (str(path.relative_to(root)), path.stat().st_size, path.stat().st_mtime_ns)
        for path in root.rglob("*")
        if path.is_file()
    }


def start_haproxy(folder: Path, lb_port: int, replicas: list[Server]) -> subprocess.Popen:
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        pytest.fail("haproxy is not installed: install the Debian package `haproxy` (`make system-deps` does)")
    env = dict(os.environ)
    env.update(
        AIENG_LB_PORT=str(lb_port),
        AIENG_REPLICA_1=f"127.0.0.1:{replicas[0].port}",
        AIENG_REPLICA_2=f"127.0.0.1:{replicas[1].port}",
    )
    check = subprocess.run(
        [haproxy, "-c", "-f", str(HAPROXY_CONFIG)], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr
    log = open(folder / "haproxy.log", "wb")  # noqa: SIM115 (closed with the process, in stop_haproxy)
    proc = subprocess.Popen([haproxy, "-f", str(HAPROXY_CONFIG), "-db"], env=env, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return proc


def stop_haproxy(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT_S)


def test_two_replicas_behind_haproxy_fail_no_request(
    tmp_path: Path, serving_bundle_artifact: Any, second_bundle: Any
) -> None:
    first_id, second_id = serving_bundle_artifact.bundle.id, second_bundle.id
    home = home_with_both_bundles(second_bundle, tmp_path / "home", promote=first_id)
    before = artifacts_snapshot(home)

    replicas = [
        start_server(tmp_path / "replica1", None, home=home, max_waiting=MAX_WAITING, shutdown_delay_s=SHUTDOWN_DELAY_S)
    ]
    started: list[Server] = list(replicas)
    answers: list[Answer] = []
    lock = threading.Lock()
    stop = threading.Event()
    haproxy: subprocess.Popen | None = None
    threads: list[threading.Thread] = []
    try:
        replicas.append(
            start_server(
                tmp_path / "replica2", None, home=home, max_waiting=MAX_WAITING, shutdown_delay_s=SHUTDOWN_DELAY_S
            )
        )
        started.append(replicas[1])
        lb_port = free_port()
        haproxy = start_haproxy(tmp_path, lb_port, replicas)

        def lb_ready() -> bool:
            if haproxy is not None and haproxy.poll() is not None:
                raise AssertionError(
                    f"haproxy exited with {haproxy.returncode}: {(tmp_path / 'haproxy.log').read_text()}"
                )
            try:
                return request(lb_port, "GET", "/health/ready", timeout=5).status == 200
            except OSError:
                return False

        poll(lb_ready, 30, "haproxy to route to a ready replica")
        deadline = time.monotonic() + LOAD_BOUND_S

        def client(index: int) -> None:
            n = index
            while not stop.is_set() and time.monotonic() < deadline:
                answer = completion(lb_port, n)
                with lock:
                    answers.append(answer)
                n += CLIENTS

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(CLIENTS)]
        for thread in threads:
            thread.start()
        poll(lambda: len(answers) >= 2 * CLIENTS, 60, "the clients to be served through the balancer")

        def swap(arguments: tuple[str, ...], new: str, old: str) -> dict[str, float]:
            """Run `aieng deploy ...` under load; wait until both replicas serve `new` and a run of
            RUN consecutive answers through the balancer all came from it."""
            with lock:
                start_index = len(answers)
            started_at = time.monotonic()
            deploy(home, *arguments, "--reason", "through the balancer")

            def run_start() -> float | None:
                with lock:
                    since = answers[start_index:]
                for i in range(len(since) - RUN + 1):
                    if all(answer.header == new for answer in since[i : i + RUN]):
                        return since[i].done
                return None

            def both_serve_new() -> bool:
                return all(replica.get("/health/ready").json.get("bundle_id") == new for replica in replicas)

            poll(both_serve_new, SWAP_BOUND_S, f"both replicas to serve {new}")
            first_of_run = poll(run_start, SWAP_BOUND_S, f"{RUN} answers in a row from {new}")
            with lock:
                old_times = [answer.done for answer in answers[start_index:] if answer.header == old]
            return {
                "seconds_to_a_run_of_new_answers": round(first_of_run - started_at, 2),
                "seconds_to_last_old_answer": round(max(old_times) - started_at, 2) if old_times else 0.0,
            }

        promote = swap(("promote", second_id), second_id, first_id)
        rollback = swap(("rollback",), first_id, second_id)

        # SIGTERM replica 1 under load: it drains and exits 0; HAProxy takes it out of rotation
        # and retries what it refuses on replica 2. Then it starts again on the same port.
        old = replicas[0]
        answered_by_old = old.metric("aieng_http_requests_total", endpoint="/v1/completions", status="200")
        sigterm_at = time.monotonic()
        assert old.stop() == 0, old.log_tail()
        exited_at = time.monotonic()
        with lock:
            during_restart = len(answers)
        again = start_server(
            tmp_path / "replica1-again",
            None,
            home=home,
            port=old.port,
            max_waiting=MAX_WAITING,
            shutdown_delay_s=SHUTDOWN_DELAY_S,
        )
        started.append(again)
        ready_at = time.monotonic()
        replicas[0] = again
        poll(
            lambda: again.metric("aieng_http_requests_total", endpoint="/v1/completions", status="200") > 0,
            30,
            "haproxy to send the restarted replica traffic",
        )
        back_at = time.monotonic()
        with lock:
            now = len(answers)
        poll(lambda: len(answers) >= now + 2 * CLIENTS, 60, "answers after the restart")
        answered_by = [
            answered_by_old,
            again.metric("aieng_http_requests_total", endpoint="/v1/completions", status="200"),
            replicas[1].metric("aieng_http_requests_total", endpoint="/v1/completions", status="200"),
        ]
    finally:
        stop.set()
        for thread in threads:
            thread.join(120)
        if haproxy is not None:
            stop_haproxy(haproxy)
        codes = [server.stop() for server in started]
    assert not any(thread.is_alive() for thread in threads)
    assert codes == [0] * len(started), [server.log_tail() for server in started]

    failures = [answer for answer in answers if not answer.ok]
    by_bundle = Counter(answer.header for answer in answers if answer.ok)
    figures = {
        "clients": CLIENTS,
        "requests": len(answers),
        "failed": len(failures),
        "served_by_bundle": dict(by_bundle),
        "promote": promote,
        "rollback": rollback,
        "restart": {
            "seconds_sigterm_to_exit_0": round(exited_at - sigterm_at, 2),
            "seconds_start_to_ready": round(ready_at - exited_at, 2),
            "seconds_ready_to_back_in_rotation": round(back_at - ready_at, 2),
            "seconds_sigterm_to_back_in_rotation": round(back_at - sigterm_at, 2),
            "requests_answered_while_replica_1_was_out": now - during_restart,
        },
        "completions_answered_by_replica": {
            "replica1": answered_by[0],
            "replica1_restarted": answered_by[1],
            "replica2": answered_by[2],
        },
    }
    text = json.dumps(figures, indent=2, sort_keys=True)
    (tmp_path / "balancer.json").write_text(text + "\n", encoding="utf-8")
    print(f"\nbalancer: {text}")

    assert not failures, Counter(answer.error for answer in failures).most_common(3)
    assert set(by_bundle) == {first_id, second_id} and all(by_bundle.values()), by_bundle
    assert all(count > 0 for count in answered_by), answered_by
    assert artifacts_snapshot(home) == before, "a replica changed a file under artifacts/"
