"""`create_app`: the HTTP app of `aieng serve`, composed from its parts (see __init__.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from aieng_core.config import AiengConfig
from aieng_core.serving.http import routes_admin, routes_native, routes_openai, routes_ops
from aieng_core.serving.http.api_models import error_body
from aieng_core.serving.http.api_schema import finish_openapi
from aieng_core.serving.http.config_watch import ConfigWatch
from aieng_core.serving.http.errors import ApiError, refused, validation_error
from aieng_core.serving.http.following import PointerTarget, follow_pointer
from aieng_core.serving.http.logs import note_refusal
from aieng_core.serving.http.middleware import BodyLimitMiddleware, RequestContextMiddleware
from aieng_core.serving.http.state import ServingState
from aieng_core.store.request_log import RequestLog

if TYPE_CHECKING:
    from aieng_core.serving.http.tracing import Tracing

log = logging.getLogger("aieng.serving.http")


def create_app(
    bundle_path: Path | None,
    config: AiengConfig,
    admin_token: str | None,
    follow: Callable[[], PointerTarget] | None = None,
    request_log: RequestLog | None = None,
    config_path: Path | None = None,
    tracing: Tracing | None = None,
) -> FastAPI:
    """Serve the bundle at `bundle_path`, or (with `follow`) whatever a deployment pointer names;
    with `request_log`, one record per answered request (closed when the app shuts down); with
    `config_path` (the file `config` was read from), aieng_config_valid says whether it still loads;
    with `tracing`, a span per request (tracing.py), the last ones exported when the app shuts down."""
    state = ServingState(Path(bundle_path) if bundle_path is not None else None, config, admin_token, follow)
    state.request_log = request_log
    state.tracing = tracing
    if config_path is not None:
        state.config_watch = ConfigWatch(Path(config_path))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.reload_lock = asyncio.Lock()
        loading = asyncio.create_task(state.initial_load())
        following = asyncio.create_task(follow_pointer(state)) if follow is not None else None
        try:
            yield
        finally:
            if following is not None:
                following.cancel()
            if not loading.done():
                loading.cancel()  # the load thread itself runs on; its replica is never installed
            try:
                await state.shutdown()
            finally:
                if tracing is not None:
                    # After the last request's span ended; blocking (an export), so not on the loop.
                    await asyncio.to_thread(tracing.shutdown)

    app = FastAPI(title="aieng", version=routes_ops.server_version(), lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.serving = state
    # Added first, so it runs inside RequestContextMiddleware: a 413 is logged and counted too.
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.serving.max_request_bytes)
    app.add_middleware(RequestContextMiddleware, state=state)
    fastapi_openapi = app.openapi
    # The limits of the bundle served now (the config's until one is loaded: a bundle built
    # under another recipe has other limits).
    app.openapi = lambda: finish_openapi(  # type: ignore[method-assign]
        fastapi_openapi(), state.current.max_context if state.current is not None else config.bundle.max_context
    )
    for router in (routes_native.router, routes_openai.router, routes_ops.router, routes_admin.router):
        app.include_router(router)

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        if exc.status == 500:
            log.error("%s: %s", exc.type, exc.message)
        return refused(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        skip = 1 if errors and errors[0].get("loc", ("",))[0] == "body" else 0
        return refused(validation_error(errors, skip))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kinds = {404: "not_found_error", 405: "invalid_request_error"}
        message = f"{request.method} {request.url.path}: {exc.detail}"
        note_refusal(message)
        body = error_body(message, kinds.get(exc.status_code, "invalid_request_error"))
        return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    return app
