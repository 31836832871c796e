"""serving.max_request_bytes against a real `aieng serve`, spoken to over raw sockets: a body
over the limit gets 413 without the server reading it whole; one of exactly the limit is read
whole and judged by the app.

The server runs with a small limit (LIMIT bytes) and no bundle (`--deployment current` on an
empty home): the limit is enforced before any handler, and the app judges a body's fields
before it needs an engine. Each test sends exactly the bytes it says and never more, so what
the server answered cannot depend on the rest of a body.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from tests.e2e.serve_helpers import Server, poll, serving

pytestmark = pytest.mark.e2e

LIMIT = 16384
GIB = 1 << 30
REPLY_TIMEOUT_S = 30


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("body-limit")
    with serving(folder, None, home=folder / "home", wait_for="/health/live", max_request_bytes=LIMIT) as running:
        yield running


def connect(server: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=REPLY_TIMEOUT_S)


def head(path: str, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


def read_reply(sock: socket.socket, then_closed: bool = True) -> tuple[int, dict[str, str], bytes, bool]:
    """(status, headers, body, closed): one response with a Content-Length body and, if
    `then_closed`, whether the server then closed the connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        received = sock.recv(65536)
        assert received, f"the connection closed before a response: {data!r}"
        data += received
    raw_head, body = data.split(b"\r\n\r\n", 1)
    status_line, *header_lines = raw_head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, value in (line.split(":", 1) for line in header_lines)}
    while len(body) < int(headers["content-length"]):
        received = sock.recv(65536)
        assert received, "the connection closed in the middle of the response body"
        body += received
    closed = then_closed and sock.recv(65536) == b""
    return int(status_line.split()[1]), headers, body, closed


def assert_413(status: int, headers: dict[str, str], body: bytes, closed: bool) -> None:
    assert status == 413, body
    error = json.loads(body)["error"]
    assert error["code"] == "request_too_large" and error["type"] == "invalid_request_error"
    assert error["message"] == f"the request body is larger than serving.max_request_bytes ({LIMIT} bytes)"
    assert headers["content-type"] == "application/json"
    assert len(headers["x-request-id"]) == 32
    assert headers["connection"] == "close" and closed


def body_ending_in_a_bad_field(size: int) -> bytes:
    """A /generate body of exactly `size` bytes whose one invalid field comes last, after
    padding: only a server that read and parsed all of it can name that field."""
    start, end = b'{"prompt": "a",', b'"max_new_tokens": 0}'
    return start + b" " * (size - len(start) - len(end)) + end


def test_a_content_length_over_the_limit_is_413_before_the_body_is_sent(server: Server) -> None:
    def refused(endpoint: str) -> float:
        return server.metric("aieng_http_requests_total", endpoint=endpoint, status="413")

    before = {endpoint: refused(endpoint) for endpoint in ("/generate", "/v1/completions")}
    with connect(server) as sock:
        # 1 GiB announced, 1 byte sent: the answer cannot wait for the rest.
        sock.sendall(head("/generate", f"Content-Length: {GIB}") + b"{")
        assert_413(*read_reply(sock))
    with connect(server) as sock:
        # A client that waits for `100 Continue` is told 413 instead, and sends nothing.
        sock.sendall(head("/generate", f"Content-Length: {GIB}", "Expect: 100-continue"))
        status, headers, body, closed = read_reply(sock)
        assert_413(status, headers, body, closed)
    with connect(server) as sock:
        # The limit is exact: one byte over, announced, no body sent.
        sock.sendall(head("/v1/completions", f"Content-Length: {LIMIT + 1}"))
        assert_413(*read_reply(sock))
    assert refused("/generate") == before["/generate"] + 2
    assert refused("/v1/completions") == before["/v1/completions"] + 1
    announced = f"request body over serving.max_request_bytes: Content-Length {GIB}"
    poll(
        lambda: len([line for line in server.log_lines() if line.get("error") == announced]) == 2,
        10,
        "both 1 GiB requests' log lines",
    )


def test_a_chunked_body_is_413_as_soon_as_it_passes_the_limit(server: Server) -> None:
    with connect(server) as sock:
        sock.sendall(head("/generate", "Transfer-Encoding: chunked"))
        piece = b" " * 1024
        for _ in range(LIMIT // len(piece)):  # exactly LIMIT bytes: not over it yet
            sock.sendall(chunk(piece))
        sock.sendall(chunk(b" "))  # one byte over; the body never ends (no last chunk)
        assert_413(*read_reply(sock))
    expected = f"request body over serving.max_request_bytes: more than {LIMIT} bytes received"
    (line,) = poll(
        lambda: [line for line in server.log_lines() if line.get("error") == expected], 10, "the 413's log line"
    )
    assert line["path"] == "/generate" and line["status"] == 413


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_of_exactly_the_limit_is_read_whole(server: Server, chunked: bool) -> None:
    body = body_ending_in_a_bad_field(LIMIT)
    assert len(body) == LIMIT
    with connect(server) as sock:
        if chunked:
            half = LIMIT // 2
            sock.sendall(head("/generate", "Transfer-Encoding: chunked"))
            sock.sendall(chunk(body[:half]) + chunk(body[half:]) + b"0\r\n\r\n")
        else:
            sock.sendall(head("/generate", f"Content-Length: {LIMIT}") + body)
        status, _headers, reply, _closed = read_reply(sock, then_closed=False)
    assert status == 400, reply
    error = json.loads(reply)["error"]
    assert error["param"] == "max_new_tokens" and error["code"] == "invalid_value"


def test_malformed_lengths_are_4xx_never_5xx(server: Server) -> None:
    """uvicorn's parser refuses what it cannot read before the app sees it: a 4xx, not a 5xx."""
    for length in (str(10**30), "-1", "12abc"):
        with connect(server) as sock:
            sock.sendall(head("/generate", f"Content-Length: {length}"))
            data = b""
            while b"\r\n" not in data:
                received = sock.recv(65536)
                assert received, f"Content-Length {length}: closed without a response"
                data += received
        status = int(data.split()[1])
        assert 400 <= status < 500, (length, data)
    assert server.get("/health/live").status == 200
