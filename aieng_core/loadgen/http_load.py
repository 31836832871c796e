"""A small load generator for OpenAI-style /v1/completions on 127.0.0.1.

The streamed form of http_client.py (asyncio streams, its HTTP/1.1 reader and server-sent
events parser): one thread, so the client takes as little as possible of the CPU the server
under test shares with it. Two arrival patterns, as in vLLM's
`bench serve`: a closed loop of `concurrency` clients, each sending its next request when the
last one finished, and an open loop with Poisson arrivals at a fixed rate (exponential gaps
from a seeded generator, so every run sends at the same offsets). Each request is checked
for what it asked for: status 200, finish_reason "length", and the server's usage counts
equal to the prompt's tokens and max_tokens; one that is not is a failed request, never a
silently shorter one. With `max_seconds`, a run is bounded: no request is sent after the
deadline (those are left out of the records returned) and one still unfinished at it fails
with NOT_FINISHED. A request may name its own endpoint (`/generate`, checked the same way:
tokens, prompt_tokens, finish_reason) and whether it streams, so one run can mix them; a
refusal keeps its status in the record's error (`HTTP 429: ...`).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aieng_core.loadgen.http_client import open_request, sse_data
from aieng_core.loadgen.stats import RequestRecord

REQUEST_TIMEOUT_S = 300.0  # per request; a bench never waits forever on a wedged server
NOT_FINISHED = "not finished within max_seconds"
COMPLETIONS = "/v1/completions"
GENERATE = "/generate"


@dataclass(frozen=True)
class LoadRequest:
    prompt: str
    prompt_tokens: int  # what the server's tokenizer makes of `prompt` (checked against usage)
    max_tokens: int
    endpoint: str = COMPLETIONS  # or GENERATE (never streamed)
    stream: bool | None = None  # None: as the run says (COMPLETIONS only)


def completion_body(request: LoadRequest, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt": request.prompt,
        "max_tokens": request.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,  # vLLM's switch: every request generates exactly max_tokens
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def generate_body(request: LoadRequest) -> dict[str, Any]:
    return {"prompt": request.prompt, "max_new_tokens": request.max_tokens, "temperature": 0.0, "ignore_eos": True}


def _check_generate(answer: Any, request: LoadRequest) -> str | None:
    usage = {"completion_tokens": answer.get("tokens"), "prompt_tokens": answer.get("prompt_tokens")}
    finish = answer.get("finish_reason")
    return _check_usage(usage, request) or (None if finish == "length" else f"finish_reason {finish!r}")


def _check_usage(usage: Any, request: LoadRequest) -> str | None:
    if not isinstance(usage, dict):
        return "no usage in the response"
    if usage.get("completion_tokens") != request.max_tokens:
        return f"completion_tokens {usage.get('completion_tokens')} != max_tokens {request.max_tokens}"
    if usage.get("prompt_tokens") != request.prompt_tokens:
        return f"prompt_tokens {usage.get('prompt_tokens')} != expected {request.prompt_tokens}"
    return None


async def _send(port: int, request: LoadRequest, stream: bool, record: RequestRecord) -> None:
    generate = request.endpoint == GENERATE
    stream = not generate and (stream if request.stream is None else request.stream)
    body = generate_body(request) if generate else completion_body(request, stream)
    record.sent = time.perf_counter()
    async with open_request(port, "POST", request.endpoint, body) as reply:
        if not stream or reply.status != 200:
            raw = await reply.read()
            record.done = time.perf_counter()
            if reply.status != 200:
                record.error = f"HTTP {reply.status}: {raw[:200]!r}"
                return
            answer = json.loads(raw)
            if generate:
                record.error = _check_generate(answer, request)
            else:
                finish = answer["choices"][0]["finish_reason"]
                record.error = _check_usage(answer.get("usage"), request) or (
                    None if finish == "length" else f"finish_reason {finish!r}"
                )
            record.ok = record.error is None
            return
        finish, usage, done = None, None, False
        async for data in sse_data(reply.chunks()):
            if data == b"[DONE]":
                done = True
                continue
            message = json.loads(data)
            if message.get("usage"):
                usage = message["usage"]
            if message.get("choices"):
                # Every chunk that carries a choice carries generated tokens (vLLM counts the same).
                record.chunk_times.append(time.perf_counter())
                finish = message["choices"][0].get("finish_reason") or finish
        record.done = time.perf_counter()
        if not done:
            record.error = "the stream ended without data: [DONE]"
        else:
            record.error = _check_usage(usage, request) or (None if finish == "length" else f"finish_reason {finish!r}")
        record.ok = record.error is None


def _deadline(max_seconds: float | None) -> float | None:
    return None if max_seconds is None else time.perf_counter() + max_seconds


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() >= deadline


async def _one(port: int, request: LoadRequest, stream: bool, deadline: float | None = None) -> RequestRecord:
    record = RequestRecord(prompt_tokens=request.prompt_tokens, output_tokens=request.max_tokens, sent=0.0)
    timeout = REQUEST_TIMEOUT_S
    if deadline is not None and deadline - time.perf_counter() < timeout:
        timeout = max(0.0, deadline - time.perf_counter())
    try:
        await asyncio.wait_for(_send(port, request, stream, record), timeout)
    except TimeoutError:
        record.ok = False
        record.error = f"{NOT_FINISHED} ({timeout:.1f} s)" if timeout < REQUEST_TIMEOUT_S else "TimeoutError"
        record.done = record.done or time.perf_counter()
    except (OSError, ValueError, IndexError, KeyError, asyncio.IncompleteReadError) as exc:
        record.ok, record.error = False, f"{type(exc).__name__}: {exc}"
        record.done = record.done or time.perf_counter()
    return record


async def _closed_loop(
    port: int, requests: Sequence[LoadRequest], concurrency: int, stream: bool, deadline: float | None = None
) -> list[RequestRecord]:
    records: list[RequestRecord | None] = [None] * len(requests)
    queue = iter(range(len(requests)))

    async def client() -> None:
        for index in queue:  # a shared iterator: each client takes the next unsent request
            if _past(deadline):
                return
            records[index] = await _one(port, requests[index], stream, deadline)

    await asyncio.gather(*(client() for _ in range(min(concurrency, len(requests)))))
    return [r for r in records if r is not None]


async def _poisson(
    port: int, requests: Sequence[LoadRequest], rate: float, seed: int, stream: bool, deadline: float | None = None
) -> list[RequestRecord | None]:
    gaps = random.Random(seed)
    offsets, at = [], 0.0
    for _ in requests:
        offsets.append(at)
        at += gaps.expovariate(rate)
    start = time.perf_counter()

    async def at_offset(offset: float, request: LoadRequest) -> RequestRecord | None:
        if deadline is not None and start + offset >= deadline:
            return None  # its arrival falls after the deadline: never sent
        await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
        return await _one(port, request, stream, deadline)

    return list(await asyncio.gather(*(at_offset(o, r) for o, r in zip(offsets, requests))))


async def _paired(
    ports: tuple[int, int],
    requests: tuple[Sequence[LoadRequest], Sequence[LoadRequest]],
    concurrency: int,
    stream: bool,
    deadline: float | None = None,
) -> tuple[list[RequestRecord], list[RequestRecord]]:
    count = min(len(requests[0]), len(requests[1]))
    records: list[list[RequestRecord | None]] = [[None] * count, [None] * count]
    queue = iter(range(count))

    async def client() -> None:
        for index in queue:
            # Pair `index` goes to both servers back to back, first A then B, then B then A for
            # the next: whatever slows the machine meanwhile falls on both alike.
            for side in (0, 1) if index % 2 == 0 else (1, 0):
                if _past(deadline):
                    return
                records[side][index] = await _one(ports[side], requests[side][index], stream, deadline)

    await asyncio.gather(*(client() for _ in range(min(concurrency, count))))
    # A pair is kept only whole: both of its requests were sent.
    whole = [i for i in range(count) if records[0][i] is not None and records[1][i] is not None]
    return [records[0][i] for i in whole], [records[1][i] for i in whole]  # type: ignore[misc]


def paired(
    ports: tuple[int, int],
    requests: tuple[Sequence[LoadRequest], Sequence[LoadRequest]],
    concurrency: int,
    stream: bool,
    max_seconds: float | None = None,
) -> tuple[list[RequestRecord], list[RequestRecord]]:
    """The same work sent to two servers in pairs: `concurrency` clients each take the next
    index i and send requests[0][i] to ports[0] and requests[1][i] to ports[1], one after the
    other, the order alternated from pair to pair. Returns both sides' records of the pairs
    sent whole, in index order (record i of each side is pair i)."""
    return asyncio.run(_paired(ports, requests, concurrency, stream, _deadline(max_seconds)))


def closed_loop(
    port: int, requests: Sequence[LoadRequest], concurrency: int, stream: bool, max_seconds: float | None = None
) -> list[RequestRecord]:
    """`concurrency` clients in a closed loop over `requests` (in order); with `max_seconds`,
    only the requests sent before that deadline, each failed if unfinished at it."""
    return asyncio.run(_closed_loop(port, requests, concurrency, stream, _deadline(max_seconds)))


def poisson(
    port: int, requests: Sequence[LoadRequest], rate: float, seed: int, stream: bool, max_seconds: float | None = None
) -> list[RequestRecord]:
    """Open loop: request i is sent at the i-th arrival of a Poisson process of `rate` req/s;
    with `max_seconds`, arrivals after that deadline are not sent (and not returned)."""
    records = asyncio.run(_poisson(port, requests, rate, seed, stream, _deadline(max_seconds)))
    return [record for record in records if record is not None]
