"""A minimal OTLP/HTTP trace receiver on loopback, for the tests of `aieng serve`'s traces.

No OpenTelemetry Collector is packaged for Debian or PyPI here, so this is the receiving end
of the protocol as the OTLP specification defines it for HTTP: `POST /v1/traces` with an
`application/x-protobuf` body (gzip when Content-Encoding says so) holding an
ExportTraceServiceRequest, answered 200 with an ExportTraceServiceResponse. The messages are
parsed with the official protobuf definitions (the `opentelemetry-proto` package the OTLP
exporter itself depends on), never by the SDK that sent them, so a span is read back as any
collector would read it. Anything else is answered 404 or 415 and counted as refused.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

PROTOBUF = "application/x-protobuf"
KINDS = {value: name for name, value in Span.SpanKind.items()}


def plain(value: AnyValue) -> Any:
    """An OTLP AnyValue as the Python value it holds."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [plain(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: plain(kv.value) for kv in value.kvlist_value.values}
    return None if kind is None else getattr(value, kind)


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str  # "" for a root span
    name: str
    kind: str  # SPAN_KIND_SERVER, ...
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int
    resource: dict[str, Any]
    scope: str

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


@dataclass
class Receiver:
    port: int  # set once the server is bound
    spans: list[ReceivedSpan] = field(default_factory=list)
    posts: int = 0  # export requests accepted
    refused: list[str] = field(default_factory=list)  # what was answered 404 or 415, and why
    changed: threading.Condition = field(default_factory=threading.Condition)

    @property
    def endpoint(self) -> str:
        """The base URL, as OTEL_EXPORTER_OTLP_ENDPOINT takes it (the exporter adds /v1/traces)."""
        return f"http://127.0.0.1:{self.port}"

    def accept(self, request: ExportTraceServiceRequest) -> None:
        received = [
            ReceivedSpan(
                trace_id=span.trace_id.hex(),
                span_id=span.span_id.hex(),
                parent_span_id=span.parent_span_id.hex(),
                name=span.name,
                kind=KINDS[span.kind],
                start_ns=span.start_time_unix_nano,
                end_ns=span.end_time_unix_nano,
                attributes={kv.key: plain(kv.value) for kv in span.attributes},
                status_code=span.status.code,
                resource={kv.key: plain(kv.value) for kv in resource_spans.resource.attributes},
                scope=scope_spans.scope.name,
            )
            for resource_spans in request.resource_spans
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans
        ]
        with self.changed:
            self.spans += received
            self.posts += 1
            self.changed.notify_all()

    def refuse(self, why: str) -> None:
        with self.changed:
            self.refused.append(why)
            self.changed.notify_all()

    def wait_for(self, condition: Callable[[list[ReceivedSpan]], Any], timeout: float, what: str) -> Any:
        """condition(spans so far) once it is true, woken by each export; AssertionError
        naming `what` (and what did arrive) after `timeout` seconds."""
        with self.changed:
            result = self.changed.wait_for(lambda: condition(list(self.spans)), timeout)
            if not result:
                names = sorted(f"{s.name}:{s.trace_id[:8]}" for s in self.spans)
                raise AssertionError(f"no {what} within {timeout} s; received {names}, refused {self.refused}")
            return result

    def of_trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self.changed:
            return [span for span in self.spans if span.trace_id == trace_id]


def handler_for(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # kept-alive, as the exporter's session expects

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path != "/v1/traces":
                return self.answer(404, b"", f"POST {self.path}")
            if self.headers.get("Content-Type", "").split(";")[0].strip() != PROTOBUF:
                return self.answer(415, b"", f"Content-Type {self.headers.get('Content-Type')}")
            if self.headers.get("Content-Encoding", "").strip().lower() == "gzip":
                body = gzip.decompress(body)
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            receiver.accept(request)
            self.answer(200, ExportTraceServiceResponse().SerializeToString())

        def answer(self, status: int, body: bytes, refused: str | None = None) -> None:
            if refused is not None:
                receiver.refuse(refused)
            self.send_response(status)
            self.send_header("Content-Type", PROTOBUF)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
            pass  # the tests read the receiver, not its access log

    return Handler


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    """A receiver on 127.0.0.1 (a free port), serving from a thread until the block ends."""
    receiver = Receiver(port=0)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(receiver))
    receiver.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
