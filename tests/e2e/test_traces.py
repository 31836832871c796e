"""OpenTelemetry traces of a real `aieng serve`, read back from a real OTLP/HTTP receiver on
loopback (tests/otlp_receiver.py: the official protobuf definitions, not the SDK that sent
them): a request continues its caller's W3C traceparent as a SERVER span, with queue,
prefill, decode (and, streamed, stream) children that nest in it in that order, the stream's
ending after its last byte; GenAI attributes equal what the response said; the request's
JSON log lines carry its trace id; without OTEL_* configuration, or with the SDK disabled,
nothing is traced or sent.

Every wait is bounded: the receiver is polled until the spans arrive or a deadline passes.
"""

from __future__ import annotations

import http.client
import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.serve_helpers import Server, poll, serving
from tests.otlp_receiver import ReceivedSpan, Receiver, otlp_receiver

pytestmark = pytest.mark.e2e

SPANS_TIMEOUT_S = 30
# The server's span times are time.monotonic made wall-clock by one offset taken at start; the
# client's are time.time_ns. On one machine the two clocks differ by no more than NTP's slew
# over the test's minute (500 ppm: 30 ms) unless the clock is stepped.
CLOCKS_S = 0.1
ENGINE_CHILDREN = ("queue", "prefill", "decode")


@dataclass
class Traced:
    server: Server
    receiver: Receiver


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory, bundle_path: Path) -> Iterator[Traced]:
    with otlp_receiver() as receiver:
        environment = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_SERVICE_NAME": "aieng-under-test",
            "OTEL_BSP_SCHEDULE_DELAY": "50",  # ms: spans reach the receiver at once, not in 5 s
        }
        with serving(tmp_path_factory.mktemp("traces"), bundle_path, environment=environment) as server:
            yield Traced(server, receiver)


def caller() -> tuple[str, str, str]:
    """A caller's trace id, span id and the traceparent naming them (sampled)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


@dataclass
class Streamed:
    status: int
    headers: dict[str, str]
    body: bytes
    sent_ns: int  # just before the request was written
    last_byte_ns: int  # once the whole body had been read


def stream(port: int, path: str, body: dict[str, Any], headers: dict[str, str]) -> Streamed:
    """A POST whose body is read to its end, timed by the client's clock."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        sent_ns = time.time_ns()
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json", **headers})
        response = connection.getresponse()
        data = response.read()
        last_byte_ns = time.time_ns()
        return Streamed(response.status, {k.lower(): v for k, v in response.getheaders()}, data, sent_ns, last_byte_ns)
    finally:
        connection.close()


