"""serving/http/tracing.py in this process: when the OTEL_* environment turns traces on (and
what the server says when it cannot), and the spans a request's engine requests make in
each way they can end, read from the SDK's in-memory exporter. The whole path, over OTLP to
a receiver, is tests/e2e/test_traces.py."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from aieng_core.serving.http import tracing
from aieng_core.serving.http.tracing import Tracing, from_environment
from aieng_core.serving.request import Request, RequestStatus, SamplingParams
from tests.conftest import REPO_ROOT

ENDPOINT = "http://127.0.0.1:9"  # nothing is exported in these tests


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == tracing.log.name and r.levelno >= logging.WARNING]


def test_without_otel_variables_tracing_is_off_and_the_sdk_never_imported() -> None:
    """Off costs nothing: the server's modules load, and decide, without the SDK."""
    code = (
        "import sys\n"
        "import aieng_core.serving.http.app, aieng_core.serving.http.server\n"
        "from aieng_core.serving.http.tracing import from_environment\n"
        "assert from_environment() is None\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk') or 'exporter' in m))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("variables", "said"),
    [
        ({}, None),
        ({"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}, None),  # no exporter asked for
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_TRACES_EXPORTER": "none"}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_SDK_DISABLED": "true"}, None),
        (
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ENDPOINT, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "tracing off: OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL is grpc; aieng serve exports OTLP over "
            "http/protobuf only",
        ),
        (
            {"OTEL_TRACES_EXPORTER": "console"},
            "tracing off: OTEL_TRACES_EXPORTER=console, and aieng serve exports traces over OTLP only (otlp)",
        ),
    ],
)
def test_what_keeps_tracing_off(
    variables: dict[str, str], said: str | None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    caplog.set_level(logging.INFO, logger=tracing.log.name)
    assert from_environment() is None
    assert warnings_of(caplog) == ([said] if said else [])


def test_an_endpoint_without_the_sdk_is_a_warning_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", ENDPOINT)
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # as if not installed
    assert from_environment() is None
    (warning,) = warnings_of(caplog)
    assert warning.startswith(f"tracing off: the environment asks for OpenTelemetry traces ({ENDPOINT})")
    assert warning.endswith("install it with pip install 'aieng[otel]'")


@pytest.mark.parametrize(
    ("variables", "service"),
    [
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, "aieng"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{ENDPOINT}/v1/traces", "OTEL_SERVICE_NAME": "llm-eu"}, "llm-eu"),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attributes"},
            "from-attributes",
        ),
    ],
)
def test_an_otlp_exporter_asked_for_turns_tracing_on(
    variables: dict[str, str], service: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    traced = from_environment()
    assert traced is not None
    try:
        assert traced.provider.resource.attributes["service.name"] == service
    finally:
        traced.shutdown()


@pytest.fixture
def exported() -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider), exporter


def engine_request(arrived: float) -> Request:
    return Request("r", [1, 2, 3], SamplingParams(max_new_tokens=4), arrival_time=arrived)


def spans_by_name(exporter: InMemorySpanExporter) -> dict[str, tuple[float, float]]:
    """name -> (start, end) in seconds since the epoch."""
    return {s.name: (s.start_time / 1e9, s.end_time / 1e9) for s in exporter.get_finished_spans()}


def test_engine_spans_from_the_times_the_engine_recorded(exported: tuple[Tracing, InMemorySpanExporter]) -> None:
    traced, exporter = exported
    t = time.monotonic()
    trace = traced.begin("POST", "/generate", [], t)
    request = engine_request(t + 0.001)
    request.scheduled_time, request.first_token_time, request.finish_time = t + 0.003, t + 0.006, t + 0.010
    request.output_ids, request.status, request.finish_reason = [5, 6, 7, 8], RequestStatus.FINISHED, "length"
    trace.engine([request], t + 0.5)
    trace.end(200, "r", ("bundle", "data"), None, t + 0.02)
    spans = spans_by_name(exporter)
    wall = traced.ns(t) / 1e9
    expected = {
        "queue": (0.001, 0.003),
        "prefill": (0.003, 0.006),
        "decode": (0.006, 0.010),
        "POST /generate": (0.0, 0.02),
    }
    assert spans.keys() == expected.keys()
    for name, (start, end) in expected.items():
        assert spans[name] == pytest.approx((wall + start, wall + end), abs=1e-6), name


def test_a_request_cancelled_in_the_queue_has_a_queue_span_only(
    exported: tuple[Tracing, InMemorySpanExporter],
) -> None:
    """Not yet finished by the engine (its slot is freed at the next step): it ends now."""
    traced, exporter = exported
    t = time.monotonic()
    trace = traced.begin("POST", "/generate", [], t)
    trace.engine([engine_request(t + 0.001)], t + 0.25)
    (queue,) = exporter.get_finished_spans()
    assert queue.name == "queue"
    assert (queue.start_time, queue.end_time) == (traced.ns(t + 0.001), traced.ns(t + 0.25))


def test_a_request_that_failed_in_prefill_has_no_decode_span(exported: tuple[Tracing, InMemorySpanExporter]) -> None:
    traced, exporter = exported
    t = time.monotonic()
    trace = traced.begin("POST", "/generate", [], t)
    request = engine_request(t)
    request.scheduled_time, request.finish_time = t + 0.002, t + 0.004
    trace.engine([request], t + 1)
    assert spans_by_name(exporter).keys() == {"queue", "prefill"}
    assert exporter.get_finished_spans()[1].end_time == traced.ns(t + 0.004)


def test_an_unsampled_request_keeps_its_ids_and_makes_no_span(monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller that did not sample (flags 00) is followed, as the default sampler
    (parentbased_always_on) does: the ids go in the logs and the response, nothing is exported."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    traced = Tracing(provider)
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
    trace = traced.begin("POST", "/generate", [(b"traceparent", parent.encode())], time.monotonic())
    assert trace.trace_id == "0af7651916cd43dd8448eb211c80319c" and not trace.recording
    trace.engine([engine_request(time.monotonic())], time.monotonic())
    trace.end(200, "r", ("b", "d"), None, time.monotonic())
    assert exporter.get_finished_spans() == ()


def test_a_malformed_traceparent_begins_a_new_trace(exported: tuple[Tracing, InMemorySpanExporter]) -> None:
    traced, exporter = exported
    trace = traced.begin("GET", "/v1/models", [(b"traceparent", b"00-not-a-trace-01")], time.monotonic())
    trace.end(200, "r", ("b", "d"), None, time.monotonic())
    (span,) = exporter.get_finished_spans()
    assert span.parent is None and span.name == "GET /v1/models"
    assert format(span.context.trace_id, "032x") == trace.trace_id
