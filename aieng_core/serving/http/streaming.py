"""Server-sent events: the streamed form of /v1/completions and /v1/chat/completions.

The stream is answered only once the first output exists, so that a full queue, a deadline
passed in the queue or a client gone early still get their status codes; after that, an
error (the deadline passing mid-stream, the engine failing) is an error event, then the
stream ends with `data: [DONE]` as OpenAI's does.

The last data event before `data: [DONE]` (the last chunk, the usage chunk with
include_usage, or the error event) also carries `"aieng": {"bundle_id", "data_version"}`
(provenance.py): what answered, for a client that reads the stream but not its headers. The
openai client keeps unknown fields of a chunk, so it reads such a stream as any other.

A traced request's stream span (tracing.py) runs from the response's first byte to the last
one handed to the server.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import anyio
from fastapi.responses import Response, StreamingResponse
from starlette.requests import Request as HttpRequest
from starlette.types import Receive, Scope, Send

from aieng_core.serving.http.errors import ApiError, ClientGone, unfinished_error
from aieng_core.serving.http.generation import Generation, unless_disconnected, usage, wait_for_disconnect
from aieng_core.serving.http.logprobs import CompletionLogprobsStream, TokenTexts, chat_logprobs
from aieng_core.serving.http.logs import current_context
from aieng_core.serving.http.provenance import stream_field
from aieng_core.serving.http.tracing import StreamWatch
from aieng_core.serving.request import TokenLogprob

DONE = "data: [DONE]\n\n"


def sse(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


def client_gone() -> Response:
    # Nobody reads this; 499 (nginx's "client closed request") keeps the metrics honest.
    return Response(status_code=499)


class EventStream(StreamingResponse):
    """Server-sent events that always listen for the client going away (whatever ASGI spec
    version the server speaks), and always run `on_close` once the response is over or
    abandoned: it cancels the engine requests and ends the request's lease."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache"})
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        context = current_context()
        trace = context.trace if context is not None else None
        watch = StreamWatch(send) if trace is not None and trace.recording else None
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    try:
                        await self.stream_response(watch or send)
                    except OSError:
                        pass  # the client went away mid-write
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await wait_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            if trace is not None and watch is not None:
                trace.stream(watch)
            self.on_close()


class CompletionChunks:
    """OpenAI's `text_completion` chunks: one per new piece of text; with `echo` (a text per
    choice), each choice's prompt first; with `texts` (logprobs asked), each chunk's tokens'
    log-probabilities, their text offsets running on from the choice's start."""

    object = "text_completion"
    id_prefix = "cmpl-"

    def __init__(self, echo: Sequence[str] | None = None, texts: TokenTexts | None = None) -> None:
        self.echo = list(echo or ())
        self.texts = texts
        self._logprobs: dict[int, CompletionLogprobsStream] = {}

    def opening(self) -> list[dict[str, Any]]:
        return [self.choice(index, text, None) for index, text in enumerate(self.echo)]

    def choice(
        self, index: int, text: str, finish_reason: str | None, entries: Sequence[TokenLogprob] = ()
    ) -> dict[str, Any]:
        logprobs = None
        if self.texts is not None and entries:
            if index not in self._logprobs:
                start = len(self.echo[index]) if self.echo else 0
                self._logprobs[index] = CompletionLogprobsStream(self.texts, start)
            logprobs = self._logprobs[index].of(entries)
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


class ChatChunks:
    """OpenAI's `chat.completion.chunk`s: the role first (empty content), one per choice, then a
    delta per new piece of text, the finish reason with the last one (an empty delta when it
    brings no text); with `texts` (logprobs asked), each chunk's tokens' log-probabilities."""

    object = "chat.completion.chunk"
    id_prefix = "chatcmpl-"

    def __init__(self, choices: int = 1, texts: TokenTexts | None = None) -> None:
        self.choices = choices
        self.texts = texts

    def opening(self) -> list[dict[str, Any]]:
        role = {"role": "assistant", "content": ""}
        return [{"index": i, "delta": role, "logprobs": None, "finish_reason": None} for i in range(self.choices)]

    def choice(
        self, index: int, text: str, finish_reason: str | None, entries: Sequence[TokenLogprob] = ()
    ) -> dict[str, Any]:
        delta = {"content": text} if text else {}
        logprobs = chat_logprobs(self.texts, entries) if self.texts is not None and entries else None
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}


async def stream_completion(
    request: HttpRequest,
    generation: Generation,
    request_id: str,
    created: int,
    model: str,
    include_usage: bool,
    shape: CompletionChunks | ChatChunks,
) -> Response:
    """The generation as server-sent events in `shape`'s chunks."""
    try:
        first = await unless_disconnected(request, generation.next())
    except ClientGone:
        generation.close()
        return client_gone()
    except BaseException:
        generation.close()
        raise
    # Failed before its first token (engine error, shutdown): a real status code, not a 200 stream.
    failure = unfinished_error([first[1]], request_id)
    if failure is not None:
        generation.close()
        raise failure

    def payload_of(choice: dict[str, Any]) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "id": f"{shape.id_prefix}{request_id}",
            "object": shape.object,
            "created": created,
            "model": model,
            "choices": [choice],
        }
        if include_usage:
            payload["usage"] = None
        return payload

    def chunk(index: int, text: str, finish_reason: str | None, entries: Sequence[TokenLogprob] = ()) -> dict[str, Any]:
        return payload_of(shape.choice(index, text, finish_reason, entries))

    named = stream_field(generation.provenance)

    async def events() -> AsyncIterator[str]:
        # Every output already queued is written in one go: one write per wake-up, not per token.
        batch = [first]
        finals: set[int] = set()
        # Log-probabilities of tokens that brought no text yet (part of a character, or held
        # back as a possible stop string): sent with their choice's next chunk.
        pending: dict[int, list[TokenLogprob]] = {}
        pieces = [sse(payload_of(choice)) for choice in shape.opening()]
        while True:
            ended = False
            for index, output in batch:
                failure = unfinished_error([output], request_id)
                if failure is not None:
                    pieces.append(sse({**failure.body(), **named}))
                    ended = True
                    break
                if output.finished:
                    finals.add(index)
                done = len(finals) == len(generation.requests)
                if output.new_logprobs:
                    pending.setdefault(index, []).extend(output.new_logprobs)
                if output.new_text or output.finished:
                    reason = output.finish_reason if output.finished else None
                    payload = chunk(index, output.new_text, reason, pending.pop(index, ()))
                    last = done and not include_usage
                    pieces.append(sse({**payload, **named} if last else payload))
                if done:
                    outputs = generation.outputs()
                    generation.record(outputs)
                    if include_usage:
                        totals = usage(outputs, generation.samples).model_dump()
                        usage_chunk = {**chunk(0, "", None), "choices": [], "usage": totals}
                        pieces.append(sse({**usage_chunk, **named}))
                    ended = True
                    break
            if pieces:
                yield "".join(pieces)
                pieces = []
            if ended:
                break
            try:
                batch = [await generation.next(), *generation.ready()]
            except ApiError as exc:  # the deadline passed mid-stream: say so, then end the stream
                yield sse({**exc.body(), **named})
                break
        yield DONE

    return EventStream(events(), on_close=generation.close)
