"""The HTTP app of `aieng serve`: FastAPI in front of an EngineLoop. The only module that
imports FastAPI or Starlette; the engine knows nothing of HTTP.

Each generation request is submitted to the engine's background thread with a sink that
hands every RequestOutput back to the event loop (call_soon_threadsafe into an asyncio
queue). The handler waits on that queue under the request's deadline (queue time counts)
while watching the client: a client that goes away, or a deadline that passes, cancels the
engine request, and the engine frees its KV slot at its next step.

Lifecycle: /health/live answers at once; the bundle is loaded, verified, warmed up and given
a one-token forward in a background thread, and only then does /health/ready turn 200.
begin_drain() (the server calls it on SIGTERM) turns readiness to 503 and refuses new
generation requests while those in flight finish. POST /admin/reload swaps to another
verified bundle: new requests go to the new engine, in-flight ones finish on the old one,
whose loop is then stopped. A server started with a `follow` callable (`aieng serve
--deployment current`) instead polls a deployment pointer and makes the same swap whenever
a promote or rollback changes it; a pointer rolled back to no bundle turns readiness to 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import importlib
import importlib.metadata
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aieng_core.config import AiengConfig
from aieng_core.serving.api_models import (
    REQUEST_ID_PATTERN,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    GenerateRequest,
    GenerateResponse,
    LiveStatus,
    ModelCard,
    ModelList,
    PredictOutput,
    PredictRequest,
    PredictResponse,
    ReadyStatus,
    ReloadRequest,
    ReloadResponse,
    RequestDefaults,
    Usage,
    VersionInfo,
    error_body,
)
from aieng_core.serving.api_schema import (
    ADMIN_OPERATION,
    EVENT_STREAM,
    error_responses,
    finish_openapi,
)
from aieng_core.serving.body_limit import BodyLimitMiddleware
from aieng_core.serving.device import resolve_device
from aieng_core.serving.logs import bind_request, current_context, unbind_request
from aieng_core.serving.metrics import RequestTracker, ServingMetrics
from aieng_core.serving.request import RequestError, SamplingParams
from aieng_core.store import ArtifactIntegrityError

log = logging.getLogger("aieng.serving.http")

# The model name every request may use besides the bundle id (clients that hard-code one).
MODEL_ALIAS = "aieng"
# Seconds a client told 429 should wait: a slot frees as soon as any running sequence ends.
RETRY_AFTER_S = 1
GENERATION_ENDPOINTS = ("/generate", "/predict", "/v1/completions")
ENDPOINTS = (
    *GENERATION_ENDPOINTS,
    "/v1/models",
    "/health/live",
    "/health/ready",
    "/version",
    "/metrics",
    "/admin/reload",
)
_REQUEST_ID_RE = re.compile(REQUEST_ID_PATTERN)
# Why a bundle cannot be served, said in one line: no traceback in the log for these.
BUNDLE_ERRORS = (ArtifactIntegrityError, OSError, ValueError)
# How each API spells the engine's field names.
OPENAI_NAMES = {"max_new_tokens": "max_tokens"}
OPTIONS = {
    "prompt": "inputs",
    **{f: f"options.{f}" for f in ("max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop", "ignore_eos")},
}


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

    def response(self) -> JSONResponse:
        body = error_body(self.message, self.type, self.param, self.code)
        return JSONResponse(body, status_code=self.status, headers=self.headers)


class ClientGone(Exception):
    """The client disconnected before its response was ready."""


def validation_error(errors: Sequence[Any], skip: int = 0) -> ApiError:
    """A 400 naming the first invalid field (pydantic's error locations, minus `skip` prefixes)."""
    first = errors[0]
    loc = [str(part) for part in first.get("loc", ())[skip:]]
    param = loc[0] if loc else None
    where = ".".join(loc)
    kind = first.get("type", "")
    if kind == "extra_forbidden":
        message = f"unknown field '{where}'"
        code = "unknown_field"
    elif kind == "json_invalid":  # its location is a character position, not a field
        at = f" at character {loc[0]}" if loc else ""
        message = f"the request body is not valid JSON ({first.get('ctx', {}).get('error', 'unreadable')}{at})"
        param, code = None, "invalid_json"
    elif kind in ("model_attributes_type", "dict_type") and not loc:
        message = "the request body must be a JSON object"
        code = "invalid_json"
    else:
        text = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        message = f"{where}: {text}" if where else text
        code = "unsupported_parameter" if "is not supported" in text else "invalid_value"
    return ApiError(400, message, "invalid_request_error", param=param, code=code)


@dataclass
class Deployment:
    """One loaded bundle and the engine loop serving it."""

    bundle: Any  # aieng_core.bundle.LoadedBundle
    loop: Any  # aieng_core.serving.engine.EngineLoop
    defaults: RequestDefaults
    warmup: dict[str, Any]
    loaded_at: float = field(default_factory=time.time)
    active: int = 0  # HTTP requests using this deployment's engine
    retired: bool = False

    @property
    def bundle_id(self) -> str:
        return str(self.bundle.bundle_id)

    @property
    def max_context(self) -> int:
        return int(self.bundle.serving["max_context"])


def open_deployment(bundle_path: Path, config: AiengConfig, on_step: Callable[..., None]) -> Deployment:
    """Load and verify a bundle, warm its engine up, prove a forward works, start its loop.

    Blocking (seconds): run it off the event loop. The bundle fixes the model, its limits of
    memory and context (max_batch, max_context, max_prefill_tokens) and the request defaults;
    the server's config fixes how it behaves under load (max_waiting, timeouts, threads)."""
    from aieng_core.bundle import load_bundle
    from aieng_core.serving.engine import EngineLoop

    serving = config.serving
    bundle = load_bundle(bundle_path, device=resolve_device(serving.device))
    engine = bundle.make_engine(max_waiting=serving.max_waiting)
    lengths = [n for n in serving.warmup_prompt_lengths if n < engine.limits.max_context]
    warmup = engine.warmup(lengths)
    engine.check_forward()
    s = bundle.serving
    defaults = RequestDefaults(
        max_new_tokens=int(s.get("default_max_new_tokens", 64)),
        temperature=float(s.get("default_temperature", 0.0)),
        top_k=int(s.get("default_top_k", 0)),
        top_p=float(s.get("default_top_p", 1.0)),
    )
    loop = EngineLoop(engine, on_step=on_step).start()
    return Deployment(bundle=bundle, loop=loop, defaults=defaults, warmup=warmup)


class ServingState:
    """What the server is doing: loading, ready, draining; which deployment serves; how
    many generation requests are in flight.

    `follow`, when given, reads the deployment pointer the server follows (it returns a
    deploy.follow.PointerTarget); the bundle path is then whatever the pointer names."""

    def __init__(
        self,
        bundle_path: Path | None,
        config: AiengConfig,
        admin_token: str | None,
        follow: Callable[[], Any] | None = None,
    ) -> None:
        if (bundle_path is None) == (follow is None):
            raise ValueError("serve either a bundle path or a deployment pointer, not both and not neither")
        self.bundle_path = bundle_path
        self.follow = follow
        self.following: Any = None  # the PointerTarget last acted on (loaded, emptied or refused)
        self.refused_at: float | None = None  # when `following` was refused (it is retried later)
        self.config = config
        self.admin_token = admin_token or None
        self.metrics = ServingMetrics()
        self.metrics.ready.set_function(lambda: float(self.ready))
        self.metrics.max_waiting.set(config.serving.max_waiting)
        self.phase = "loading"  # loading -> ready | failed
        self.error: str | None = None
        self.current: Deployment | None = None
        self.draining = False
        self.in_flight = 0
        self.reload_lock: asyncio.Lock | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._deployments: list[Deployment] = []

    # ---- lifecycle ---------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        # A loop that died (it fails its requests itself) is not ready: the load balancer moves on.
        return self.phase == "ready" and self.current is not None and not self.draining and self.current.loop.running

    @property
    def failed(self) -> bool:
        return self.phase == "failed"

    def begin_drain(self) -> None:
        if not self.draining:
            self.draining = True
            log.info("draining: readiness is 503, new requests are refused", extra={"in_flight": self.in_flight})

    def _on_step(self, step: Any, _engine_stats: Any = None) -> None:
        self.metrics.observe_step(step.batch_size)

    def _open(self, path: Path) -> Deployment:
        return open_deployment(path, self.config, self._on_step)

    async def initial_load(self) -> None:
        started = time.monotonic()
        try:
            if self.follow is not None:
                self.following = await asyncio.to_thread(self.follow)
                self.bundle_path = self.following.path
                if self.bundle_path is None:
                    # Import the engine now (torch and the model code take seconds), so the
                    # first promote only loads, verifies and warms its bundle.
                    for module in (
                        "aieng_core.bundle.verify",
                        "aieng_core.serving.engine",
                        "aieng_core.model.hf_files",
                    ):
                        await asyncio.to_thread(importlib.import_module, module)
                    self.phase = "ready"  # and not ready(): nothing to serve until a promote
                    log.warning("%s", self.no_bundle_message())
                    return
            assert self.bundle_path is not None
            deployment = await asyncio.to_thread(self._open, self.bundle_path)
        except Exception as exc:
            self.phase, self.error = "failed", str(exc)
            log.error("cannot serve bundle %s: %s", self.bundle_path, exc, exc_info=not isinstance(exc, BUNDLE_ERRORS))
            return
        self._install(deployment)
        self.phase = "ready"
        stats = deployment.loop.stats()
        log.info(
            "ready: bundle %s loaded, verified and warm",
            deployment.bundle_id,
            extra={
                "bundle_id": deployment.bundle_id,
                "bundle_path": str(self.bundle_path),
                "kv_cache_bytes": stats.kv_cache_bytes,
                "latency_ms": round((time.monotonic() - started) * 1000, 1),
                "timings": deployment.warmup,
            },
        )

    def _install(self, deployment: Deployment) -> Deployment | None:
        previous = self.current
        self.current = deployment
        self._deployments.append(deployment)
        self.metrics.set_bundle(deployment.bundle_id)
        if previous is not None:
            previous.retired = True
            self._maybe_stop(previous)
        return previous

    def _uninstall(self) -> Deployment | None:
        """Serve nothing (a pointer rolled back to no bundle): in-flight requests finish on
        the retired engine; new ones get 503 until a bundle is promoted."""
        previous, self.current = self.current, None
        self.metrics.set_bundle(None)
        if previous is not None:
            previous.retired = True
            self._maybe_stop(previous)
        return previous

    def deployment_info(self) -> dict[str, Any]:
        """The pointer this server follows, what it names, and whether that was refused."""
        following = self.following
        return {
            "pointer": following.pointer,
            "bundle_id": following.bundle_id,
            "sequence": following.sequence,
            "refused": self.refused_at is not None,
        }

    def no_bundle_message(self) -> str:
        pointer = self.following.pointer if self.following is not None else "production"
        return f"no bundle is deployed on the {pointer} pointer; promote one with `aieng deploy promote BUNDLE_ID`"

    async def follow_pointer(self, interval_s: float, retry_s: float = 30.0) -> None:
        """Poll the deployment pointer; swap (or empty) the served bundle when it changes.

        A bundle the pointer names but that fails to load or verify is refused (logged as an
        error) and the current one keeps serving; it is tried again every `retry_s` (a
        failure can pass, e.g. memory freed), and at once when the pointer changes.
        /health/ready and /version show what the pointer names beside what is served."""
        assert self.follow is not None and self.reload_lock is not None
        unreadable: str | None = None
        while not self.draining:
            await asyncio.sleep(interval_s)
            if self.phase != "ready" or self.draining:
                continue
            try:
                target = await asyncio.to_thread(self.follow)
            except Exception as exc:
                if str(exc) != unreadable:  # once per distinct problem, not every poll
                    unreadable = str(exc)
                    log.error("cannot read the deployment pointer; still serving what was loaded: %s", exc)
                continue
            unreadable = None
            unchanged = self.following is not None and target.bundle_id == self.following.bundle_id
            if unchanged and (self.refused_at is None or time.monotonic() - self.refused_at < retry_s):
                continue
            async with self.reload_lock:
                old_id = self.current.bundle_id if self.current is not None else None
                self.following, self.refused_at = target, None
                if target.bundle_id is not None and target.bundle_id == old_id:
                    continue  # rolled back to the bundle still served (after a refused one): nothing to load
                if target.path is None:
                    self._uninstall()
                    log.warning(
                        "the %s pointer was emptied (was %s): %s", target.pointer, old_id, self.no_bundle_message()
                    )
                    continue
                started = time.monotonic()
                try:
                    deployment, _previous = await self.reload(target.path)
                except Exception as exc:
                    self.refused_at = time.monotonic()
                    log.error(
                        "the %s pointer names bundle %s, which was refused (retried in %g s); still serving %s: %s",
                        target.pointer,
                        target.bundle_id,
                        retry_s,
                        old_id,
                        exc,
                        exc_info=not isinstance(exc, BUNDLE_ERRORS),
                    )
                    continue
                log.info(
                    "following the %s pointer: now serving %s (was %s)",
                    target.pointer,
                    deployment.bundle_id,
                    old_id,
                    extra={
                        "bundle_id": deployment.bundle_id,
                        "bundle_path": str(target.path),
                        "latency_ms": round((time.monotonic() - started) * 1000, 1),
                    },
                )

    def _maybe_stop(self, deployment: Deployment) -> None:
        if deployment.retired and deployment.active == 0:
            task = asyncio.get_running_loop().create_task(asyncio.to_thread(deployment.loop.stop, 10.0))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            with contextlib.suppress(ValueError):
                self._deployments.remove(deployment)
            log.info("stopped the engine of retired bundle %s", deployment.bundle_id)

    async def shutdown(self) -> None:
        for deployment in list(self._deployments):
            await asyncio.to_thread(deployment.loop.stop, 10.0)
        self._deployments.clear()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    # ---- leases: which deployment a generation request uses --------------------------------------
    def acquire(self) -> Deployment:
        if self.draining:
            self.metrics.reject("draining")
            raise ApiError(503, "the server is shutting down; retry on another replica", "unavailable", code="draining")
        if not self.ready or self.current is None:
            self.metrics.reject("not_ready")
            if self.phase == "ready" and self.current is None:
                raise ApiError(503, self.no_bundle_message(), "unavailable", code="no_deployment")
            detail = f": {self.error}" if self.error else " (loading the bundle)"
            raise ApiError(503, f"the server is not ready{detail}", "unavailable", code="not_ready")
        deployment = self.current
        deployment.active += 1
        self.in_flight += 1
        return deployment

    def release(self, deployment: Deployment) -> None:
        deployment.active -= 1
        self.in_flight -= 1
        self._maybe_stop(deployment)

    async def reload(self, path: Path) -> tuple[Deployment, Deployment | None]:
        deployment = await asyncio.to_thread(self._open, path)
        self.bundle_path = path
        return deployment, self._install(deployment)


# ---- one generation request, seen from the event loop --------------------------------------------


class Generation:
    """The engine requests of one HTTP request (one per prompt), their outputs merged into
    one asyncio queue as (index, RequestOutput)."""

    def __init__(self, state: ServingState, deployment: Deployment, arrival: float) -> None:
        self.state = state
        self.deployment = deployment
        self.arrival = arrival
        self.deadline = arrival + state.config.serving.request_timeout_s
        self.queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self.requests: list[Any] = []
        self.finals: dict[int, Any] = {}
        self.largest_batch = 0  # the most sequences a step of this request ran with
        self._released = False

    def submit(
        self, request_id: str, prompts: Sequence[str], params: SamplingParams, rename: dict[str, str] | None = None
    ) -> None:
        loop = asyncio.get_running_loop()
        engine_loop = self.deployment.loop
        for index, prompt in enumerate(prompts):
            tracker = RequestTracker(self.state.metrics, time.monotonic)
            sink = self._sink(loop, index, tracker)
            engine_id = request_id if len(prompts) == 1 else f"{request_id}-{index}"
            try:
                self.requests.append(engine_loop.submit(engine_id, prompt, params, sink))
            except RequestError as exc:
                raise request_error(exc, rename=rename) from None
            except Exception as exc:
                from aieng_core.serving.scheduler import QueueFull

                if isinstance(exc, QueueFull):
                    self.state.metrics.reject("overloaded")
                    raise ApiError(
                        429,
                        "the server is overloaded: its request queue is full; retry after a moment",
                        "overloaded",
                        code="queue_full",
                        headers={"Retry-After": str(RETRY_AFTER_S)},
                    ) from None
                raise

    def _sink(self, loop: asyncio.AbstractEventLoop, index: int, tracker: RequestTracker) -> Callable[[Any], None]:
        queue = self.queue
        engine = self.deployment.loop.engine

        def sink(output: Any) -> None:  # runs in the engine thread, right after the step
            tracker.on_output(output)
            if engine.last_step is not None:
                self.largest_batch = max(self.largest_batch, engine.last_step.batch_size)
            # A closed event loop means nobody waits any more (server exit).
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(queue.put_nowait, (index, output))

        return sink

    @property
    def done(self) -> bool:
        return len(self.finals) == len(self.requests)

    async def next(self) -> tuple[int, Any]:
        """The next output, or ApiError 504 once the deadline passes."""
        remaining = self.deadline - time.monotonic()
        try:
            if remaining <= 0:
                raise TimeoutError
            index, output = await asyncio.wait_for(self.queue.get(), remaining)
        except TimeoutError:
            self.cancel()
            self.state.metrics.reject("timeout")
            timeout = self.state.config.serving.request_timeout_s
            raise ApiError(
                504, f"the request did not finish within request_timeout_s ({timeout:g} s)", "timeout", code="timeout"
            ) from None
        if output.finished:
            self.finals[index] = output
        return index, output

    async def collect(self) -> list[Any]:
        while not self.done:
            await self.next()
        return [self.finals[i] for i in range(len(self.requests))]

    def cancel(self) -> None:
        for request in self.requests:
            if not request.finished:
                request.cancel()

    def close(self) -> None:
        """Cancel whatever has not finished and give the deployment back (idempotent)."""
        self.cancel()
        if not self._released:
            self._released = True
            self.state.release(self.deployment)

    def latency_ms(self) -> float:
        return round((time.monotonic() - self.arrival) * 1000, 3)

    def record(self, outputs: Sequence[Any]) -> None:
        """Numbers for this request's access log line."""
        context = current_context()
        if context is None:
            return
        context.fields.update(
            prompt_tokens=sum(o.prompt_tokens for o in outputs),
            completion_tokens=sum(len(o.token_ids) for o in outputs),
            finish_reason=",".join(sorted({str(o.finish_reason) for o in outputs})),
            batch_size=self.largest_batch,
        )


def unfinished_error(outputs: Sequence[Any], request_id: str) -> ApiError | None:
    """A generation that ended other than stop/length is no answer: 500 for an engine error,
    503 when the engine was stopped under it (shutdown)."""
    for output in outputs:
        if not output.finished or output.finish_reason in ("stop", "length"):
            continue
        if output.finish_reason == "error":
            return ApiError(
                500, f"internal error while generating (request id {request_id})", "internal_error", code="engine_error"
            )
        return ApiError(
            503,
            f"the request was {output.finish_reason} by the server (request id {request_id})",
            "unavailable",
            code=str(output.finish_reason),
        )
    return None


def usage(outputs: Sequence[Any]) -> Usage:
    prompt_tokens = sum(o.prompt_tokens for o in outputs)
    completion_tokens = sum(len(o.token_ids) for o in outputs)
    return Usage(
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, total_tokens=prompt_tokens + completion_tokens
    )


async def wait_for_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: Request, work: Awaitable[Any]) -> Any:
    """Await `work`, cancelling it (and raising ClientGone) if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect(request.receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise ClientGone
    finally:
        watcher.cancel()
        task.cancel()


class EventStream(StreamingResponse):
    """Server-sent events that always listen for the client going away (whatever ASGI spec
    version the server speaks), and always run `on_close` once the response is over or
    abandoned: it cancels the engine requests and ends the request's lease."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None], headers: dict[str, str]) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache", **headers})
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:
                        pass  # the client went away mid-write
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await wait_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            self.on_close()


