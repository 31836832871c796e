"""One generation request, seen from the event loop: its engine requests (one per prompt),
their outputs merged into one asyncio queue, its deadline, and its usage.

Each engine request is submitted to the replica's loop thread with a sink that hands its
outputs back to the event loop (a Mailbox: one wake-up of the loop for all that arrived
meanwhile; every output when streamed, the final one otherwise). The handler waits
on that queue under the request's deadline (queue time counts) while watching the client: a
client that goes away, or a deadline that passes, cancels the engine requests, and the engine
frees their KV slots at its next step.

When the request is traced (tracing.py), it names on its span what it asked for and what
answered, and once it is over, its engine requests' queue, prefill and decode spans.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

from starlette.requests import Request as HttpRequest
from starlette.types import Receive

from aieng_core.serving.http.api_models import OpenAIFinishReason, RequestDefaults, Usage
from aieng_core.serving.http.errors import (
    ApiError,
    ClientGone,
    checked_params,
    queue_full,
    request_error,
    unfinished_error,
)
from aieng_core.serving.http.logs import current_context
from aieng_core.serving.http.metrics import RequestTracker
from aieng_core.serving.http.provenance import Provenance, of_replica
from aieng_core.serving.http.replica import Replica
from aieng_core.serving.http.state import ServingState
from aieng_core.serving.request import Request, RequestError, SamplingParams
from aieng_core.serving.scheduler import EngineStopped, QueueFull

if TYPE_CHECKING:
    from aieng_core.serving.engine import RequestOutput
    from aieng_core.serving.http.tracing import RequestTrace

log = logging.getLogger("aieng.serving.http")

# The model name every request may use besides the bundle id (clients that hard-code one).
MODEL_ALIAS = "aieng"

T = TypeVar("T")


class Mailbox:
    """Outputs from the engine thread into one event loop's queues, at most one wake-up of the
    loop pending at a time: a step's outputs for 64 streams cost the loop one call, not 64
    (each call_soon_threadsafe writes to the loop's self-pipe and takes the GIL from the engine)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._pending: list[tuple[asyncio.Queue[Any], Any]] = []
        self._scheduled = False

    def post(self, queue: asyncio.Queue[Any], item: Any) -> None:  # any thread
        with self._lock:
            self._pending.append((queue, item))
            if self._scheduled:
                return
            self._scheduled = True
        # A closed event loop means nobody waits any more (server exit).
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:  # the event loop
        with self._lock:
            pending, self._pending, self._scheduled = self._pending, [], False
        for queue, item in pending:
            queue.put_nowait(item)


_MAILBOXES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Mailbox] = weakref.WeakKeyDictionary()
_MAILBOXES_LOCK = threading.Lock()


def mailbox_of(loop: asyncio.AbstractEventLoop) -> Mailbox:
    with _MAILBOXES_LOCK:
        mailbox = _MAILBOXES.get(loop)
        if mailbox is None:
            mailbox = _MAILBOXES[loop] = Mailbox(loop)
        return mailbox


