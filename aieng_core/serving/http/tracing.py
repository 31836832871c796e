"""OpenTelemetry traces of `aieng serve` (docs/serving/traces.md): off unless the standard
OTEL_* environment asks for them, and then one SERVER span per request.

- Whether to trace is decided once, at start, from the environment (`from_environment`):
  an OTLP endpoint (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT) or
  OTEL_TRACES_EXPORTER=otlp turns it on; OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none
  keeps it off. Off, the SDK is never imported and a request pays a few `is None` tests.
- Everything else (sampler, resource, batching, headers, timeouts, compression) is the
  SDK's own reading of OTEL_*: TracerProvider, BatchSpanProcessor and OTLPSpanExporter are
  built with no arguments that would override it.
- The SDK is an optional extra (`aieng[otel]`). Asked for but not installed, or asked for
  over a protocol or an exporter this server does not have (OTLP over http/protobuf only),
  the server warns at start and serves untraced: a missing tracing library must not take
  production down.
- A request's span continues the caller's W3C `traceparent` (a new trace without one); its
  children (queue, prefill, decode, and for a streamed answer the stream) are made after
  the fact with explicit times: the engine already records on each Request when it arrived,
  was admitted, gave its first token and finished, so the engine never imports OpenTelemetry
  and its thread does no tracing work.
- Every time of a request's spans is read from time.monotonic, made wall-clock with one
  offset taken at start: the spans of a request nest and order exactly even if the wall
  clock is stepped meanwhile (their absolute times are then off by that step).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from starlette.types import Message, Send

from aieng_core.serving.http.metrics import ENDPOINTS

if TYPE_CHECKING:
    from aieng_core.serving.engine import RequestOutput
    from aieng_core.serving.http.api_models import Usage
    from aieng_core.serving.request import Request, SamplingParams

log = logging.getLogger("aieng.serving.tracing")

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
PROTOCOL = "http/protobuf"  # the one exporter the `otel` extra installs
INSTALL = "pip install 'aieng[otel]'"
SERVICE_NAME = "aieng"  # when neither OTEL_SERVICE_NAME nor OTEL_RESOURCE_ATTRIBUTES names one
SCOPE = "aieng.serving.http"

# gen_ai.operation.name of each generation endpoint (OpenTelemetry's GenAI conventions).
OPERATIONS = {
    "/v1/completions": "text_completion",
    "/v1/chat/completions": "chat",
    "/generate": "text_completion",
    "/predict": "text_completion",
}
# gen_ai.provider.name: the server answering is the provider (it is OpenAI-compatible, not OpenAI).
PROVIDER = "aieng"


def from_environment() -> Tracing | None:
    """The tracing the OTEL_* environment asks for, or None (off). Logged either way when
    anything OTEL_* asked for traces; silent when nothing did."""
    env = os.environ
    exporters = [name.strip().lower() for name in env.get("OTEL_TRACES_EXPORTER", "").split(",") if name.strip()]
    endpoint = next((env[name].strip() for name in ENDPOINT_VARIABLES if env.get(name, "").strip()), None)
    if "none" in exporters or not (endpoint or exporters):
        return None  # nothing asks for traces
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        log.info("tracing off: OTEL_SDK_DISABLED is true")
        return None
    if exporters and "otlp" not in exporters:
        log.warning(
            "tracing off: OTEL_TRACES_EXPORTER=%s, and aieng serve exports traces over OTLP only (otlp)",
            env["OTEL_TRACES_EXPORTER"],
        )
        return None
    unsupported = [name for name in exporters if name != "otlp"]
    if unsupported:
        log.warning("OTEL_TRACES_EXPORTER: exporting over otlp only; ignoring %s", ", ".join(unsupported))
    protocol = next((env[name].strip() for name in PROTOCOL_VARIABLES if env.get(name, "").strip()), PROTOCOL)
    if protocol != PROTOCOL:
        log.warning(
            "tracing off: OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL is %s; aieng serve exports OTLP over %s only",
            protocol,
            PROTOCOL,
        )
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        log.warning(
            "tracing off: the environment asks for OpenTelemetry traces (%s) but the OpenTelemetry SDK "
            "is not installed (%s); install it with %s",
            endpoint or "OTEL_TRACES_EXPORTER=otlp",
            exc,
            INSTALL,
        )
        return None
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    # Shut down by the app's lifespan (flushing what is batched), not at interpreter exit.
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    exporter = OTLPSpanExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    log.info(
        "tracing on: OpenTelemetry spans over OTLP/HTTP to %s (service.name %s)",
        getattr(exporter, "_endpoint", endpoint),
        resource.attributes.get("service.name"),
    )
    return Tracing(provider)


class Tracing:
    """A tracer provider and what a request needs to make its spans."""

    def __init__(self, provider: Any) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        from aieng_core.serving.http.routes_ops import server_version

        self.provider = provider
        self.tracer = provider.get_tracer(SCOPE, server_version())
        self.propagator = TraceContextTextMapPropagator()
        self.trace_api = trace
        # time.monotonic() seconds + offset = nanoseconds since the epoch (see the module's docstring).
        self.offset_ns = time.time_ns() - time.monotonic_ns()

    def ns(self, monotonic: float) -> int:
        return round(monotonic * 1e9) + self.offset_ns

    def begin(self, method: str, path: str, headers: Iterable[tuple[bytes, bytes]], started: float) -> RequestTrace:
        """The server span of a request that arrived at `started` (time.monotonic), a child
        of the caller's span when its headers carry a valid `traceparent`."""
        carrier = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in headers
            if name in (b"traceparent", b"tracestate")
        }
        parent = self.propagator.extract(carrier)
        route = path if path in ENDPOINTS else None
        attributes: dict[str, Any] = {"http.request.method": method, "url.path": path}
        if route is not None:
            attributes["http.route"] = route
        span = self.tracer.start_span(
            f"{method} {route}" if route else method,
            context=parent,
            kind=self.trace_api.SpanKind.SERVER,
            start_time=self.ns(started),
            attributes=attributes,
        )
        return RequestTrace(self, span, OPERATIONS.get(path))

    def shutdown(self) -> None:
        """Export what is still batched, then stop (bounded by the exporter's OTEL_* timeouts)."""
        self.provider.shutdown()


