"""Helpers of the e2e tests that run `aieng serve` as an operator does: a server process on a
free loopback port with the tiny config, its client (the project's one loopback HTTP client,
aieng_core.loadgen.http_client), polls with a deadline, and `aieng deploy` runs.

Every server is started and stopped by the test that needs it (SIGTERM, then a kill after a
bound); every wait is a poll with a deadline, never a sleep of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import yaml
from prometheus_client.parser import text_string_to_metric_families

from aieng_core.loadgen.http_client import Reply, request
from aieng_core.loadgen.server_process import free_port
from tests.conftest import TINY_CONFIG

REPO_ROOT = Path(__file__).resolve().parents[2]
AIENG = str(Path(sys.executable).parent / "aieng")
READY_TIMEOUT_S = 120
STOP_TIMEOUT_S = 30
POLL_S = 0.02
# Long work by volume: this many sequences of LONG_TOKENS tokens keep the tiny engine busy for
# hundreds of steps (its 16 slots take them in waves).
LONG_INPUTS = 200
LONG_TOKENS = 50


def poll(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(POLL_S)


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    log_path: Path
    bundle_path: Path | None

    def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, Any] | None = None, timeout: float = 120
    ) -> Reply:
        """One request, read to the end (a JSON body unless `body` is bytes); OSError when nothing answers."""
        return request(self.port, method, path, body, headers, timeout)

    def post(self, path: str, body: Any, headers: dict[str, Any] | None = None) -> Reply:
        return self.call("POST", path, body, headers)

    def get(self, path: str) -> Reply:
        return self.call("GET", path)

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = self.get("/metrics").body.decode()
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the series of `name` that carry these labels (whatever their others: a
        request series also names the bundle that answered)."""
        wanted = set(labels.items())
        return sum(value for (n, have), value in self.metrics().items() if n == name and wanted <= set(have))

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.log_path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("{"):
                lines.append(json.loads(line))
        return lines

    def log_tail(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")[-4000:]

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="unused", max_retries=0, timeout=60)

    def wait_idle(self, max_batch: int = 16, timeout: float = 30) -> None:
        """Every KV slot free again, nothing running or waiting."""

        def idle() -> bool:
            m = self.metrics()
            return (
                m[("aieng_kv_cache_free_slots", ())] == max_batch
                and m[("aieng_num_requests_running", ())] == 0
                and m[("aieng_num_requests_waiting", ())] == 0
            )

        poll(idle, timeout, "the engine to be idle with every slot free")

    def wait_running(self, timeout: float = 30) -> None:
        poll(lambda: self.metric("aieng_num_requests_running") > 0, timeout, "a running sequence")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT_S)
        return self.proc.returncode


def long_predict(server: Server, tag: str, inputs: int = LONG_INPUTS) -> Reply:
    """One /predict of `inputs` sequences of LONG_TOKENS ignore_eos tokens: long work by volume."""
    body = {
        "inputs": [f"{tag} {n}" for n in range(inputs)],
        "options": {"max_new_tokens": LONG_TOKENS, "ignore_eos": True, "temperature": 0},
    }
    return server.post("/predict", body, headers={"X-Request-ID": f"long-{tag}"})


def raw_request(port: int, path: str, body: dict[str, Any]) -> socket.socket:
    """A POST over a raw socket, its answer left unread: closing the socket is a client disconnecting."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


def home_with_both_bundles(second_bundle: Any, home: Path, promote: str | None = None) -> Path:
    """A copy at `home` of the store holding the session's bundle and `second_bundle` (the
    conftest fixture), with `promote` (a bundle id) promoted to production when given."""
    from aieng_core.deploy.deployments import Deployments

    shutil.copytree(second_bundle.path.parents[2], home)
    if promote is not None:
        Deployments(home).promote(promote, reason="before the test")
    return home


def write_config(folder: Path, **serving: Any) -> Path:
    config = yaml.safe_load(TINY_CONFIG.read_text(encoding="utf-8"))
    config["serving"].update(serving)
    path = folder / "serving-config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def start_server(
    folder: Path,
    bundle_path: Path | None,
    admin_token: str | None = None,
    home: Path | None = None,
    wait_for: str = "/health/ready",
    environment: dict[str, str] | None = None,
    port: int | None = None,
    **serving: Any,
) -> Server:
    """`aieng serve --bundle PATH`, or with bundle_path None `aieng serve --deployment current`
    following the production pointer under `home`; `environment` is added to the server's
    (which never inherits the caller's AIENG_* or OTEL_* variables: no test server exports
    traces to a collector the developer's shell names). `port` None: a free one (a replica
    restarted behind a load balancer is given its old one)."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIENG_", "OTEL_"))}
    env.update(AIENG_HOME=str(home or folder / "home"), AIENG_CONFIG=str(write_config(folder, **serving)))
    env.update(environment or {})
    if admin_token is not None:
        env["AIENG_ADMIN_TOKEN"] = admin_token
    port = free_port() if port is None else port
    log_path = folder / "server.log"
    serving_what = ["--bundle", str(bundle_path)] if bundle_path is not None else ["--deployment", "current"]
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [AIENG, "serve", *serving_what, "--port", str(port)],
            cwd=REPO_ROOT,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    server = Server(proc, port, log_path, bundle_path)

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode}:\n{server.log_tail()}")
        try:
            return server.get(wait_for).status == 200
        except OSError:
            return False

    try:
        poll(ready, READY_TIMEOUT_S, wait_for)
    except BaseException:
        server.stop()
        raise
    return server


@contextmanager
def serving(folder: Path, bundle_path: Path | None, **options: Any) -> Iterator[Server]:
    """start_server (the same arguments) for a module's tests, stopped at the end; its exit
    must be a clean 0."""
    running = start_server(folder, bundle_path, **options)
    try:
        yield running
    finally:
        assert running.stop() == 0, running.log_tail()


def flip_one_byte(path: Path) -> None:
    """Change one byte in the middle of a file (every bit of it), as a bad disk or a hand might."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def greedy_answers(server: Server) -> list[list[int]]:
    """The token ids of a few greedy generations: what "serving the same bundle" answers."""
    bodies = [{"prompt": prompt, "max_new_tokens": 8, "temperature": 0} for prompt in ("still", "The data pipeline")]
    replies = [server.post("/generate", body) for body in bodies]
    assert all(reply.status == 200 for reply in replies), [reply.body for reply in replies]
    return [reply.json["token_ids"] for reply in replies]


def run_deploy(home: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    """`aieng deploy ...  --json` against `home`, as an operator runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIENG_")}
    env.update(AIENG_HOME=str(home), AIENG_CONFIG=str(TINY_CONFIG))
    return subprocess.run(
        [AIENG, "deploy", *arguments, "--json"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def deploy(home: Path, *arguments: str) -> dict[str, Any]:
    """A deploy command that must succeed: its JSON."""
    result = run_deploy(home, *arguments)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def deploy_refused(home: Path, *arguments: str) -> str:
    """A deploy command that must be refused: exit 1, nothing on stdout; its stderr."""
    result = run_deploy(home, *arguments)
    assert result.returncode == 1 and result.stdout == "", (result.returncode, result.stdout, result.stderr[-3000:])
    return result.stderr