class Generation:
    """The engine requests of one HTTP request, their outputs as (prompt index, output)."""

    def __init__(self, state: ServingState, replica: Replica, arrival: float, stream: bool = True) -> None:
        self.state = state
        self.replica = replica
        self.arrival = arrival
        # Streamed: every output crosses to the event loop. Not streamed: only the final ones;
        # the metrics of each token are taken in the engine thread either way (RequestTracker),
        # so a non-streamed request costs the event loop one wake-up per prompt, not per token.
        self.stream = stream
        self.deadline = arrival + state.config.serving.request_timeout_s
        self.queue: asyncio.Queue[tuple[int, RequestOutput]] = asyncio.Queue()
        self.requests: list[Request] = []
        self.finals: dict[int, RequestOutput] = {}
        self.largest_batch = 0  # the most sequences a step of this request ran with
        self.samples = 1  # choices per prompt (n)
        self.trace: RequestTrace | None = None  # the request's spans, when the server traces
        self.response_id = ""  # the id the response gives (the request id, or OpenAI's cmpl-...)
        self._released = False

    @property
    def provenance(self) -> Provenance:
        """The bundle that answers this request (its replica's), and its data version."""
        return of_replica(self.replica)

    def submit(
        self,
        request_id: str,
        prompts: Sequence[str | Sequence[int]],
        params: SamplingParams,
        rename: dict[str, str] | None = None,
        samples: int = 1,
    ) -> None:
        """`samples` (OpenAI's n) choices of each prompt: choice prompt * n + sample, as OpenAI
        and vLLM number them; with a seed, sample s draws from seed + s (vLLM's rule), so the
        samples differ and each is reproducible."""
        loop = asyncio.get_running_loop()
        self.samples = samples
        choices = len(prompts) * samples
        submissions = [
            (
                request_id if choices == 1 else f"{request_id}-{index}",
                prompts[index // samples],
                sample_params(params, index % samples),
                self._sink(
                    loop,
                    index,
                    RequestTracker(self.state.metrics, time.monotonic, self.replica.bundle_id, index % samples == 0),
                ),
            )
            for index in range(choices)
        ]
        # Every prompt or none: a refused list leaves no sequence behind.
        try:
            self.requests = self.replica.loop.submit_all(submissions, samples)
        except RequestError as exc:
            raise request_error(exc, rename=rename) from None
        except QueueFull:
            self.state.metrics.reject("overloaded", self.replica.bundle_id)
            raise queue_full() from None
        except EngineStopped:
            # The loop died (or stopped) after this request took its replica: say what
            # readiness says now, never a 500.
            self.state.metrics.reject("not_ready", self.replica.bundle_id)
            raise self.state.unavailable() or ApiError(
                503, "the engine loop stopped after an error", "unavailable", code="engine_failed"
            ) from None

    def _sink(
        self, loop: asyncio.AbstractEventLoop, index: int, tracker: RequestTracker
    ) -> Callable[[RequestOutput], None]:
        queue = self.queue
        engine = self.replica.loop.engine
        stream = self.stream
        mailbox = mailbox_of(loop)

        def sink(output: RequestOutput) -> None:  # runs in the engine thread, right after the step
            tracker.on_output(output)
            if engine.last_step is not None:
                self.largest_batch = max(self.largest_batch, engine.last_step.batch_size)
            if not (stream or output.finished):
                return
            mailbox.post(queue, (index, output))

        return sink

    @property
    def done(self) -> bool:
        return len(self.finals) == len(self.requests)

    async def next(self) -> tuple[int, RequestOutput]:
        """The next output, or ApiError 504 once the deadline passes."""
        remaining = self.deadline - time.monotonic()
        try:
            if remaining <= 0:
                raise TimeoutError
            if self.queue.empty():
                # asyncio.timeout, not wait_for: wait_for wraps the get in a Task of its own,
                # once per token of every stream.
                async with asyncio.timeout(remaining):
                    index, output = await self.queue.get()
            else:
                index, output = self.queue.get_nowait()
        except TimeoutError:
            self.cancel()
            self.state.metrics.reject("timeout", self.replica.bundle_id)
            timeout = self.state.config.serving.request_timeout_s
            raise ApiError(
                504, f"the request did not finish within request_timeout_s ({timeout:g} s)", "timeout", code="timeout"
            ) from None
        if output.finished:
            self.finals[index] = output
        return index, output

    def ready(self) -> list[tuple[int, RequestOutput]]:
        """The outputs already queued, without waiting (a streamed response writes them in one go)."""
        items: list[tuple[int, RequestOutput]] = []
        while True:
            try:
                index, output = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                return items
            if output.finished:
                self.finals[index] = output
            items.append((index, output))

    async def collect(self) -> list[RequestOutput]:
        while not self.done:
            await self.next()
        return self.outputs()

    def outputs(self) -> list[RequestOutput]:
        """Every prompt's final output, in prompt order (once `done`)."""
        return [self.finals[i] for i in range(len(self.requests))]

    def cancel(self) -> None:
        for request in self.requests:
            if not request.finished:
                request.cancel()

    def close(self) -> None:
        """Cancel whatever has not finished and give the replica back (idempotent)."""
        self.cancel()
        if not self._released:
            self._released = True
            self.state.release(self.replica)
            if self.trace is not None:
                self.trace.engine(self.requests, time.monotonic())

    def latency_ms(self) -> float:
        return round((time.monotonic() - self.arrival) * 1000, 3)

    def record(self, outputs: Sequence[RequestOutput]) -> None:
        """Numbers for this request's access log line (and its span)."""
        totals = usage(outputs, self.samples)
        if self.trace is not None:
            self.trace.answered(self.response_id, outputs, totals)
        context = current_context()
        if context is None:
            return
        context.fields.update(
            prompt_tokens=totals.prompt_tokens,
            completion_tokens=totals.completion_tokens,
            finish_reason=",".join(sorted({str(o.finish_reason) for o in outputs})),
            batch_size=self.largest_batch,
        )


def check_model(model: str | None, replica: Replica) -> None:
    if model is not None and model not in (replica.bundle_id, MODEL_ALIAS):
        raise ApiError(
            404,
            f"model '{model}' does not exist; this server serves '{replica.bundle_id}' (alias '{MODEL_ALIAS}')",
            "not_found_error",
            param="model",
            code="model_not_found",
        )


def begin(
    state: ServingState,
    request_id: str,
    prompts: Sequence[str | Sequence[int]],
    params_for: Callable[[RequestDefaults], SamplingParams],
    model: str | None = None,
    rename: dict[str, str] | None = None,
    stream: bool = False,
    samples: int = 1,
) -> Generation:
    """Take a replica, then build the request's sampling parameters from that replica's own
    defaults (a swap may install another bundle at any moment: the defaults of the bundle that
    answers are the ones that apply), then submit. Whatever fails gives the replica back. The
    replica taken is the one the response names (X-Aieng-Bundle-Id), whatever is served by then.
    `stream`: the caller reads every output (generation.next()); else only the final ones
    (run_to_end)."""

    def prepare(replica: Replica) -> Prepared:
        return prompts, checked_params(lambda: params_for(replica.defaults), rename)

    return begin_with(state, request_id, prepare, model, rename, stream, samples)


Prepared = tuple[Sequence[str | Sequence[int]], SamplingParams]


def begin_with(
    state: ServingState,
    request_id: str,
    prepare: Callable[[Replica], Prepared],
    model: str | None = None,
    rename: dict[str, str] | None = None,
    stream: bool = False,
    samples: int = 1,
) -> Generation:
    """begin() for a request whose prompts, too, depend on the replica that answers (a chat
    is rendered through that replica's bundle's template): `prepare(replica)` gives the
    prompts (text or token ids) and the sampling parameters, or raises the ApiError to answer."""
    arrival = time.monotonic()
    replica = state.acquire(request_id)
    generation = Generation(state, replica, arrival, stream)
    generation.response_id = request_id
    context = current_context()
    if context is not None:  # the response's headers and log line name the replica that answers
        context.provenance = generation.provenance
        generation.trace = context.trace
    trace = generation.trace
    try:
        if trace is not None:
            trace.generation(model, replica.bundle_id)
        check_model(model, replica)
        prompts, params = prepare(replica)
        if trace is not None:
            trace.parameters(params, stream)
        generation.submit(request_id, prompts, params, rename, samples)
    except BaseException:
        generation.close()
        raise
    return generation


async def run_to_end(request: HttpRequest, generation: Generation, request_id: str) -> list[RequestOutput]:
    """Every output of a non-streamed generation; ClientGone if the client left first."""
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


def finish_reason(output: RequestOutput) -> OpenAIFinishReason:
    """Why an answered output ended: `stop` or `length` (run_to_end raised for any other)."""
    if output.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"request {output.request_id} ended with {output.finish_reason!r}, not stop or length")
    return cast(OpenAIFinishReason, output.finish_reason)


def sample_params(params: SamplingParams, sample: int) -> SamplingParams:
    """The parameters of a prompt's sample number `sample` (0: the request's own)."""
    if sample == 0 or params.seed is None:
        return params
    return dataclasses.replace(params, seed=(params.seed + sample) % (1 << 63))


def usage(outputs: Sequence[RequestOutput], samples: int = 1) -> Usage:
    """OpenAI's usage: each prompt counted once, however many samples (n) it has."""
    prompt_tokens = sum(o.prompt_tokens for o in outputs[::samples])
    completion_tokens = sum(len(o.token_ids) for o in outputs)
    return Usage(
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, total_tokens=prompt_tokens + completion_tokens
    )


async def wait_for_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: HttpRequest, work: Awaitable[T]) -> T:
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