class RequestTrace:
    """The spans of one HTTP request: its server span, and the children made once their
    times are known. Its ids go on every JSON log line of the request (logs.py)."""

    def __init__(self, tracing: Tracing, span: Any, operation: str | None) -> None:
        self.tracing = tracing
        self.span = span
        self.operation = operation
        context = span.get_span_context()
        self.trace_id = format(context.trace_id, "032x")
        self.span_id = format(context.span_id, "016x")
        self.traceparent = f"00-{self.trace_id}-{self.span_id}-{int(context.trace_flags):02x}"
        # Not sampled: the ids still go in the logs and the response, but no child is made.
        self.recording = bool(span.is_recording())
        self._parent = tracing.trace_api.set_span_in_context(span)

    def generation(self, model: str | None, answering: str) -> None:
        """A generation request took the replica of bundle `answering`; `model` is what it asked for."""
        if not self.recording:
            return
        attributes: dict[str, Any] = {"gen_ai.provider.name": PROVIDER, "gen_ai.response.model": answering}
        if self.operation is not None:
            attributes["gen_ai.operation.name"] = self.operation
        if model is not None:
            attributes["gen_ai.request.model"] = model
        self.span.set_attributes(attributes)

    def parameters(self, params: SamplingParams, stream: bool) -> None:
        """The sampling parameters the engine runs with (the request's, with the defaults filled in)."""
        if not self.recording:
            return
        attributes: dict[str, Any] = {
            "gen_ai.request.max_tokens": params.max_new_tokens,
            # doubles in OTLP, as the conventions type them, even when the request sent 0 or 1
            "gen_ai.request.temperature": float(params.temperature),
            "gen_ai.request.top_p": float(params.top_p),
            "gen_ai.request.stream": stream,
        }
        if params.top_k:
            attributes["gen_ai.request.top_k"] = params.top_k
        if params.seed is not None:
            attributes["gen_ai.request.seed"] = params.seed
        if params.stop:
            attributes["gen_ai.request.stop_sequences"] = list(params.stop)
        if params.presence_penalty:
            attributes["gen_ai.request.presence_penalty"] = float(params.presence_penalty)
        if params.frequency_penalty:
            attributes["gen_ai.request.frequency_penalty"] = float(params.frequency_penalty)
        self.span.set_attributes(attributes)

    def answered(self, response_id: str, outputs: Sequence[RequestOutput], usage: Usage) -> None:
        """What the response said: its id, each choice's finish reason, the usage it reported."""
        if not self.recording:
            return
        self.span.set_attributes(
            {
                "gen_ai.response.id": response_id,
                "gen_ai.response.finish_reasons": [str(o.finish_reason) for o in outputs],
                "gen_ai.usage.input_tokens": usage.prompt_tokens,
                "gen_ai.usage.output_tokens": usage.completion_tokens,
            }
        )

    def engine(self, requests: Sequence[Request], now: float) -> None:
        """queue, prefill and decode spans of each engine request (one per prompt), from the
        times the engine recorded; a phase a request never reached has no span, one it had
        not left by `now` (cancelled, its slot not yet freed) ends at `now`."""
        if not self.recording:
            return
        for request in requests:
            scheduled, first, finished = request.scheduled_time, request.first_token_time, request.finish_time
            end = finished if finished is not None else now
            named = {"aieng.engine_request_id": request.request_id}
            self._child("queue", request.arrival_time, scheduled if scheduled is not None else end, named)
            if scheduled is not None:
                prefill = {**named, "aieng.prompt_tokens": request.num_prompt_tokens}
                self._child("prefill", scheduled, first if first is not None else end, prefill)
            if first is not None:
                decode = {**named, "aieng.output_tokens": len(request.output_ids)}
                if request.finish_reason is not None:
                    decode["aieng.finish_reason"] = request.finish_reason
                self._child("decode", first, end, decode)

    def stream(self, watch: StreamWatch) -> None:
        """The stream span: from the response's first byte to the last one handed to the server."""
        if not self.recording or watch.started is None:
            return
        attributes = {"aieng.stream.bytes": watch.bytes, "aieng.stream.complete": watch.complete}
        self._child("stream", watch.started, watch.ended if watch.ended is not None else watch.started, attributes)

    def end(self, status: int, request_id: str, provenance: tuple[str, str], error: Any, ended: float) -> None:
        """Close the server span with the response's status, the request id, the bundle and
        data version its headers named (X-Aieng-Bundle-Id, X-Aieng-Data-Version), and why it
        was refused (`error`, as its access log line says) if it was."""
        if self.recording:
            attributes: dict[str, Any] = {
                "http.response.status_code": status,
                "aieng.request_id": request_id,
                "aieng.bundle_id": provenance[0],
                "aieng.data_version": provenance[1],
            }
            if error:
                attributes["aieng.error"] = str(error)
            self.span.set_attributes(attributes)
            if status >= 500:  # 4xx is the client's error, not the server's (HTTP conventions)
                self.span.set_attribute("error.type", str(status))
                self.span.set_status(self.tracing.trace_api.Status(self.tracing.trace_api.StatusCode.ERROR))
        self.span.end(end_time=self.tracing.ns(ended))

    def _child(self, name: str, start: float, end: float, attributes: Mapping[str, Any]) -> None:
        span = self.tracing.tracer.start_span(
            name, context=self._parent, start_time=self.tracing.ns(start), attributes=attributes
        )
        span.end(end_time=self.tracing.ns(max(start, end)))


class StreamWatch:
    """A streamed response's `send`, noting when its first byte (the status line and headers)
    went out and when the last body bytes were handed to the server."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started: float | None = None
        self.ended: float | None = None
        self.bytes = 0
        self.complete = False  # the body's last message (more_body false) was sent

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = time.monotonic()
        await self._send(message)
        if message["type"] == "http.response.body":
            self.bytes += len(message.get("body", b""))
            self.ended = time.monotonic()
            self.complete = not message.get("more_body", False)
