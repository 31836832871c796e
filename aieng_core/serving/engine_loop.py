"""The engine in a background thread: the HTTP server's side of the engine.

submit() validates in the caller's thread (so a bad request fails at once, with the field
named) and hands the request over through an inbox; the loop thread steps the engine while
anything is queued or running and hands each output to its request's sink. Nothing may leave
a caller waiting: stopping cancels every request still held, and a loop that dies fails them.

With a ThreadGovernor (cpu/governor.py), the loop thread sets its torch thread count to the
governor's before every step, and wakes every governor interval while idle so the count is
right before the first request after a pause (a busy neighbour that came meanwhile).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence

from aieng_core.cpu.governor import ThreadGovernor
from aieng_core.serving.engine import Engine, EngineStats, RequestOutput, StepStats
from aieng_core.serving.request import Request, RequestError, RequestStatus, SamplingParams
from aieng_core.serving.scheduler import EngineStopped, QueueFull

log = logging.getLogger("aieng.serving.engine")

# What submit_all takes for each request: its id, prompt (text or token ids), parameters, and
# the sink its outputs are handed to.
Submission = tuple[str, "str | Sequence[int]", SamplingParams, Callable[[RequestOutput], None]]


class EngineLoop:
    """Runs an Engine's steps in a background thread; the HTTP server's side of the engine."""

    def __init__(
        self,
        engine: Engine,
        on_step: Callable[[StepStats, EngineStats], None] | None = None,
        threads: ThreadGovernor | None = None,
    ) -> None:
        self.engine = engine
        self.on_step = on_step
        self.threads = threads
        self._threads_now: int | None = None  # the loop thread's torch thread count, once set
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._inbox: collections.deque[tuple[Request, Callable[[RequestOutput], None]]] = collections.deque()
        self._sinks: dict[int, tuple[Request, Callable[[RequestOutput], None]]] = {}  # by id(request)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="aieng-engine", daemon=True)

    def start(self) -> EngineLoop:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop stepping. Requests still in flight are finished as cancelled, so no caller waits forever."""
        with self._lock:
            self._stopping = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        """Stepping, or ready to: False once stopped, or if the loop failed."""
        return self._thread.is_alive() and not self._stopping

    def submit(
        self,
        request_id: str,
        prompt: str | Sequence[int],
        params: SamplingParams,
        sink: Callable[[RequestOutput], None],
    ) -> Request:
        return self.submit_all([(request_id, prompt, params, sink)])[0]

    def submit_all(self, items: Sequence[Submission], samples: int = 1) -> list[Request]:
        """Queue every (request id, prompt, params, sink) or none: each is checked first
        (RequestError, in the caller's thread), then all are queued if the waiting queue has
        room for all (else QueueFull, and nothing was queued). More than the queue can ever
        hold is a RequestError naming the limit: retrying could never succeed. `samples` (n):
        each run of that many items holds the samples of one prompt (the first item's), which
        is prefilled once for all of them."""
        limit = self.engine.limits.max_waiting
        if len(items) % samples:
            raise ValueError(f"{len(items)} items are not runs of {samples} samples")
        if len(items) > limit:
            what = "prompts" if samples == 1 else f"sequences ({len(items) // samples} prompts x n {samples})"
            raise RequestError(
                "prompt" if samples == 1 else "n",
                f"{len(items)} {what} in one request is more than the waiting queue can ever hold "
                f"(serving.max_waiting {limit}); send at most {limit}",
            )
        requests = [
            request
            for start in range(0, len(items), samples)
            for request in self.engine.prepare_samples(
                items[start][1], [(request_id, params) for request_id, _, params, _ in items[start : start + samples]]
            )
        ]
        with self._lock:
            if self._stopping:
                raise EngineStopped("the engine loop is stopped")
            waiting = len(self._inbox) + self.engine.scheduler.num_waiting
            if waiting + len(requests) > limit:
                raise QueueFull(f"{waiting} of {limit} requests are already waiting; {len(requests)} more do not fit")
            self._inbox.extend((request, sink) for request, (_, _, _, sink) in zip(requests, items))
            self._wake.notify()
        return requests

    def stats(self) -> EngineStats:
        stats = self.engine.stats()
        with self._lock:
            waiting = len(self._inbox)
        return dataclasses.replace(stats, num_waiting=stats.num_waiting + waiting)

    def _run(self) -> None:
        try:
            self._step_until_stopped()
        except Exception:
            # Nothing may leave a caller waiting: a loop that dies fails every request it holds,
            # refuses new ones (submit sees _stopping), and `running` turns False for readiness.
            log.exception("the engine loop failed; failing every request in flight")
            with self._lock:
                self._stopping = True
            self._fail_all()
            return
        self._cancel_all()

    def _step_until_stopped(self) -> None:
        engine = self.engine
        idle_wait = self.threads.interval_s if self.threads is not None and self.threads.adapts else None
        while True:
            with self._lock:
                if not self._stopping and not self._inbox and not engine.has_work:
                    self._wake.wait(idle_wait)
                if self._stopping:
                    return
                while self._inbox:
                    request, sink = self._inbox.popleft()
                    self._sinks[id(request)] = (request, sink)
                    engine.enqueue(request)
            self._fit_threads()  # before every step, and after every idle wait: the governor samples then
            if not engine.has_work:
                continue
            for request, output in engine.step():
                self._deliver(request, output)
            if self.on_step is not None and engine.last_step is not None:
                try:
                    self.on_step(engine.last_step, engine.stats())
                except Exception:
                    log.exception("on_step callback failed")

    def _fit_threads(self) -> None:
        """The governor's thread count for this thread's next step (torch's is per thread)."""
        if self.threads is None:
            return
        threads = self.threads.threads()
        if threads != self._threads_now:
            import torch

            torch.set_num_threads(threads)
            self._threads_now = threads

    def _fail_all(self) -> None:
        with self._lock:
            held = [*self._inbox, *self._sinks.values()]
            self._inbox.clear()
            self._sinks.clear()
        for request, sink in held:
            request.cancel()
            if not request.finished:
                request.status, request.finish_reason = RequestStatus.FINISHED, "error"
            try:
                sink(self.engine.output_of(request))
            except Exception:
                log.exception("delivering the failure of request %s failed", request.request_id)

    def _deliver(self, request: Request, output: RequestOutput) -> None:
        with self._lock:
            held = self._sinks.pop(id(request), None) if output.finished else self._sinks.get(id(request))
        if held is None:
            return
        sink = held[1]
        try:
            sink(output)
        except Exception:
            log.exception("delivering output of request %s failed", request.request_id)

    def _cancel_all(self) -> None:
        with self._lock:
            inbox = list(self._inbox)
            self._inbox.clear()
        for request, sink in inbox:
            # Never queued: finished here, so its caller hears about it like everyone else.
            request.cancel()
            request.status, request.finish_reason = RequestStatus.FINISHED, "cancelled"
            self._sinks[id(request)] = (request, sink)
            self._deliver(request, self.engine.output_of(request))
        for running in [*self.engine.scheduler.running, *self.engine.scheduler.waiting]:
            running.cancel()
        while self.engine.has_work:
            for request, output in self.engine.step():
                self._deliver(request, output)
