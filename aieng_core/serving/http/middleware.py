"""The ASGI middleware of the HTTP app, outermost first.

RequestContextMiddleware binds the request id (X-Request-ID, else generated) for every log
line of the request, echoes it in the response header beside X-Aieng-Bundle-Id and
X-Aieng-Data-Version (provenance.py: on every response, errors and streams included), counts
the response by endpoint and status, writes one access log line and one request log record
(store/request_log.py; health probes and /metrics scrapes are in neither), and turns an
exception that escaped a handler into a 500 naming only the request id. When the server
traces (tracing.py), it also opens and ends the request's server span (probes and scrapes
have none either) and echoes its `traceparent` in the response.

BodyLimitMiddleware: a client may not make the server read, let alone hold, more than
`max_bytes` of body:

- a Content-Length over the limit is answered 413 at once, before a byte of the body is read
  (and before uvicorn sends `100 Continue` to a client that asked for it);
- a body of unknown length (chunked) is counted as it arrives, and answered 413 as soon as
  the count passes the limit; the rest is never read.

The 413 carries `Connection: close`: on a kept-alive connection the server would otherwise
go on reading (and discarding) the rest of the body to find the next request. The app below
is told the client went away (`http.disconnect`), and whatever it answers is dropped. It sits
inside RequestContextMiddleware, so a 413 is logged and counted too.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import time
import uuid
from collections.abc import MutableMapping
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aieng_core.serving.http.api_models import REQUEST_ID_PATTERN, error_body
from aieng_core.serving.http.errors import ApiError
from aieng_core.serving.http.logs import bind_request, current_context, note_refusal, unbind_request
from aieng_core.serving.http.metrics import ENDPOINTS
from aieng_core.serving.http.provenance import Provenance, served_now
from aieng_core.serving.http.provenance import headers as provenance_headers
from aieng_core.serving.http.state import ServingState

log = logging.getLogger("aieng.serving.http")

_REQUEST_ID_RE = re.compile(REQUEST_ID_PATTERN)


# What an access log line's fields may add to a request log record.
RECORD_FIELDS = ("finish_reason", "prompt_tokens", "completion_tokens", "error")


class RequestContextMiddleware:
    """Binds the request id (X-Request-ID, else generated) for every log line of the request,
    echoes it in the response header with the bundle id and data version, counts the response
    by endpoint and status, writes one access log line and one request log record, and turns
    an exception that escaped a handler into a 500 naming only the request id."""

    def __init__(self, app: ASGIApp, state: ServingState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        arrived = time.time()
        given = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"x-request-id"), None)
        valid = given is None or bool(_REQUEST_ID_RE.match(given))
        request_id = given if given is not None and valid else uuid.uuid4().hex
        context, token = bind_request(request_id)
        path = scope.get("path", "")
        endpoint = path if path in ENDPOINTS else "other"
        # Probes and scrapes (many a minute) are kept out of the access and request logs, and traces.
        quiet = endpoint == "/metrics" or endpoint.startswith("/health")
        tracing = self.state.tracing
        if tracing is not None and not quiet:
            context.trace = tracing.begin(scope.get("method", ""), path, scope.get("headers", ()), started)
        status = {"code": 500, "started": False}
        named: list[Provenance] = []  # what the response's headers said

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"], status["started"] = message["status"], True
                provenance = context.provenance or served_now(self.state)
                named.append(provenance)
                ours = (b"x-request-id", b"x-aieng-bundle-id", b"x-aieng-data-version")
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() not in ours]
                headers.append((b"x-request-id", context.request_id.encode("latin-1")))
                headers += provenance_headers(provenance)
                if context.trace is not None:  # the server span, for a client to find its trace by
                    headers.append((b"traceparent", context.trace.traceparent.encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)

        try:
            if not valid:
                error = ApiError(
                    400,
                    "X-Request-ID: use 1 to 128 characters of A-Z a-z 0-9 . _ : - /",
                    "invalid_request_error",
                    param="X-Request-ID",
                    code="invalid_value",
                )
                note_refusal(error.message)
                await error.response()(scope, receive, send_with_id)
            else:
                await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception("unhandled error in %s %s", scope.get("method"), path)
            if not status["started"]:
                error = ApiError(500, f"internal error (request id {context.request_id})", "internal_error")
                await error.response()(scope, receive, send_with_id)
        finally:
            answered_by = named[0] if named else context.provenance or served_now(self.state)
            self.state.metrics.count_http(endpoint, int(status["code"]), answered_by[0])
            if not quiet:
                latency_ms = round((time.monotonic() - started) * 1000, 3)
                log.info(
                    "%s %s %s",
                    scope.get("method"),
                    path,
                    status["code"],
                    extra={
                        "method": scope.get("method"),
                        "path": path,
                        "status": status["code"],
                        "latency_ms": latency_ms,
                        **context.fields,
                    },
                )
                provenance = named[0] if named else context.provenance or served_now(self.state)
                self.record(
                    arrived, context.request_id, scope, int(status["code"]), provenance, latency_ms, context.fields
                )
                if context.trace is not None:
                    refusal = context.fields.get("error")
                    context.trace.end(int(status["code"]), context.request_id, provenance, refusal, time.monotonic())
            unbind_request(token)

    def record(
        self,
        arrived: float,
        request_id: str,
        scope: Scope,
        status: int,
        provenance: Provenance,
        latency_ms: float,
        fields: dict[str, Any],
    ) -> None:
        """One line of the request log, if the server keeps one; a failed write is logged
        (the answer has been given: it is not failed for its log line)."""
        request_log = self.state.request_log
        if request_log is None:
            return
        record: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(arrived, tz=dt.UTC).isoformat(timespec="milliseconds"),
            "request_id": request_id,
            "method": scope.get("method"),
            "path": scope.get("path", ""),
            "status": status,
            "bundle_id": provenance[0],
            "data_version": provenance[1],
            "latency_ms": latency_ms,
            **{name: fields[name] for name in RECORD_FIELDS if name in fields},
        }
        try:
            request_log.append(record)
        except (OSError, ValueError) as exc:
            log.error("cannot write the request log %s: %s", request_log.path, exc)


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

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
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
