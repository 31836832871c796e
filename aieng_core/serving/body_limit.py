"""A request body limit for the HTTP app, as plain ASGI middleware.

A client may not make the server read, let alone hold, more than `max_bytes` of body:

- a Content-Length over the limit is answered 413 at once, before a byte of the body is read
  (and before uvicorn sends `100 Continue` to a client that asked for it);
- a body of unknown length (chunked) is counted as it arrives, and answered 413 as soon as
  the count passes the limit; the rest is never read.

The 413 carries `Connection: close`: on a kept-alive connection the server would otherwise
go on reading (and discarding) the rest of the body to find the next request. The app below
is told the client went away (`http.disconnect`), and whatever it answers is dropped.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from aieng_core.serving.api_models import error_body
from aieng_core.serving.logs import current_context

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]

SETTING = "serving.max_request_bytes"


def too_large_body(max_bytes: int) -> bytes:
    """The server's usual error shape, naming the limit and the setting that sets it."""
    message = f"the request body is larger than {SETTING} ({max_bytes} bytes)"
    body = error_body(message, "invalid_request_error", code="request_too_large")
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


def declared_length(scope: MutableMapping[str, Any]) -> int | None:
    """The Content-Length header, or None when absent (chunked) or unreadable. uvicorn's
    parser has already refused a malformed or duplicated one with 400 before the app runs."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.response = too_large_body(max_bytes)

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = declared_length(scope)
        if length is not None and length > self.max_bytes:
            await self.refuse(send, f"Content-Length {length}")
            return

        received = 0
        refused = False
        started = False  # the app began its answer (none of ours does before reading the body)

        async def counting_receive() -> Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    refused = True
                    if not started:
                        await self.refuse(send, f"more than {self.max_bytes} bytes received")
                    return {"type": "http.disconnect"}
            return message

        async def send_unless_refused(message: Message) -> None:
            nonlocal started
            if refused:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, send_unless_refused)
        except Exception:
            # The app may raise on the disconnect it was handed (a handler reading the body
            # itself): the client already has its 413, there is nothing to report.
            if not refused:
                raise

    async def refuse(self, send: Send, why: str) -> None:
        context = current_context()
        if context is not None:  # said in the request's access log line
            context.fields["error"] = f"request body over {SETTING}: {why}"
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(self.response)).encode("latin-1")),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": self.response})
