"""One JSON object per log line on stderr, each carrying the request id of the request it
belongs to (and, when the request is traced, its trace and span ids: tracing.py).

The id lives in a contextvar holding a small mutable RequestContext: asyncio copies the
context into every task a request spawns, so all of the request's log lines see it, and the
handler can refine the id (a request_id in the body) where the middleware already set one.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import json
import logging
import sys
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aieng_core.serving.http.tracing import RequestTrace

# Fields a log call may add with `extra={...}`; anything else in `extra` is dropped.
EXTRA_FIELDS = (
    "latency_ms",
    "prompt_tokens",
    "completion_tokens",
    "batch_size",
    "finish_reason",
    "method",
    "path",
    "status",
    "endpoint",
    "bundle_id",
    "bundle_path",
    "kv_cache_bytes",
    "host",
    "port",
    "in_flight",
    "timings",
    "error",
    "threads",
    "others_cores",
)


@dataclass
class RequestContext:
    request_id: str
    # Filled in by the handler for the access log line the middleware writes at the end.
    fields: dict[str, Any] = field(default_factory=dict)
    # (bundle id, data version) of the replica a generation request took (provenance.py);
    # None until it took one: the response then names the bundle served now.
    provenance: tuple[str, str] | None = None
    # The request's spans when the server traces (tracing.py); None when it does not.
    trace: RequestTrace | None = None


_current: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar("aieng_request", default=None)


def current_context() -> RequestContext | None:
    return _current.get()


def note_refusal(reason: str) -> None:
    """Why the request was refused, for its access log line (`error`) and request log record:
    the first reason given wins (the one the client was answered with)."""
    context = _current.get()
    if context is not None:
        context.fields.setdefault("error", reason)


def bind_request(request_id: str) -> tuple[RequestContext, contextvars.Token]:
    context = RequestContext(request_id)
    return context, _current.set(context)


def unbind_request(token: contextvars.Token) -> None:
    _current.reset(token)


def request_id_for(body_id: str | None) -> str:
    """The request's id: the body's `request_id` when given (the response header and the log
    lines follow it), else the one the middleware bound (X-Request-ID, or generated)."""
    context = current_context()
    if body_id is not None and context is not None:
        context.request_id = body_id
    return body_id or (context.request_id if context is not None else uuid.uuid4().hex)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        context = _current.get()
        entry: dict[str, Any] = {
            "timestamp": dt.datetime.fromtimestamp(record.created, tz=dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None) or (context.request_id if context is not None else None),
        }
        if context is not None and context.trace is not None:
            # What finds the request's trace in the tracing backend, and the trace from a log line.
            entry["trace_id"] = context.trace.trace_id
            entry["span_id"] = context.trace.span_id
        for name in EXTRA_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        if record.exc_info:
            # The traceback goes to the operator's log, never into a response.
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(level: str = "info", stream: Any = None) -> None:
    """Route every logger (ours, uvicorn's) to one JSON handler on stderr."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    # Our middleware writes one access line per request, with its id and latency.
    logging.getLogger("uvicorn.access").disabled = True
