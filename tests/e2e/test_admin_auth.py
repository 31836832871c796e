"""The admin API's token rules and the address the server binds.

- No AIENG_ADMIN_TOKEN: /admin/reload answers 404 `disabled`, saying how to enable it.
- A token: no or malformed Authorization is 401, a wrong token 403 (whatever its length or
  characters, never a 5xx), the right one passes (the reload of a bundle is
  tests/e2e/test_serve.py::test_admin_reload). The comparison is hmac.compare_digest of two
  equal-length digests: the bytes the client sent against the token's UTF-8 bytes.
- `aieng serve` listens on 127.0.0.1 unless `--host` says otherwise.

The servers here serve no bundle (`--deployment current` on an empty home): the token is
checked before anything else, and they are up in the time it takes to import the server.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from aieng_core.config import load_config
from aieng_core.serving.http import routes_admin
from aieng_core.serving.http.app import create_app
from tests.conftest import TINY_CONFIG
from tests.e2e.serve_helpers import AIENG, READY_TIMEOUT_S, REPO_ROOT, Reply, Server, free_port, poll

# Not ASCII on purpose: a client sends the token's UTF-8 bytes.
TOKEN = "admin-tökén-0123456789"


def launch(folder: Path, *args: str, token: str | None = None) -> Server:
    """`aieng serve --deployment current ARGS` in its own process group, once /health/live answers."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIENG_")}
    env.update(AIENG_HOME=str(folder / "home"), AIENG_CONFIG=str(TINY_CONFIG))
    if token is not None:
        env["AIENG_ADMIN_TOKEN"] = token
    port = free_port()
    log_path = folder / "server.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [AIENG, "serve", "--deployment", "current", "--port", str(port), *args],
            cwd=REPO_ROOT,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Server(proc, port, log_path, None)

    def live() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode}:\n{server.log_tail()}")
        try:
            return server.get("/health/live").status == 200
        except OSError:
            return False

    try:
        poll(live, READY_TIMEOUT_S, "/health/live")
    except BaseException:
        stop(server)
        raise
    return server


def stop(server: Server) -> None:
    try:
        assert server.stop() == 0, server.log_tail()
    finally:
        if server.proc.poll() is None:  # stop() gave up: nothing of the group outlives the test
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait()


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Started with a token and without --host."""
    server = launch(tmp_path_factory.mktemp("admin-guarded"), token=TOKEN)
    try:
        yield server
    finally:
        stop(server)


def listening_addresses(server: Server) -> set[tuple[str, int]]:
    connections = psutil.Process(server.proc.pid).net_connections(kind="tcp")
    return {(c.laddr.ip, c.laddr.port) for c in connections if c.status == psutil.CONN_LISTEN}


def reload(server: Server, authorization: bytes | None) -> Reply:
    headers: dict[str, Any] = {} if authorization is None else {"Authorization": authorization}
    return server.post("/admin/reload", {"bundle": "/nonexistent"}, headers=headers)


@pytest.mark.e2e
def test_the_server_binds_loopback_unless_told_otherwise(guarded: Server, tmp_path: Path) -> None:
    assert listening_addresses(guarded) == {("127.0.0.1", guarded.port)}
    everywhere = launch(tmp_path / "everywhere", "--host", "0.0.0.0")
    try:
        assert listening_addresses(everywhere) == {("0.0.0.0", everywhere.port)}
        # And without a token its admin API is disabled, whatever the request carries.
        for authorization in (None, b"Bearer " + TOKEN.encode()):
            disabled = reload(everywhere, authorization)
            assert disabled.status == 404, disabled.body
            assert disabled.error["code"] == "disabled" and disabled.error["type"] == "not_found_error"
            assert "AIENG_ADMIN_TOKEN" in disabled.error["message"] and "enable" in disabled.error["message"]
    finally:
        stop(everywhere)


@pytest.mark.e2e
def test_no_or_malformed_authorization_is_401(guarded: Server) -> None:
    for authorization in (None, b"", b"Bearer", b"Bearer    ", b"Basic " + TOKEN.encode(), TOKEN.encode()):
        reply = reload(guarded, authorization)
        assert reply.status == 401, (authorization, reply.body)
        assert reply.headers["www-authenticate"] == "Bearer"
        assert reply.error["type"] == "authentication_error" and reply.error["param"] == "Authorization"


@pytest.mark.e2e
def test_a_wrong_token_is_403_whatever_its_length_or_characters(guarded: Server) -> None:
    right = TOKEN.encode()
    wrong = [
        b"x",
        right[:-1],  # a prefix
        right + b"x",  # an extension
        right[:-1] + b"X",  # same length, last byte differs
        b"y" * 8192,  # far longer
        "ключ-🔑".encode(),  # other non-ASCII
        TOKEN.encode("latin-1"),  # the right characters, other bytes
    ]
    for token in wrong:
        reply = reload(guarded, b"Bearer " + token)
        assert reply.status == 403, (token[:40], reply.body)
        assert reply.error["type"] == "permission_error" and reply.error["param"] == "Authorization"
        assert b"Traceback" not in reply.body


@pytest.mark.e2e
def test_the_right_token_passes(guarded: Server) -> None:
    # Past the token, this server refuses a reload because it follows a deployment pointer:
    # the one answer that proves the token was accepted.
    for authorization in (b"Bearer " + TOKEN.encode(), b"bearer  " + TOKEN.encode() + b" "):
        reply = reload(guarded, authorization)
        assert reply.status == 409, reply.body
        assert reply.error["code"] == "follows_deployment"


def asgi_post(app: Any, path: str, headers: list[tuple[bytes, bytes]], body: bytes) -> tuple[int, dict[str, Any]]:
    """One request through the ASGI app in this process (no server, no lifespan)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)), *headers],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))


def test_tokens_are_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[Any, Any]] = []
    real = hmac.compare_digest

    def recording(a: Any, b: Any) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(routes_admin.hmac, "compare_digest", recording)
    app = create_app(Path("/nonexistent"), load_config(TINY_CONFIG), TOKEN)
    body = json.dumps({"bundle": "/nonexistent"}).encode()
    for sent, status in ((b"x", 403), (b"y" * 8192, 403), (TOKEN.encode(), 409)):
        compared.clear()
        answer, reply = asgi_post(app, "/admin/reload", [(b"authorization", b"Bearer " + sent)], body)
        assert answer == status, reply
        # One comparison, of two digests of equal length whatever the length sent.
        ((a, b),) = compared
        assert isinstance(a, bytes) and isinstance(b, bytes) and len(a) == len(b) == 32
    assert reply["error"]["code"] == "loading"  # the right token got past the check: nothing is loaded here
