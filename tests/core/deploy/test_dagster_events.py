"""aieng_core.deploy.dagster_events: a CLI promote or rollback tells the Dagster webserver, and
never fails for want of it.

The request's exact form is checked against a loopback HTTP server that records it (the real
webserver accepting it is tests/e2e/test_dagster_dev.py's test); refusals, a closed port and a
webserver that never answers give one line on stderr, exit 0 and the pointer moved.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from aieng_core.cli import main
from aieng_core.deploy import dagster_events
from aieng_core.deploy.dagster_events import DAGSTER_URL_ENV, TIMEOUT_S, report_pointer_change
from aieng_core.deploy.deployments import Deployments
from tests.core.deploy import BundlePair


@dataclass
class Recorder:
    """A loopback HTTP server answering every POST with `status` and `answer`, keeping each request."""

    url: str
    status: int = 200
    answer: bytes = b"{}"
    requests: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    state = Recorder(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            state.requests.append({"path": self.path, "content_type": self.headers["Content-Type"], "body": body})
            self.send_response(state.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(state.answer)))
            self.end_headers()
            self.wfile.write(state.answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cli(capsys: pytest.CaptureFixture[str], home: Path, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["--home", str(home), "deploy", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_cli_rollback_posts_a_runless_materialization(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    deploy_home: Path,
    pair: BundlePair,
    recorder: Recorder,
) -> None:
    monkeypatch.setenv(DAGSTER_URL_ENV, recorder.url + "/")  # a trailing slash is fine
    assert cli(capsys, deploy_home, "promote", pair.a.id, "--json")[::2] == (0, "")
    assert cli(capsys, deploy_home, "promote", pair.b.id, "--json")[::2] == (0, "")
    code, out, err = cli(capsys, deploy_home, "rollback", "--reason", "latency regression", "--json")
    assert (code, err) == (0, "")
    event = json.loads(out)["event"]
    assert [r["path"] for r in recorder.requests] == ["/report_asset_materialization/production_deployment"] * 3
    # Exactly this content type: the webserver refuses any other, a charset parameter included.
    assert {r["content_type"] for r in recorder.requests} == {"application/json"}
    body = json.loads(recorder.requests[-1]["body"])
    assert body["data_version"] == f"{pair.a.id}:3"
    assert body["metadata"] == {
        "verdict": f"rollback by aieng deploy rollback: production serves {pair.a.id} (sequence 3, was {pair.b.id})",
        "bundle_id": pair.a.id,
        "sequence": 3,
        "action": "rollback",
        "from": pair.b.id,
        "actor": event["actor"],
        "reason": "latency regression",
        "time": event["time"],
        "pointer": "production",
        "reported_by": "aieng deploy rollback",
        "withdrawn": pair.b.id,
        "history_event": {key: value for key, value in event.items() if key != "figures"},
    }
    assert body["description"] == (
        f"rollback on production: {pair.b.id} -> {pair.a.id} (sequence 3), recorded by aieng deploy rollback"
    )
    first = json.loads(recorder.requests[0]["body"])
    assert (first["data_version"], first["metadata"]["from"], first["metadata"]["allow_withdrawn"]) == (
        f"{pair.a.id}:1",
        "none",
        False,
    )


def test_unset_tells_nobody_and_says_nothing(
    capsys: pytest.CaptureFixture[str], deploy_home: Path, pair: BundlePair, recorder: Recorder
) -> None:
    code, _, err = cli(capsys, deploy_home, "promote", pair.a.id)
    assert (code, err) == (0, "")
    assert recorder.requests == []
    event = Deployments(deploy_home).history()[-1]
    assert report_pointer_change(event, "production") == (
        "AIENG_DAGSTER_URL is not set: Dagster was not told; deployment_pointer_sensor records sequence 1 when it "
        "next runs"
    )


def test_another_pointer_is_not_reported(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    deploy_home: Path,
    pair: BundlePair,
    recorder: Recorder,
) -> None:
    monkeypatch.setenv(DAGSTER_URL_ENV, recorder.url)
    code, _, err = cli(capsys, deploy_home, "promote", pair.a.id, "--pointer", "canary")
    assert (code, err) == (0, "")
    assert recorder.requests == []  # production_deployment shows production only


def test_dagster_unreachable_never_fails_the_change(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, deploy_home: Path, pair: BundlePair
) -> None:
    port = closed_port()
    monkeypatch.setenv(DAGSTER_URL_ENV, f"http://127.0.0.1:{port}")
    code, out, err = cli(capsys, deploy_home, "promote", pair.a.id)
    assert code == 0 and out.startswith(f"promoted production: (none) -> {pair.a.id} (sequence 1)")
    assert err.splitlines() == [
        f"aieng: warning: Dagster at http://127.0.0.1:{port} was not told (URLError: [Errno 111] Connection "
        "refused); deployment_pointer_sensor records sequence 1 when it next runs"
    ]
    assert Deployments(deploy_home).current()["bundle_id"] == pair.a.id


@pytest.mark.parametrize(
    ("status", "answer", "said"),
    [
        (400, b'{"error": "Error constructing AssetMaterialization: bad metadata"}', "HTTP 400: Error constructing"),
        (200, b'{"error": "Not authorized to report runless asset events."}', "refused the report: Not authorized"),
        (200, b"<html>a proxy page</html>", "refused the report: not the webserver's JSON answer"),
    ],
    ids=["http-error", "error-answer", "not-json"],
)
def test_a_refused_report_is_one_line_naming_the_answer(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    deploy_home: Path,
    pair: BundlePair,
    recorder: Recorder,
    status: int,
    answer: bytes,
    said: str,
) -> None:
    recorder.status, recorder.answer = status, answer
    monkeypatch.setenv(DAGSTER_URL_ENV, recorder.url)
    code, _, err = cli(capsys, deploy_home, "promote", pair.a.id)
    assert code == 0 and len(recorder.requests) == 1
    [line] = err.splitlines()
    assert line.startswith(f"aieng: warning: Dagster at {recorder.url} ") and said in line, line
    assert line.endswith("; deployment_pointer_sensor records sequence 1 when it next runs")


def test_a_webserver_that_never_answers_costs_the_timeout_only(
    monkeypatch: pytest.MonkeyPatch, deploy_home: Path, pair: BundlePair
) -> None:
    import time

    with socket.socket() as silent:  # accepts connections (the kernel does) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        monkeypatch.setenv(DAGSTER_URL_ENV, url)
        event = Deployments(deploy_home).promote(pair.a.id, verify=False)
        started = time.monotonic()
        note = report_pointer_change(event, "production")
        waited = time.monotonic() - started
    assert note is not None and note.startswith(f"Dagster at {url} was not told (") and "timed out" in note, note
    assert TIMEOUT_S <= waited < TIMEOUT_S + 5


def test_a_url_that_is_not_http_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DAGSTER_URL_ENV, "127.0.0.1:3000")
    event = {"sequence": 4, "action": "promote", "to": "b" * 16}
    note = report_pointer_change(event, "production")
    assert note == (
        "AIENG_DAGSTER_URL='127.0.0.1:3000' is not an http:// or https:// URL: Dagster was not told; "
        "deployment_pointer_sensor records sequence 4 when it next runs"
    )
    assert dagster_events.data_version({"to": None, "sequence": 7}) == "none:7"
