"""schemathesis against a real `aieng serve`: requests generated from the server's own
/openapi.json, valid and invalid, sent over HTTP to the tiny bundle on loopback.

No answer may be a 5xx, and every answer must be one the document declares: its status, its
content type, its headers and its body's schema (each event of a stream too). A request the
document forbids is refused with a 4xx, never served; valid requests reach the handlers'
success paths. /admin/reload is fuzzed too: without AIENG_ADMIN_TOKEN it answers 404
(disabled), never fails.

Bounded: MAX_EXAMPLES per operation and generation mode, derandomized (the same requests
every run), no example database, no deadline (timing on a shared 2-core machine is noise).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from aieng_core.config import load_config
from tests.conftest import TINY_CONFIG
from tests.e2e.serve_helpers import Server, serving

pytestmark = pytest.mark.e2e

MAX_EXAMPLES = 25
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
# Every operation the server documents, with the generation modes that apply to it (an
# operation without parameters or body has no invalid request to make). A new operation fails
# the first test until it is listed here.
BOTH = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
OPERATIONS = {
    "POST /generate": BOTH,
    "POST /predict": BOTH,
    "POST /v1/completions": BOTH,
    "POST /v1/chat/completions": BOTH,
    "POST /admin/reload": BOTH,
    "GET /v1/models": (GenerationMode.POSITIVE,),
    "GET /v1/models/{model}": (GenerationMode.POSITIVE,),
    "GET /health/live": (GenerationMode.POSITIVE,),
    "GET /health/ready": (GenerationMode.POSITIVE,),
    "GET /version": (GenerationMode.POSITIVE,),
    "GET /metrics": (GenerationMode.POSITIVE,),
}
CASES = [pytest.param(label, mode, id=f"{label}-{mode.value}") for label, modes in OPERATIONS.items() for mode in modes]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, serving_bundle_artifact) -> Iterator[Server]:
    with serving(tmp_path_factory.mktemp("api-schema"), serving_bundle_artifact.bundle.path) as running:
        yield running


@pytest.fixture(scope="module")
def api_schema(server: Server) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"http://127.0.0.1:{server.port}/openapi.json")


def test_the_document_lists_every_operation(api_schema: schemathesis.BaseSchema) -> None:
    labels = [result.ok().label for result in api_schema.get_all_operations()]
    assert sorted(labels) == sorted(OPERATIONS)


# schemathesis' own pytest integration (schema.parametrize) breaks on pytest 9.2's node ids:
# the same checks run here from its Hypothesis strategies, one test per operation and mode.
@pytest.mark.parametrize(("label", "mode"), CASES)
def test_every_answer_is_declared_and_none_is_a_server_error(
    api_schema: schemathesis.BaseSchema, label: str, mode: GenerationMode
) -> None:
    operation = api_schema.find_operation_by_label(label)
    assert operation is not None, label

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def answers_conform(case: schemathesis.Case) -> None:
        response = case.call_and_validate(checks=CHECKS, timeout=60)
        statuses.append(response.status_code)

    statuses: list[int] = []
    answers_conform()
    print(label, mode.value, sorted(Counter(statuses).items()))
    if mode == GenerationMode.NEGATIVE:  # what the document forbids is refused, never served
        assert statuses and all(400 <= status < 500 for status in statuses), statuses
    elif label == "POST /admin/reload":  # no AIENG_ADMIN_TOKEN: disabled, whatever the request
        assert statuses and set(statuses) == {404}, statuses
    elif label == "GET /v1/models/{model}":  # any name is well formed; only two are served
        # (test_openai_parameters.py retrieves those two)
        assert statuses and set(statuses) <= {200, 404}, statuses
    else:  # the fuzzing reached the handlers' success paths, not only their refusals
        assert 200 in statuses, statuses


def test_the_documented_bounds_come_from_the_config(api_schema: schemathesis.BaseSchema) -> None:
    max_context = load_config(TINY_CONFIG).bundle.max_context
    schemas = api_schema.raw_schema["components"]["schemas"]
    for model, field in (
        ("GenerateRequest", "max_new_tokens"),
        ("SamplingOptions", "max_new_tokens"),
        ("CompletionRequest", "max_tokens"),
    ):
        (integer,) = [branch for branch in schemas[model]["properties"][field]["anyOf"] if branch["type"] == "integer"]
        assert integer["maximum"] == max_context - 1, (model, field)


def test_a_streamed_completion_is_declared_server_sent_events(api_schema: schemathesis.BaseSchema) -> None:
    operation = api_schema.find_operation_by_label("POST /v1/completions")
    case = operation.Case(body={"prompt": "a", "max_tokens": 2, "stream": True}, media_type="application/json")
    response = case.call_and_validate(checks=CHECKS, timeout=60)
    assert response.status_code == 200
    assert response.headers["content-type"][0].startswith("text/event-stream")
    assert response.text.endswith("data: [DONE]\n\n")


def test_a_body_that_is_not_json_is_400_invalid_json(server: Server) -> None:
    reply = server.post("/generate", b"\x00")
    assert reply.status == 400
    assert reply.error["code"] == "invalid_json" and reply.error["param"] is None
    assert reply.error["message"].startswith("the request body is not valid JSON")


def test_values_are_taken_as_the_json_types_the_document_says(server: Server) -> None:
    # An integer may be written 2.0 (JSON Schema's integer); true and "2" are not numbers.
    assert server.post("/generate", {"prompt": "a", "max_new_tokens": 2.0}).json["tokens"] == 2
    for field, value in (("max_new_tokens", True), ("max_new_tokens", "2"), ("temperature", False)):
        reply = server.post("/generate", {"prompt": "a", field: value})
        assert reply.status == 400 and reply.error["param"] == field, reply.body
        assert "expected a number" in reply.error["message"]
    stream = server.post("/v1/completions", {"prompt": "a", "stream": "true"})
    assert stream.status == 400 and stream.error["param"] == "stream"
