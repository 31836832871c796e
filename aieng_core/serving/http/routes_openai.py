"""The OpenAI-compatible API: POST /v1/completions and /v1/chat/completions (streamed or not)
and GET /v1/models, as the official `openai` client calls them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends
from starlette.requests import Request as HttpRequest

from aieng_core.serving.chat_template import ChatTemplateError
from aieng_core.serving.http.api_models import (
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatReply,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
)
from aieng_core.serving.http.api_schema import CHAT_EVENT_STREAM, EVENT_STREAM, error_responses
from aieng_core.serving.http.errors import ApiError, ClientGone, checked_params, unavailable
from aieng_core.serving.http.generation import (
    Generation,
    Prepared,
    begin,
    begin_with,
    check_model,
    finish_reason,
    run_to_end,
    usage,
)
from aieng_core.serving.http.logprobs import CompletionLogprobsStream, TokenTexts, chat_logprobs
from aieng_core.serving.http.logs import request_id_for
from aieng_core.serving.http.replica import Replica
from aieng_core.serving.http.state import ServingState, serving_state
from aieng_core.serving.http.streaming import ChatChunks, CompletionChunks, client_gone, stream_completion

if TYPE_CHECKING:
    from aieng_core.serving.engine import RequestOutput

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
    samples = body.samples
    generation = begin(
        state,
        request_id,
        body.prompts,
        lambda _bundle_defaults: params,
        body.model,
        OPENAI_NAMES,
        bool(body.stream),
        samples,
    )
    # echo: each choice's text starts with its prompt (token ids decoded by the answering bundle).
    engine = generation.replica.loop.engine
    tokenizer = engine.tokenizer
    texts = token_texts(engine) if body.logprobs is not None else None
    echo = None
    if body.echo:
        try:
            echo = [
                p if isinstance(p, str) else tokenizer.decode(p, skip_special_tokens=False)
                for p in body.prompts
                for _ in range(samples)
            ]
        except BaseException:
            generation.close()
            raise

    def whole(created: int, model: str, outputs: list[RequestOutput]) -> CompletionResponse:
        return CompletionResponse(
            id=f"cmpl-{request_id}",
            created=created,
            model=model,
            choices=[
                CompletionChoice(
                    index=i,
                    text=(echo[i] if echo else "") + o.text,
                    finish_reason=finish_reason(o),
                    logprobs=None
                    if texts is None
                    else CompletionLogprobs(**CompletionLogprobsStream(texts).of(o.logprobs)),
                )
                for i, o in enumerate(outputs)
            ],
            usage=usage(outputs, samples),
        )

    return await answer(request, generation, request_id, body, CompletionChunks(echo, texts), whole)


async def answer(
    request: HttpRequest,
    generation: Generation,
    request_id: str,
    body: CompletionRequest | ChatCompletionRequest,
    shape: CompletionChunks | ChatChunks,
    whole: Callable[[int, str, list[RequestOutput]], Any],
) -> Any:
    """Stream the generation in `shape`'s chunks, or wait for it and answer `whole(created,
    model, outputs)`; the model named is the bundle that answers."""
    created = int(time.time())
    model = generation.replica.bundle_id
    generation.response_id = f"{shape.id_prefix}{request_id}"
    if body.stream:
        return await stream_completion(request, generation, request_id, created, model, body.include_usage, shape)
    try:
        outputs = await run_to_end(request, generation, request_id)
    except ClientGone:
        return client_gone()
    return whole(created, model, outputs)


def chat_prompt(body: ChatCompletionRequest, replica: Replica) -> Prepared:
    """The conversation rendered through the answering replica's chat template, as token ids,
    and its sampling parameters; a 400 naming the problem when the bundle has no template or
    the template refuses the conversation."""
    template = replica.bundle.chat_template
    if template.source is None:
        raise ApiError(
            400,
            f"bundle {replica.bundle_id} has no chat template (bundle.chat_template is null), so it cannot "
            "answer chat completions; use /v1/completions",
            "invalid_request_error",
            param="messages",
            code="no_chat_template",
        )
    try:
        text = template.render(body.conversation(), body.add_generation_prompt)
    except ChatTemplateError as exc:
        raise ApiError(400, str(exc), "invalid_request_error", param="messages", code="chat_template_error") from None
    ids = replica.loop.engine.encode(text)
    asked = body.asked_tokens
    # Unbounded: to the end of the context (at least 1, so an over-long prompt gets the engine's own error).
    tokens = asked[1] if asked is not None else max(replica.max_context - len(ids), 1)
    params = checked_params(lambda: body.sampling_params_for(tokens), rename=body.engine_names)
    return [ids], params


@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletionResponse,
    responses={**CHAT_EVENT_STREAM, **error_responses(400, 404, 413, 429, 500, 503, 504)},
)
async def chat_completions(
    request: HttpRequest, body: ChatCompletionRequest, state: ServingState = Depends(serving_state)
) -> Any:
    request_id = request_id_for(body.request_id)

    def prepare(replica: Replica) -> Prepared:
        return chat_prompt(body, replica)

    generation = begin_with(state, request_id, prepare, body.model, body.engine_names, bool(body.stream), body.samples)
    texts = token_texts(generation.replica.loop.engine) if body.logprobs else None

    def whole(created: int, model: str, outputs: list[RequestOutput]) -> ChatCompletionResponse:
        return ChatCompletionResponse(
            id=f"chatcmpl-{request_id}",
            created=created,
            model=model,
            choices=[
                ChatChoice(
                    index=i,
                    message=ChatReply(content=o.text),
                    finish_reason=finish_reason(o),
                    logprobs=None if texts is None else ChatLogprobs.model_validate(chat_logprobs(texts, o.logprobs)),
                )
                for i, o in enumerate(outputs)
            ],
            usage=usage(outputs, body.samples),
        )

    return await answer(request, generation, request_id, body, ChatChunks(body.samples, texts), whole)


def token_texts(engine: Any) -> TokenTexts:
    """How the answering engine's tokens are named in logprobs."""
    return TokenTexts(engine.tokenizer, engine.token_bytes)


@router.get("/v1/models", response_model=ModelList)
async def models(state: ServingState = Depends(serving_state)) -> Any:
    replica = state.current
    if replica is None:
        return ModelList(data=[])
    return ModelList(data=[ModelCard(id=replica.bundle_id, created=int(replica.loaded_at))])


@router.get("/v1/models/{model}", response_model=ModelCard, responses=error_responses(404, 503))
async def model_card(model: str, state: ServingState = Depends(serving_state)) -> Any:
    """The served bundle's card, by its id or the alias (`models.retrieve`); 404 for any other
    name, as a generation request naming it gets."""
    replica = state.current
    if replica is None:
        raise state.unavailable() or unavailable("no bundle is loaded yet", "loading")
    check_model(model, replica)
    return ModelCard(id=model, created=int(replica.loaded_at))
