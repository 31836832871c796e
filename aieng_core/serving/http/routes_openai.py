"""The OpenAI-compatible API: POST /v1/completions (streamed or not) and GET /v1/models, as
the official `openai` client calls them."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends
from starlette.requests import Request as HttpRequest

from aieng_core.serving.http.api_models import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
)
from aieng_core.serving.http.api_schema import EVENT_STREAM, error_responses
from aieng_core.serving.http.errors import ClientGone, checked_params
from aieng_core.serving.http.generation import begin, finish_reason, run_to_end, usage
from aieng_core.serving.http.logs import request_id_for
from aieng_core.serving.http.state import ServingState, serving_state
from aieng_core.serving.http.streaming import client_gone, stream_completion

# How OpenAI's API spells the engine's field names in its errors.
OPENAI_NAMES = {"max_new_tokens": "max_tokens"}

router = APIRouter()


@router.post(
    "/v1/completions",
    response_model=CompletionResponse,
    responses={**EVENT_STREAM, **error_responses(400, 404, 413, 429, 500, 503, 504)},
)
async def completions(
    request: HttpRequest, body: CompletionRequest, state: ServingState = Depends(serving_state)
) -> Any:
    request_id = request_id_for(body.request_id)
    # OpenAI's defaults are the API's own (the request model's), not the bundle's.
    params = checked_params(body.sampling_params, rename=OPENAI_NAMES)
    generation = begin(
        state, request_id, body.prompts, lambda _bundle_defaults: params, body.model, OPENAI_NAMES, bool(body.stream)
    )
    created = int(time.time())
    model = generation.replica.bundle_id
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return await stream_completion(request, generation, request_id, created, model, include_usage)
    try:
        outputs = await run_to_end(request, generation, request_id)
    except ClientGone:
        return client_gone()
    return CompletionResponse(
        id=f"cmpl-{request_id}",
        created=created,
        model=model,
        choices=[CompletionChoice(index=i, text=o.text, finish_reason=finish_reason(o)) for i, o in enumerate(outputs)],
        usage=usage(outputs),
    )


@router.get("/v1/models", response_model=ModelList)
async def models(state: ServingState = Depends(serving_state)) -> Any:
    replica = state.current
    if replica is None:
        return ModelList(data=[])
    return ModelList(data=[ModelCard(id=replica.bundle_id, created=int(replica.loaded_at))])
