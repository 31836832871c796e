"""The one HTTP client for servers on loopback: the gate's drill and stress test, the server
process's readiness wait, the serving benchmark and the tests all speak through it.

Two forms over the same wire format:

- `request(port, method, path, body)` blocks (http.client) and returns a whole `Reply`:
  status, lower-cased headers, raw body, and its JSON on demand. For checks, switches and
  readiness polls, where a thread waiting is fine.
- `open_request(port, method, path, body)` (asyncio streams, one connection per request,
  `Connection: close`) returns a `StreamedReply` whose body is read chunk by chunk, and
  `sse_data(chunks)` turns a server-sent-events body into its `data:` payloads. For the load
  generator: one thread drives hundreds of requests and each chunk's arrival time is taken
  as it is read, with as little of the CPU the server shares as possible.

A JSON body (anything but bytes) is sent as `Content-Type: application/json`.
"""

from __future__ import annotations

import asyncio
import http.client
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

HOST = "127.0.0.1"
DEFAULT_TIMEOUT_S = 60.0


def encode_body(body: Any) -> bytes | None:
    if body is None or isinstance(body, bytes):
        return body
    return json.dumps(body, ensure_ascii=False).encode("utf-8")


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]  # names lower-cased
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    def json_or_none(self) -> Any:
        """The parsed body, or None when it is not JSON."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    @property
    def error(self) -> dict[str, Any]:
        """The OpenAI-style error object of an error reply (KeyError when there is none)."""
        return self.json["error"]

    @property
    def error_code(self) -> str | None:
        """`error.code` of an error reply; None when the body carries no error object."""
        return error_code(self.json_or_none())


def error_code(body: Any) -> str | None:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        code = body["error"].get("code")
        return None if code is None else str(code)
    return None


def request(
    port: int,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> Reply:
    """One request to 127.0.0.1:`port`, read to the end. OSError when nothing answers."""
    connection = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        connection.request(
            method, path, body=encode_body(body), headers={"Content-Type": "application/json", **(headers or {})}
        )
        response = connection.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        connection.close()


def status_of(port: int, path: str, timeout: float = 5.0) -> int | None:
    """The status a GET of `path` answers, or None while nothing listens (a readiness poll)."""
    try:
        return request(port, "GET", path, timeout=timeout).status
    except OSError:
        return None


# ---- streamed ------------------------------------------------------------------------------------


@dataclass
class StreamedReply:
    status: int
    headers: dict[str, str]  # names lower-cased
    reader: asyncio.StreamReader

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives: each chunk of a chunked body, else the whole body at once."""
        reader, headers = self.reader, self.headers
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    return
                data = await reader.readexactly(size)
                await reader.readexactly(2)  # the CRLF after each chunk
                yield data
        elif "content-length" in headers:
            yield await reader.readexactly(int(headers["content-length"]))
        else:
            yield await reader.read()

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])


class open_request:  # noqa: N801 - used as `async with open_request(...) as reply`, like open()
    """`async with open_request(port, "POST", path, body) as reply:` sends the request, reads
    the status line and headers, and closes the connection when the block ends."""

    def __init__(self, port: int, method: str, path: str, body: Any = None) -> None:
        payload = encode_body(body) or b""
        self.head = (
            f"{method} {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
        ).encode("ascii")
        self.port = port
        self.payload = payload
        self.writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> StreamedReply:
        reader, self.writer = await asyncio.open_connection(HOST, self.port)
        try:
            self.writer.write(self.head + self.payload)
            await self.writer.drain()
            status = int((await reader.readline()).split()[1])  # IndexError: closed before a status line
            headers: dict[str, str] = {}
            while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
        except BaseException:
            await self._close()  # __aexit__ never runs for a failed __aenter__
            raise
        return StreamedReply(status, headers, reader)

    async def __aexit__(self, *_exc: object) -> None:
        await self._close()

    async def _close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except OSError:
                pass
            self.writer = None


async def sse_data(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The `data:` payloads of a server-sent-events body, in order, as each event completes
    (`[DONE]` included, as the raw bytes b"[DONE]")."""
    buffer = b""
    async for chunk in chunks:
        buffer = (buffer + chunk).replace(b"\r\n", b"\n")
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    yield line[5:].strip()