def sse(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


# ---- the app -----------------------------------------------------------------------------------


class RequestContextMiddleware:
    """Binds the request id (X-Request-ID, else generated) for every log line of the request,
    echoes it in the response header, counts the response by endpoint and status, writes one
    access log line, and turns an exception that escaped a handler into a 500 naming only the
    request id."""

    def __init__(self, app: ASGIApp, state: ServingState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        given = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"x-request-id"), None)
        valid = given is None or bool(_REQUEST_ID_RE.match(given))
        request_id = given if given is not None and valid else uuid.uuid4().hex
        context, token = bind_request(request_id)
        path = scope.get("path", "")
        endpoint = path if path in ENDPOINTS else "other"
        status = {"code": 500, "started": False}

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"], status["started"] = message["status"], True
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                headers.append((b"x-request-id", context.request_id.encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)

        try:
            if not valid:
                error = ApiError(
                    400,
                    "X-Request-ID: use 1 to 128 characters of A-Z a-z 0-9 . _ : - /",
                    "invalid_request_error",
                    param="X-Request-ID",
                    code="invalid_value",
                )
                await error.response()(scope, receive, send_with_id)
            else:
                await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception("unhandled error in %s %s", scope.get("method"), path)
            if not status["started"]:
                error = ApiError(500, f"internal error (request id {context.request_id})", "internal_error")
                await error.response()(scope, receive, send_with_id)
        finally:
            self.state.metrics.count_http(endpoint, int(status["code"]))
            if endpoint != "/metrics" and not endpoint.startswith("/health"):
                log.info(
                    "%s %s %s",
                    scope.get("method"),
                    path,
                    status["code"],
                    extra={
                        "method": scope.get("method"),
                        "path": path,
                        "status": status["code"],
                        "latency_ms": round((time.monotonic() - started) * 1000, 3),
                        **context.fields,
                    },
                )
            unbind_request(token)


def _server_version() -> str:
    try:
        return importlib.metadata.version("aieng")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# How often `aieng serve --deployment` reads its pointer: a promote or rollback is seen
# within this, then takes the time to load, verify and warm the bundle.
FOLLOW_INTERVAL_S = 0.2


def create_app(
    bundle_path: Path | None,
    config: AiengConfig,
    admin_token: str | None,
    follow: Callable[[], Any] | None = None,
) -> FastAPI:
    state = ServingState(Path(bundle_path) if bundle_path is not None else None, config, admin_token, follow)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.reload_lock = asyncio.Lock()
        loading = asyncio.create_task(state.initial_load())
        following = asyncio.create_task(state.follow_pointer(FOLLOW_INTERVAL_S)) if follow is not None else None
        try:
            yield
        finally:
            if following is not None:
                following.cancel()
            if not loading.done():
                loading.cancel()  # the load thread itself runs on; its deployment is never installed
            await state.shutdown()

    app = FastAPI(title="aieng", version=_server_version(), lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.serving = state
    # Added first, so it runs inside RequestContextMiddleware: a 413 is logged and counted too.
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.serving.max_request_bytes)
    app.add_middleware(RequestContextMiddleware, state=state)
    fastapi_openapi = app.openapi
    app.openapi = lambda: finish_openapi(fastapi_openapi(), config.serving)  # type: ignore[method-assign]

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        if exc.status == 500:
            log.error("%s: %s", exc.type, exc.message)
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        skip = 1 if errors and errors[0].get("loc", ("",))[0] == "body" else 0
        return validation_error(errors, skip).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kinds = {404: "not_found_error", 405: "invalid_request_error"}
        message = f"{request.method} {request.url.path}: {exc.detail}"
        body = error_body(message, kinds.get(exc.status_code, "invalid_request_error"))
        return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    def request_id_for(body_id: str | None) -> str:
        context = current_context()
        if body_id is not None and context is not None:
            context.request_id = body_id  # the body's id wins: the header and logs follow it
        return body_id or (context.request_id if context is not None else uuid.uuid4().hex)

    def check_model(model: str | None, deployment: Deployment) -> None:
        if model is not None and model not in (deployment.bundle_id, MODEL_ALIAS):
            raise ApiError(
                404,
                f"model '{model}' does not exist; this server serves '{deployment.bundle_id}' (alias '{MODEL_ALIAS}')",
                "not_found_error",
                param="model",
                code="model_not_found",
            )

    async def start(
        request_id: str,
        prompts: Sequence[str],
        params: SamplingParams,
        model: str | None = None,
        rename: dict[str, str] | None = None,
    ) -> Generation:
        arrival = time.monotonic()
        deployment = state.acquire()
        generation = Generation(state, deployment, arrival)
        try:
            check_model(model, deployment)
            generation.submit(request_id, prompts, params, rename)
        except BaseException:
            generation.close()
            raise
        return generation

    async def run_to_end(request: Request, generation: Generation, request_id: str) -> list[Any]:
        try:
            outputs = await unless_disconnected(request, generation.collect())
        except ClientGone:
            log.info("client disconnected; request cancelled")
            raise
        finally:
            generation.close()
        generation.record(outputs)
        failure = unfinished_error(outputs, request_id)
        if failure is not None:
            raise failure
        return outputs

    def gone() -> Response:
        # Nobody reads this; 499 (nginx's "client closed request") keeps the metrics honest.
        return Response(status_code=499)

    @app.post("/generate", response_model=GenerateResponse, responses=error_responses(400, 413, 429, 500, 503, 504))
    async def generate(request: Request, body: GenerateRequest) -> Any:
        request_id = request_id_for(body.request_id)
        defaults = state.current.defaults if state.current is not None else RequestDefaults()
        params = _params(lambda: body.sampling_params(defaults))
        generation = await start(request_id, [body.prompt], params)
        try:
            (output,) = await run_to_end(request, generation, request_id)
        except ClientGone:
            return gone()
        return GenerateResponse(
            request_id=request_id,
            text=output.text,
            tokens=len(output.token_ids),
            token_ids=list(output.token_ids),
            finish_reason=output.finish_reason,
            latency_ms=generation.latency_ms(),
            prompt_tokens=output.prompt_tokens,
        )

    @app.post("/predict", response_model=PredictResponse, responses=error_responses(400, 413, 429, 500, 503, 504))
    async def predict(request: Request, body: PredictRequest) -> Any:
        request_id = request_id_for(body.request_id)
        defaults = state.current.defaults if state.current is not None else RequestDefaults()
        params = _params(lambda: body.options.sampling_params(defaults), rename=OPTIONS)
        generation = await start(request_id, body.inputs, params, rename=OPTIONS)
        try:
            outputs = await run_to_end(request, generation, request_id)
        except ClientGone:
            return gone()
        return PredictResponse(
            request_id=request_id,
            outputs=[
                PredictOutput(text=o.text, tokens=len(o.token_ids), finish_reason=o.finish_reason) for o in outputs
            ],
            latency_ms=generation.latency_ms(),
        )

    @app.post(
        "/v1/completions",
        response_model=CompletionResponse,
        responses={**EVENT_STREAM, **error_responses(400, 404, 413, 429, 500, 503, 504)},
    )
    async def completions(request: Request, body: CompletionRequest) -> Any:
        request_id = request_id_for(body.request_id)
        params = _params(body.sampling_params, rename=OPENAI_NAMES)
        generation = await start(request_id, body.prompts, params, model=body.model, rename=OPENAI_NAMES)
        created = int(time.time())
        model = generation.deployment.bundle_id
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return await stream_completion(request, generation, request_id, created, model, include_usage)
        try:
            outputs = await run_to_end(request, generation, request_id)
        except ClientGone:
            return gone()
        return CompletionResponse(
            id=f"cmpl-{request_id}",
            created=created,
            model=model,
            choices=[
                CompletionChoice(index=i, text=o.text, finish_reason=o.finish_reason) for i, o in enumerate(outputs)
            ],
            usage=usage(outputs),
        )

    async def stream_completion(
        request: Request,
        generation: Generation,
        request_id: str,
        created: int,
        model: str,
        include_usage: bool,
    ) -> Response:
        """Wait for the first output before answering, so that a full queue, a deadline
        passed in the queue or a client gone early still get their status codes."""
        try:
            first = await unless_disconnected(request, generation.next())
        except ClientGone:
            generation.close()
            return gone()
        except BaseException:
            generation.close()
            raise
        # Failed before its first token (engine error, shutdown): a real status code, not a 200 stream.
        failure = unfinished_error([first[1]], request_id)
        if failure is not None:
            generation.close()
            raise failure

        def chunk(index: int, text: str, finish_reason: str | None) -> dict[str, Any]:
            choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}
            payload: dict[str, Any] = {
                "id": f"cmpl-{request_id}",
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [choice],
            }
            if include_usage:
                payload["usage"] = None
            return payload

        async def events() -> AsyncIterator[str]:
            index, output = first
            while True:
                failure = unfinished_error([output], request_id)
                if failure is not None:
                    yield sse(error_body(failure.message, failure.type, failure.param, failure.code))
                    break
                if output.new_text or output.finished:
                    yield sse(chunk(index, output.new_text, output.finish_reason if output.finished else None))
                if generation.done:
                    outputs = [generation.finals[i] for i in range(len(generation.requests))]
                    generation.record(outputs)
                    if include_usage:
                        yield sse({**chunk(0, "", None), "choices": [], "usage": usage(outputs).model_dump()})
                    break
                try:
                    index, output = await generation.next()
                except ApiError as exc:  # the deadline passed mid-stream: say so, then end the stream
                    yield sse(error_body(exc.message, exc.type, exc.param, exc.code))
                    break
            yield "data: [DONE]\n\n"

        return EventStream(events(), on_close=generation.close, headers={})

    @app.get("/v1/models", response_model=ModelList)
    async def models() -> Any:
        deployment = state.current
        if deployment is None:
            return ModelList(data=[])
        return ModelList(data=[ModelCard(id=deployment.bundle_id, created=int(deployment.loaded_at))])

    @app.get("/health/live", responses={200: {"model": LiveStatus}})
    async def live() -> Any:
        return {"status": "live"}

    @app.get("/health/ready", responses={200: {"model": ReadyStatus}, **error_responses(503)})
    async def ready() -> Any:
        if state.ready and state.current is not None:
            if state.following is not None:  # what the pointer names, which may differ while a swap loads
                return {"status": "ready", "bundle_id": state.current.bundle_id, "deployment": state.deployment_info()}
            return {"status": "ready", "bundle_id": state.current.bundle_id}
        if state.draining:
            raise ApiError(503, "draining: the server is shutting down", "unavailable", code="draining")
        if state.current is not None and not state.current.loop.running:
            raise ApiError(503, "the engine loop stopped after an error", "unavailable", code="engine_failed")
        if state.failed:
            raise ApiError(503, f"the bundle could not be loaded: {state.error}", "unavailable", code="load_failed")
        if state.phase == "ready" and state.current is None:
            raise ApiError(503, state.no_bundle_message(), "unavailable", code="no_deployment")
        raise ApiError(503, "loading: the bundle is being loaded and warmed up", "unavailable", code="loading")

    @app.get("/version", responses={200: {"model": VersionInfo}, **error_responses(503)})
    async def version() -> Any:
        deployment = state.current
        if deployment is None:
            if state.phase == "ready":
                raise ApiError(503, state.no_bundle_message(), "unavailable", code="no_deployment")
            raise ApiError(503, "no bundle is loaded yet", "unavailable", code="loading")
        manifest = deployment.bundle.manifest
        return {
            "bundle_id": deployment.bundle_id,
            "bundle_path": str(deployment.bundle.path),
            "deployment": state.deployment_info() if state.following is not None else None,
            "code_version": manifest.get("code_version"),
            "created_at": manifest.get("created_at"),
            "git_commit": manifest.get("git_commit"),
            "server_version": _server_version(),
            "inputs": manifest.get("inputs", []),
            "lineage": manifest.get("lineage"),
        }

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        if state.current is not None:
            state.metrics.observe_engine(state.current.loop.stats())
        return Response(state.metrics.render(), media_type=state.metrics.content_type)

    @app.post(
        "/admin/reload",
        responses={200: {"model": ReloadResponse}, **error_responses(400, 401, 403, 404, 409, 413, 422, 503)},
        openapi_extra=ADMIN_OPERATION,
    )
    async def admin_reload(request: Request) -> Any:
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
        try:
            body = ReloadRequest.model_validate_json(await request.body())
        except ValidationError as exc:
            raise validation_error(exc.errors()) from None
        if state.draining:
            raise ApiError(503, "the server is shutting down", "unavailable", code="draining")
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
                deployment, previous = await state.reload(path)
            except Exception as exc:
                log.warning("reload refused: %s", exc, exc_info=not isinstance(exc, BUNDLE_ERRORS))
                raise ApiError(
                    422, f"bundle refused, the current one keeps serving: {exc}", "invalid_bundle", param="bundle"
                ) from None
        log.info(
            "reloaded: now serving %s",
            deployment.bundle_id,
            extra={"bundle_id": deployment.bundle_id, "bundle_path": str(path)},
        )
        return {
            "bundle_id": deployment.bundle_id,
            "previous_bundle_id": previous.bundle_id if previous is not None else None,
            "bundle_path": str(deployment.bundle.path),
            "warmup": deployment.warmup,
        }

    return app


def request_error(exc: RequestError, rename: dict[str, str] | None = None) -> ApiError:
    """The engine's or SamplingParams' refusal as a 400 naming the field as the client spelled it."""
    name = (rename or {}).get(exc.field, exc.field)
    message = str(exc).removeprefix(f"{exc.field}: ")
    return ApiError(400, f"{name}: {message}", "invalid_request_error", param=name, code="invalid_value")


def _params(make: Callable[[], SamplingParams], rename: dict[str, str] | None = None) -> SamplingParams:
    try:
        return make()
    except RequestError as exc:
        raise request_error(exc, rename) from None
