"""The native API: POST /generate (one prompt) and POST /predict (a batch of inputs)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from starlette.requests import Request as HttpRequest

from aieng_core.serving.http.api_models import (
    GenerateRequest,
    GenerateResponse,
    PredictOutput,
    PredictRequest,
    PredictResponse,
)
from aieng_core.serving.http.api_schema import error_responses
from aieng_core.serving.http.errors import ClientGone
from aieng_core.serving.http.generation import begin, finish_reason, run_to_end
from aieng_core.serving.http.logs import request_id_for
from aieng_core.serving.http.state import ServingState, serving_state
from aieng_core.serving.http.streaming import client_gone

# How /predict spells the engine's field names in its errors.
PREDICT_NAMES = {
    "prompt": "inputs",
    **{f: f"options.{f}" for f in ("max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop", "ignore_eos")},
}

router = APIRouter()


@router.post("/generate", response_model=GenerateResponse, responses=error_responses(400, 413, 429, 500, 503, 504))
async def generate(request: HttpRequest, body: GenerateRequest, state: ServingState = Depends(serving_state)) -> Any:
    request_id = request_id_for(body.request_id)
    generation = begin(state, request_id, [body.prompt], body.sampling_params)
    try:
        (output,) = await run_to_end(request, generation, request_id)
    except ClientGone:
        return client_gone()
    return GenerateResponse(
        request_id=request_id,
        text=output.text,
        tokens=len(output.token_ids),
        token_ids=list(output.token_ids),
        finish_reason=finish_reason(output),
        latency_ms=generation.latency_ms(),
        prompt_tokens=output.prompt_tokens,
    )


@router.post("/predict", response_model=PredictResponse, responses=error_responses(400, 413, 429, 500, 503, 504))
async def predict(request: HttpRequest, body: PredictRequest, state: ServingState = Depends(serving_state)) -> Any:
    request_id = request_id_for(body.request_id)
    generation = begin(state, request_id, body.inputs, body.options.sampling_params, rename=PREDICT_NAMES)
    try:
        outputs = await run_to_end(request, generation, request_id)
    except ClientGone:
        return client_gone()
    return PredictResponse(
        request_id=request_id,
        outputs=[PredictOutput(text=o.text, tokens=len(o.token_ids), finish_reason=finish_reason(o)) for o in outputs],
        latency_ms=generation.latency_ms(),
    )
