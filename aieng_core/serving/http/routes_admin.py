"""POST /admin/reload: swap to another verified bundle, behind a bearer token.

Disabled (404) unless the server was started with AIENG_ADMIN_TOKEN. A server that follows a
deployment pointer refuses it (409): what it serves changes only through the pointer.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends
from pydantic import ValidationError
from starlette.requests import Request as HttpRequest

from aieng_core.serving.http.api_models import ReloadRequest, ReloadResponse
from aieng_core.serving.http.api_schema import ADMIN_OPERATION, error_responses
from aieng_core.serving.http.errors import ApiError, unavailable, validation_error
from aieng_core.serving.http.state import BUNDLE_ERRORS, ServingState, serving_state

log = logging.getLogger("aieng.serving.http")

router = APIRouter()


def check_token(state: ServingState, request: HttpRequest) -> None:
    token = state.admin_token
    if token is None:
        raise ApiError(
            404,
            "the admin API is disabled: start the server with AIENG_ADMIN_TOKEN in its environment to enable it",
            "not_found_error",
            code="disabled",
        )
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise ApiError(
            401,
            "Authorization: expected 'Bearer <AIENG_ADMIN_TOKEN>'",
            "authentication_error",
            param="Authorization",
            headers={"WWW-Authenticate": "Bearer"},
        )
    # The bytes the client sent against the token's bytes, compared as digests of equal
    # length: the time taken tells nothing of the token, not even its length.
    sent = hashlib.sha256(given.strip().encode("latin-1")).digest()
    expected = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
    if not hmac.compare_digest(sent, expected):
        raise ApiError(403, "Authorization: wrong admin token", "permission_error", param="Authorization")


@router.post(
    "/admin/reload",
    responses={200: {"model": ReloadResponse}, **error_responses(400, 401, 403, 404, 409, 413, 422, 503)},
    openapi_extra=ADMIN_OPERATION,
)
async def admin_reload(request: HttpRequest, state: ServingState = Depends(serving_state)) -> Any:
    check_token(state, request)
    try:
        body = ReloadRequest.model_validate_json(await request.body())
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None
    if state.draining:
        raise unavailable("the server is shutting down", "draining")
    if state.follow is not None:
        raise ApiError(
            409,
            "this server follows a deployment pointer: change what it serves with "
            "`aieng deploy promote BUNDLE_ID` or `aieng deploy rollback`",
            "conflict",
            code="follows_deployment",
        )
    if state.phase != "ready" or state.reload_lock is None:
        raise ApiError(409, "the first bundle is still loading", "conflict", code="loading")
    if state.reload_lock.locked():
        raise ApiError(409, "another reload is in progress", "conflict", code="reload_in_progress")
    async with state.reload_lock:
        path = Path(body.bundle).expanduser()
        log.info("reloading from %s", path, extra={"bundle_path": str(path)})
        try:
            replica, previous = await state.reload(path)
        except Exception as exc:
            log.warning("reload refused: %s", exc, exc_info=not isinstance(exc, BUNDLE_ERRORS))
            raise ApiError(
                422, f"bundle refused, the current one keeps serving: {exc}", "invalid_bundle", param="bundle"
            ) from None
    log.info(
        "reloaded: now serving %s", replica.bundle_id, extra={"bundle_id": replica.bundle_id, "bundle_path": str(path)}
    )
    return {
        "bundle_id": replica.bundle_id,
        "previous_bundle_id": previous.bundle_id if previous is not None else None,
        "bundle_path": str(replica.bundle.path),
        "warmup": replica.warmup,
    }
