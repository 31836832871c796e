"""What operators and load balancers ask: GET /health/live, /health/ready, /version, /metrics."""

from __future__ import annotations

import importlib.metadata
import time
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import PlainTextResponse, Response

from aieng_core.serving.http.api_models import LiveStatus, ReadyStatus, VersionInfo
from aieng_core.serving.http.api_schema import error_responses
from aieng_core.serving.http.errors import unavailable
from aieng_core.serving.http.state import ServingState, serving_state

router = APIRouter()


def server_version() -> str:
    try:
        return importlib.metadata.version("aieng")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@router.get("/health/live", responses={200: {"model": LiveStatus}})
async def live() -> Any:
    return {"status": "live"}


@router.get("/health/ready", responses={200: {"model": ReadyStatus}, **error_responses(503)})
async def ready(state: ServingState = Depends(serving_state)) -> Any:
    refusal = state.not_ready()  # the very answer a generation request gets now (or soon: shutdown_delay_s)
    if refusal is not None:
        raise refusal
    assert state.current is not None
    # What the pointer names, which may differ while a swap loads, and after a refusal (the
    # mismatch: still 200, since the bundle served answers; deployment.mismatch says so).
    if state.following is not None:
        return {"status": "ready", "bundle_id": state.current.bundle_id, "deployment": state.deployment_info()}
    return {"status": "ready", "bundle_id": state.current.bundle_id}


@router.get("/version", responses={200: {"model": VersionInfo}, **error_responses(503)})
async def version(state: ServingState = Depends(serving_state)) -> Any:
    replica = state.current
    if replica is None:  # nothing to describe: say why, as readiness does
        raise state.unavailable() or unavailable("no bundle is loaded yet", "loading")
    manifest = replica.bundle.manifest
    return {
        "bundle_id": replica.bundle_id,
        "data_version": replica.data_version,
        "bundle_path": str(replica.bundle.path),
        "deployment": state.deployment_info(),
        "code_version": manifest.get("code_version"),
        "created_at": manifest.get("created_at"),
        "git_commit": manifest.get("git_commit"),
        "server_version": server_version(),
        "inputs": manifest.get("inputs", []),
        "lineage": manifest.get("lineage"),
        # fp32, or int8 for an int8 variant (whose only input is its float32 source).
        "weights": replica.bundle.serving.get("weights", "fp32"),
    }


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(state: ServingState = Depends(serving_state)) -> Response:
    if state.current is not None:
        state.metrics.observe_engine(state.current.loop.stats())
    state.observe_deployment(time.time())
    state.observe_config()
    return Response(state.metrics.render(), media_type=state.metrics.content_type)
