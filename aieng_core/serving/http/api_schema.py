"""What GET /openapi.json says beyond what FastAPI derives from the routes' models.

- Errors: every operation lists the statuses it can answer besides 200, each with the error
  body `{"error": {message, type, param, code}}`. FastAPI's own 422 (its validation error
  shape) is taken out: this server answers invalid input 400 with the error body.
- Bounds that depend on the server's config: max_new_tokens / max_tokens at most
  max_context - 1 (a prompt takes at least one token; the engine refuses the rest with 400).
- The admin API: its request body and its bearer token.
- The headers every response carries: X-Request-ID, X-Aieng-Bundle-Id, X-Aieng-Data-Version.

tests/e2e/test_api_schema.py holds the running server to this document with schemathesis.
"""

from __future__ import annotations

import json
from typing import Any

from aieng_core.serving.http.api_models import ChatCompletionChunk, ErrorBody, ReloadRequest

ERROR_DESCRIPTIONS = {
    400: "Invalid input: the message names the field, `param` holds its name.",
    401: "No admin token was given: send `Authorization: Bearer <AIENG_ADMIN_TOKEN>`.",
    403: "The admin token is wrong.",
    404: "A model this server does not serve (`param` is `model`), or the admin API is disabled "
    "(`code` is `disabled`: the server was started without AIENG_ADMIN_TOKEN).",
    409: "The server follows a deployment pointer, its first bundle is still loading, or another "
    "reload is in progress.",
    413: "The request body is larger than serving.max_request_bytes; it was not read further.",
    422: "The bundle was refused (missing, or it failed verification); the current one keeps serving.",
    429: "Overloaded: the request queue is full. Retry after `Retry-After` seconds.",
    500: "Internal error while generating; the message gives the request id.",
    503: "Not ready: the bundle is loading, the server is draining, no bundle is deployed, or the engine stopped.",
    504: "The request did not finish within serving.request_timeout_s.",
}
RETRY_AFTER: dict[str, Any] = {
    "Retry-After": {
        "description": "Seconds to wait before retrying.",
        "required": True,
        "schema": {"type": "integer", "minimum": 0},
    }
}
# On every response (middleware.py, provenance.py).
RESPONSE_HEADERS: dict[str, Any] = {
    "X-Request-ID": {
        "description": "The request's id: the client's X-Request-ID or body `request_id`, else generated.",
        "required": True,
        "schema": {"type": "string"},
    },
    "X-Aieng-Bundle-Id": {
        "description": "The serving bundle that answered (a generation request: the one it ran on; "
        "otherwise the one served now); `none` when no bundle is served.",
        "required": True,
        "schema": {"type": "string"},
    },
    "X-Aieng-Data-Version": {
        "description": "The content hash of that bundle's dataset_manifest; `none` when no bundle is "
        "served, `unknown` when the bundle's store does not hold its dataset_manifest.",
        "required": True,
        "schema": {"type": "string"},
    },
}
# One server-sent event of a streamed completion (OpenAPI before 3.2: `schema` describes each
# event): a chunk shaped as the whole completion (finish_reason null until the last; with
# include_usage, a last chunk with no choices and the usage), an error, or the final [DONE].
COMPLETION_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {
        "data": {
            "anyOf": [
                {"const": "[DONE]"},
                {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": {
                        "anyOf": [
                            {"$ref": "#/components/schemas/CompletionResponse"},
                            {"$ref": "#/components/schemas/ErrorBody"},
                        ]
                    },
                },
            ]
        },
    },
}
EVENT_STREAM: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The completion; with `stream: true`, server-sent events of completion chunks "
        "ending `data: [DONE]`.",
        "content": {"text/event-stream": {"schema": COMPLETION_EVENT}},
    }
}


def _event_of(component: str) -> dict[str, Any]:
    """COMPLETION_EVENT with `component` in place of CompletionResponse."""
    return json.loads(json.dumps(COMPLETION_EVENT).replace("/CompletionResponse", f"/{component}"))


CHAT_EVENT_STREAM: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The chat completion; with `stream: true`, server-sent events of chat.completion.chunk "
        "objects (the role first, then content deltas, the finish reason with the last) ending `data: [DONE]`.",
        "content": {"text/event-stream": {"schema": _event_of("ChatCompletionChunk")}},
    }
}
# Named by CHAT_EVENT_STREAM but by no handler's response_model: added to the components here.
DECLARED_ONLY = (ChatCompletionChunk,)
ADMIN_SCHEME = "AdminToken"
# The admin handler reads its body itself (the token is checked before the body is read).
ADMIN_OPERATION: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": ReloadRequest.model_json_schema()}},
    },
    "security": [{ADMIN_SCHEME: []}],
}
SAMPLING_BOUNDS = (
    ("GenerateRequest", "max_new_tokens"),
    ("SamplingOptions", "max_new_tokens"),
    ("CompletionRequest", "max_tokens"),
    ("ChatCompletionRequest", "max_tokens"),
    ("ChatCompletionRequest", "max_completion_tokens"),
)
FASTAPI_VALIDATION_SCHEMAS = ("HTTPValidationError", "ValidationError")


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """FastAPI's `responses=` for these error statuses, each with the error body."""
    responses: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        response: dict[str, Any] = {"model": ErrorBody, "description": ERROR_DESCRIPTIONS[status]}
        if status == 429:
            response["headers"] = RETRY_AFTER
        responses[status] = response
    return responses


def finish_openapi(schema: dict[str, Any], max_context: int) -> dict[str, Any]:
    """Complete FastAPI's document in place (idempotent: FastAPI caches it) and return it."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            if "HTTPValidationError" in str(responses.get("422", {})):
                del responses["422"]
            for response in responses.values():
                response["headers"] = {**response.get("headers", {}), **RESPONSE_HEADERS}
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for declared_model in DECLARED_ONLY:
        declared = declared_model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, definition in declared.pop("$defs", {}).items():
            schemas.setdefault(name, definition)
        schemas.setdefault(declared_model.__name__, declared)
    for name in FASTAPI_VALIDATION_SCHEMAS:
        components.get("schemas", {}).pop(name, None)

    largest = max_context - 1
    for model, field in SAMPLING_BOUNDS:
        prop = components["schemas"][model]["properties"][field]
        for branch in prop.get("anyOf", [prop]):
            if branch.get("type") == "integer":
                branch["maximum"] = largest
        prop["description"] = f"At most max_context ({max_context}) minus the prompt's tokens."

    components.setdefault("securitySchemes", {})[ADMIN_SCHEME] = {
        "type": "http",
        "scheme": "bearer",
        "description": "The value of AIENG_ADMIN_TOKEN in the server's environment; without it the "
        "admin API is disabled (404).",
    }
    return schema