def sse_events(body: bytes) -> list[Any]:
    lines = [line[len("data: ") :] for line in body.decode().split("\n\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]", lines[-3:]
    return [json.loads(line) for line in lines[:-1]]


def spans_of(receiver: Receiver, trace_id: str, names: tuple[str, ...]) -> dict[str, ReceivedSpan]:
    """The spans of the trace once one of each name has arrived, by name (each name once)."""

    def arrived(spans: list[ReceivedSpan]) -> bool:
        return {s.name for s in spans if s.trace_id == trace_id} >= set(names)

    receiver.wait_for(arrived, SPANS_TIMEOUT_S, f"spans {names} of trace {trace_id}")
    spans = receiver.of_trace(trace_id)
    assert sorted(s.name for s in spans) == sorted(names), [s.name for s in spans]
    return {s.name: s for s in spans}


def request_log_lines(server: Server, request_id: str) -> list[dict[str, Any]]:
    """The JSON log lines of the request, once its access line (the last one) is written."""

    def logged() -> list[dict[str, Any]]:
        lines = [line for line in server.log_lines() if line.get("request_id") == request_id]
        return lines if any("status" in line for line in lines) else []

    return poll(logged, 30, f"the access log line of {request_id}")


def check_family(server_span: ReceivedSpan, children: list[ReceivedSpan]) -> None:
    """Each child's parent is the server span, and it lies within it."""
    for child in children:
        assert child.parent_span_id == server_span.span_id, child.name
        assert child.kind == "SPAN_KIND_INTERNAL", child.name
        assert server_span.start_ns <= child.start_ns <= child.end_ns <= server_span.end_ns, child.name


def test_a_streamed_completion_continues_the_callers_trace(traced: Traced, serving_bundle_artifact) -> None:
    trace_id, parent_id, traceparent = caller()
    body = {
        "model": "aieng",
        "prompt": "The data pipeline",
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,  # exactly max_tokens tokens: a decode of many steps
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    reply = stream(traced.server.port, "/v1/completions", body, {"traceparent": traceparent})
    assert reply.status == 200, reply.body
    events = sse_events(reply.body)
    usage = events[-1]["usage"]
    assert usage["completion_tokens"] == 12
    finish_reasons = [
        e["choices"][0]["finish_reason"] for e in events if e["choices"] and e["choices"][0]["finish_reason"]
    ]
    assert finish_reasons == ["length"]

    spans = spans_of(traced.receiver, trace_id, ("POST /v1/completions", *ENGINE_CHILDREN, "stream"))
    server = spans["POST /v1/completions"]
    queue, prefill, decode, streamed = (spans[name] for name in (*ENGINE_CHILDREN, "stream"))
    # The server span continues the caller's, and the response names it.
    assert server.kind == "SPAN_KIND_SERVER"
    assert server.parent_span_id == parent_id
    assert reply.headers["traceparent"] == f"00-{trace_id}-{server.span_id}-01"
    check_family(server, [queue, prefill, decode, streamed])
    # One after the other: the stream begins once the first token exists, ends after the last.
    assert queue.end_ns <= prefill.start_ns and prefill.end_ns <= decode.start_ns
    assert prefill.end_ns <= streamed.start_ns and decode.end_ns <= streamed.end_ns
    assert decode.end_ns > decode.start_ns  # 11 decode steps
    # The stream span saw every byte the client read, to the last message, and it ended no
    # later than the client had the last byte; the request began after the client sent it.
    assert streamed.attributes == {"aieng.stream.bytes": len(reply.body), "aieng.stream.complete": True}
    assert streamed.end_ns <= reply.last_byte_ns + CLOCKS_S * 1e9
    assert server.start_ns >= reply.sent_ns - CLOCKS_S * 1e9

    request_id = reply.headers["x-request-id"]
    bundle_id = serving_bundle_artifact.bundle.id
    assert server.attributes == {
        "http.request.method": "POST",
        "url.path": "/v1/completions",
        "http.route": "/v1/completions",
        "http.response.status_code": 200,
        "gen_ai.provider.name": "aieng",
        "gen_ai.operation.name": "text_completion",
        "gen_ai.request.model": "aieng",
        "gen_ai.request.max_tokens": 12,
        "gen_ai.request.temperature": 0.0,
        "gen_ai.request.top_p": 1.0,
        "gen_ai.request.stream": True,
        "gen_ai.response.id": f"cmpl-{request_id}",
        "gen_ai.response.model": bundle_id,
        "gen_ai.response.finish_reasons": ["length"],
        "gen_ai.usage.input_tokens": usage["prompt_tokens"],
        "gen_ai.usage.output_tokens": usage["completion_tokens"],
        "aieng.request_id": request_id,
        "aieng.bundle_id": reply.headers["x-aieng-bundle-id"],
        "aieng.data_version": reply.headers["x-aieng-data-version"],
    }
    assert isinstance(server.attributes["gen_ai.request.temperature"], float)  # a double, though 0 was sent
    assert events[0]["id"] == f"cmpl-{request_id}" and reply.headers["x-aieng-bundle-id"] == bundle_id
    assert len(reply.headers["x-aieng-data-version"]) == 64
    assert prefill.attributes["aieng.prompt_tokens"] == usage["prompt_tokens"]
    assert decode.attributes["aieng.output_tokens"] == usage["completion_tokens"]
    assert decode.attributes["aieng.finish_reason"] == "length"
    assert {s.attributes["aieng.engine_request_id"] for s in (queue, prefill, decode)} == {request_id}
    assert server.resource["service.name"] == "aieng-under-test"  # the SDK's own OTEL_SERVICE_NAME
    assert server.scope == "aieng.serving.http"

    # Every JSON log line of the request names its trace and its server span.
    lines = request_log_lines(traced.server, request_id)
    assert {(line.get("trace_id"), line.get("span_id")) for line in lines} == {(trace_id, server.span_id)}


def test_a_chat_completion_not_streamed(traced: Traced) -> None:
    trace_id, parent_id, traceparent = caller()
    body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 5, "temperature": 0.5, "seed": 7}
    reply = traced.server.post("/v1/chat/completions", body, headers={"traceparent": traceparent})
    assert reply.status == 200, reply.body
    answer = reply.json

    spans = spans_of(traced.receiver, trace_id, ("POST /v1/chat/completions", *ENGINE_CHILDREN))
    server = spans["POST /v1/chat/completions"]
    queue, prefill, decode = (spans[name] for name in ENGINE_CHILDREN)
    assert server.parent_span_id == parent_id
    assert reply.headers["traceparent"] == f"00-{trace_id}-{server.span_id}-01"
    check_family(server, [queue, prefill, decode])
    assert queue.end_ns <= prefill.start_ns and prefill.end_ns <= decode.start_ns
    attributes = server.attributes
    assert attributes["gen_ai.operation.name"] == "chat"
    assert "gen_ai.request.model" not in attributes  # the request named none
    assert (attributes["gen_ai.request.max_tokens"], attributes["gen_ai.request.temperature"]) == (5, 0.5)
    assert (attributes["gen_ai.request.seed"], attributes["gen_ai.request.stream"]) == (7, False)
    assert attributes["gen_ai.response.id"] == answer["id"]
    assert attributes["gen_ai.response.model"] == answer["model"] == attributes["aieng.bundle_id"]
    assert attributes["gen_ai.response.finish_reasons"] == [answer["choices"][0]["finish_reason"]]
    assert attributes["gen_ai.usage.input_tokens"] == answer["usage"]["prompt_tokens"]
    assert attributes["gen_ai.usage.output_tokens"] == answer["usage"]["completion_tokens"]
    assert decode.attributes["aieng.output_tokens"] == answer["usage"]["completion_tokens"]

    lines = request_log_lines(traced.server, reply.headers["x-request-id"])
    assert {(line.get("trace_id"), line.get("span_id")) for line in lines} == {(trace_id, server.span_id)}


def test_n_samples_are_one_set_of_engine_spans_each_and_the_usage_counts_the_prompt_once(traced: Traced) -> None:
    trace_id, _, traceparent = caller()
    body = {"prompt": "The data", "n": 2, "max_tokens": 3, "temperature": 1.0, "seed": 3}
    reply = traced.server.post("/v1/completions", body, headers={"traceparent": traceparent})
    assert reply.status == 200, reply.body
    usage = reply.json["usage"]

    def arrived(spans: list[ReceivedSpan]) -> bool:
        names = [s.name for s in spans if s.trace_id == trace_id]
        return "POST /v1/completions" in names and all(names.count(name) == 2 for name in ENGINE_CHILDREN)

    traced.receiver.wait_for(arrived, SPANS_TIMEOUT_S, f"the spans of trace {trace_id}")
    spans = traced.receiver.of_trace(trace_id)
    [server] = [s for s in spans if s.name == "POST /v1/completions"]
    check_family(server, [s for s in spans if s is not server])
    assert server.attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert usage["prompt_tokens"] == sum(s.attributes["aieng.prompt_tokens"] for s in spans if s.name == "prefill") // 2
    assert server.attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"] == 6


def test_without_a_traceparent_a_request_begins_a_trace(traced: Traced) -> None:
    reply = traced.server.post("/generate", {"prompt": "still", "max_new_tokens": 2, "temperature": 0})
    assert reply.status == 200, reply.body
    version, trace_id, span_id, flags = reply.headers["traceparent"].split("-")
    assert (version, len(trace_id), len(span_id)) == ("00", 32, 16)
    assert int(flags, 16) & 1  # sampled (the SDK's new trace ids also set W3C level 2's "random" bit)
    spans = spans_of(traced.receiver, trace_id, ("POST /generate", *ENGINE_CHILDREN))
    server = spans["POST /generate"]
    assert (server.span_id, server.parent_span_id) == (span_id, "")  # a root span
    check_family(server, [spans[name] for name in ENGINE_CHILDREN])
    assert server.attributes["gen_ai.response.id"] == reply.json["request_id"]


def test_a_refused_request_is_traced_with_its_status_and_reason(traced: Traced) -> None:
    trace_id, parent_id, traceparent = caller()
    reply = traced.server.post(
        "/v1/completions", {"model": "no-such-model", "prompt": "x"}, headers={"traceparent": traceparent}
    )
    assert reply.status == 404 and reply.error_code == "model_not_found"
    (server,) = spans_of(traced.receiver, trace_id, ("POST /v1/completions",)).values()
    assert server.parent_span_id == parent_id
    assert server.attributes["http.response.status_code"] == 404
    assert server.attributes["gen_ai.request.model"] == "no-such-model"
    assert "does not exist" in server.attributes["aieng.error"]
    assert server.status_code == 0  # unset: a 4xx is the client's error (OpenTelemetry's HTTP conventions)


def test_probes_and_scrapes_are_not_traced(traced: Traced) -> None:
    assert traced.server.get("/metrics").status == 200
    reply = traced.server.post("/generate", {"prompt": "still", "max_new_tokens": 1, "temperature": 0})
    trace_id = reply.headers["traceparent"].split("-")[1]
    spans_of(traced.receiver, trace_id, ("POST /generate", *ENGINE_CHILDREN))  # exported after the scrape
    paths = {span.attributes.get("url.path") for span in traced.receiver.spans}
    assert not {p for p in paths if p and (p.startswith("/health") or p == "/metrics")}, paths
    assert "traceparent" not in traced.server.get("/health/ready").headers


def untraced_answers(server: Server) -> list[Any]:
    """A streamed and a non-streamed answer, each sent with a caller's traceparent."""
    _, _, traceparent = caller()
    body = {"model": "aieng", "prompt": "The data pipeline", "max_tokens": 3, "temperature": 0}
    return [
        server.post("/v1/completions", body, headers={"traceparent": traceparent}),
        stream(server.port, "/v1/completions", {**body, "stream": True}, {"traceparent": traceparent}),
    ]


def check_untraced(server: Server, answers: list[Any]) -> None:
    for reply in answers:
        assert reply.status == 200 and "traceparent" not in reply.headers
        request_log_lines(server, reply.headers["x-request-id"])  # their access lines are written
    lines = server.log_lines()
    assert not [line for line in lines if "trace_id" in line or "span_id" in line]
    assert not [line for line in lines if line["message"].startswith("tracing on")]


def test_without_otel_configuration_nothing_is_traced(tmp_path: Path, bundle_path: Path) -> None:
    """No OTEL_* variable (start_server never passes the caller's on): no exporter, no ids."""
    with serving(tmp_path, bundle_path) as server:
        answers = untraced_answers(server)
        check_untraced(server, answers)
        assert not [line for line in server.log_lines() if line["message"].startswith("tracing")]


def test_with_the_sdk_disabled_nothing_is_sent(tmp_path: Path, bundle_path: Path) -> None:
    """An endpoint configured, and OTEL_SDK_DISABLED=true: the receiver hears nothing, not
    even at shutdown (when a tracing server exports what it still holds)."""
    with otlp_receiver() as receiver:
        environment = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_SDK_DISABLED": "true",
            "OTEL_BSP_SCHEDULE_DELAY": "50",
        }
        with serving(tmp_path, bundle_path, environment=environment) as server:
            answers = untraced_answers(server)
            check_untraced(server, answers)
            assert [line["message"] for line in server.log_lines() if line["message"].startswith("tracing")] == [
                "tracing off: OTEL_SDK_DISABLED is true"
            ]
        # The server has exited (cleanly: serving() checks): whatever it would have sent is sent.
        assert (receiver.posts, receiver.spans, receiver.refused) == (0, [], [])


def test_spans_still_batched_at_a_graceful_shutdown_are_exported(tmp_path: Path, bundle_path: Path) -> None:
    """The batch is sent every ten minutes here, so the spans of a request are still held when
    SIGTERM comes: the drain exports them before the process exits."""
    with otlp_receiver() as receiver:
        environment = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "600000"}
        trace_id, _, traceparent = caller()
        with serving(tmp_path, bundle_path, environment=environment) as server:
            body = {"prompt": "still", "max_new_tokens": 2, "temperature": 0}
            reply = server.post("/generate", body, headers={"traceparent": traceparent})
            assert reply.status == 200
            request_log_lines(server, reply.headers["x-request-id"])  # the request is over: its spans ended
            assert receiver.posts == 0  # held in the batch
        # serving() sent SIGTERM and saw the server exit 0: nothing left to wait for.
        assert sorted(s.name for s in receiver.of_trace(trace_id)) == sorted(("POST /generate", *ENGINE_CHILDREN))
