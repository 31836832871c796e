"""How the HTTP API says no: OpenAI's error body `{"error": {message, type, param, code}}`,
with a message naming the field as the client spelled it, and never a stack trace."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from fastapi.responses import JSONResponse

from aieng_core.serving.http.api_models import error_body
from aieng_core.serving.http.logs import note_refusal
from aieng_core.serving.request import RequestError, SamplingParams

if TYPE_CHECKING:  # the engine (torch) is imported only where it runs: the server answers before it loads
    from aieng_core.serving.engine import RequestOutput

# Seconds a client told 429 should wait: a slot frees as soon as any running sequence ends.
RETRY_AFTER_S = 1


class ApiError(Exception):
    """An error answered with OpenAI's error body: {"error": {message, type, param, code}}."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


class ClientGone(Exception):
    """The client disconnected before its response was ready."""


def refused(error: ApiError) -> JSONResponse:
    """The error's response, its reason noted for the request's access log line and record."""
    note_refusal(error.message)
    return error.response()


def unavailable(message: str, code: str) -> ApiError:
    return ApiError(503, message, "unavailable", code=code)


def queue_full() -> ApiError:
    return ApiError(
        429,
        "the server is overloaded: its request queue is full; retry after a moment",
        "overloaded",
        code="queue_full",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


# pydantic names the member of a union (or a constrained type) it tried inside an error's
# location: `constrained-str`, `list[constrained-str]`, `function-after[...]`, `str`. No
# client sent a field of that name.
TYPE_TAG_WORDS = {"str", "int", "float", "bool", "bytes", "list", "dict", "none", "literal"}


def _is_type_tag(part: Any) -> bool:
    return isinstance(part, str) and (any(c in part for c in "-[]") or part in TYPE_TAG_WORDS)


def _field_path(loc: Sequence[Any]) -> list[str]:
    """The field names and list positions of a pydantic error location, as a client sent them."""
    return [str(part) for part in loc if not _is_type_tag(part)]


def _first_problem(errors: Sequence[Any], skip: int) -> tuple[Any, list[str]]:
    """The error to report and its field path. A value that fits no member of a union gets an
    error per member; the one to tell is a member's complaint about the value (too short, too
    many items), not that it is not another member's type: `prompt: [""]` is a list with an
    empty string in it, not "not a valid string"."""
    first = errors[0]
    path = _field_path(list(first.get("loc", ()))[skip:])
    if not any(_is_type_tag(part) for part in first.get("loc", ())):
        return first, path
    same_field = [e for e in errors if _field_path(list(e.get("loc", ()))[skip:])[:1] == path[:1]]
    for error in same_field:
        if not str(error.get("type", "")).endswith("_type"):
            return error, _field_path(list(error.get("loc", ()))[skip:])
    # The value is of no member's type: say every type it may be, in pydantic's words.
    kinds = [str(e.get("msg", "")).removeprefix("Input should be ") for e in same_field]
    return {**first, "msg": "should be " + " or ".join(dict.fromkeys(kinds))}, path[:1]


def validation_error(errors: Sequence[Any], skip: int = 0) -> ApiError:
    """A 400 naming the first invalid field in plain words (pydantic's error locations, minus
    `skip` prefixes, without pydantic's own type tags)."""
    first, loc = _first_problem(errors, skip)
    raw_loc = list(first.get("loc", ()))[skip:]
    param = loc[0] if loc else None
    where = ".".join(loc)
    kind = first.get("type", "")
    if kind == "extra_forbidden":
        message = f"unknown field '{where}'"
        code = "unknown_field"
    elif kind == "json_invalid":  # its location is a character position, not a field
        at = f" at character {raw_loc[0]}" if raw_loc else ""
        message = f"the request body is not valid JSON ({first.get('ctx', {}).get('error', 'unreadable')}{at})"
        param, code = None, "invalid_json"
    elif kind in ("model_attributes_type", "dict_type") and not loc:
        message = "the request body must be a JSON object"
        code = "invalid_json"
    else:
        text = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        if kind == "string_too_short" and first.get("ctx", {}).get("min_length") == 1:
            text = "must not be empty"
        message = f"{where}: {text}" if where else text
        code = "unsupported_parameter" if "is not supported" in text else "invalid_value"
    return ApiError(400, message, "invalid_request_error", param=param, code=code)


def request_error(exc: RequestError, rename: dict[str, str] | None = None) -> ApiError:
    """The engine's or SamplingParams' refusal as a 400 naming the field as the client spelled it."""
    name = (rename or {}).get(exc.field, exc.field)
    message = str(exc).removeprefix(f"{exc.field}: ")
    return ApiError(400, f"{name}: {message}", "invalid_request_error", param=name, code="invalid_value")


def checked_params(make: Callable[[], SamplingParams], rename: dict[str, str] | None = None) -> SamplingParams:
    try:
        return make()
    except RequestError as exc:
        raise request_error(exc, rename) from None


def unfinished_error(outputs: Sequence[RequestOutput], request_id: str) -> ApiError | None:
    """A generation that ended other than stop/length is no answer: 500 for an engine error,
    503 when the engine was stopped under it (shutdown)."""
    for output in outputs:
        if not output.finished or output.finish_reason in ("stop", "length"):
            continue
        if output.finish_reason == "error":
            return ApiError(
                500, f"internal error while generating (request id {request_id})", "internal_error", code="engine_error"
            )
        return unavailable(
            f"the request was {output.finish_reason} by the server (request id {request_id})", str(output.finish_reason)
        )
    return None
