"""The scheduler: which requests run in the next step. Pure Python, no torch.

Continuous (iteration-level) batching: every step, cancelled requests leave and free their
slots, every running request decodes, and prompts are prefilled within a budget of
`max_prefill_tokens` per step: first the rest of prompts admitted earlier (chunked prefill),
then waiting requests, first come, first served, while a KV slot is free and budget is left.
A request admitted to a slot first takes the keys and values of its prompt's longest cached
prefix (prefix_cache.py): only the rest of its prompt is prefilled and counts against the budget.
The `n` samples of one prompt are admitted together, each to a slot of its own, and the prompt
is prefilled once: when its last chunk is planned, the other samples are planned as forks
(StepPlan.forks), and the runner copies the prompt's keys and values into their slots.
A prompt longer than the budget is prefilled a chunk per step, beside the running decodes, so
one long prompt never stalls every stream for a whole prefill.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from aieng_core.serving.request import FinishReason, Request, RequestStatus, StepPlan


class SlotPool(Protocol):
    """The part of KVCachePool the scheduler uses; a Protocol keeps this module torch-free."""

    @property
    def free_slots(self) -> int: ...

    def allocate(self, owner: str) -> int: ...

    def free(self, slot: int) -> None: ...


class PrefixReuse(Protocol):
    """The part of PrefixCache the scheduler uses: on admission, a request's prompt tokens
    whose keys and values were copied into its slot from the cache (prefix_cache.py)."""

    def reuse(self, request: Request) -> int: ...


class EngineStopped(RuntimeError):
    """A request submitted to an engine loop that stopped (or died): never queued. Here, beside
    QueueFull, so the HTTP server can catch both without importing the engine (torch)."""


class QueueFull(Exception):
    """The waiting queue is at `max_waiting`: the caller should shed load (HTTP 429)."""


class Scheduler:
    def __init__(
        self,
        pool: SlotPool,
        max_waiting: int,
        max_prefill_tokens: int,
        clock: Callable[[], float] = time.monotonic,
        prefix: PrefixReuse | None = None,
    ) -> None:
        if max_waiting < 1:
            raise ValueError(f"max_waiting must be at least 1, got {max_waiting}")
        if max_prefill_tokens < 1:
            raise ValueError(f"max_prefill_tokens must be at least 1, got {max_prefill_tokens}")
        self.pool = pool
        self.max_waiting = max_waiting
        self.max_prefill_tokens = max_prefill_tokens
        self._clock = clock
        self.prefix = prefix
        self._waiting: deque[Request] = deque()
        # A dict keeps admission order and removes a finished request in O(1). Keyed by the
        # object, not the request id: ids are the caller's and need not be unique (a /predict
        # call runs several sequences under one id).
        self._running: dict[int, Request] = {}

    @property
    def waiting(self) -> tuple[Request, ...]:
        return tuple(self._waiting)

    @property
    def running(self) -> tuple[Request, ...]:
        return tuple(self._running.values())

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    def add(self, request: Request) -> None:
        """Queue a new request; QueueFull when `max_waiting` requests already wait."""
        if request.status is not RequestStatus.WAITING:
            raise ValueError(f"request {request.request_id!r} is {request.status.value}, not waiting")
        if len(self._waiting) >= self.max_waiting:
            raise QueueFull(f"the waiting queue is full: {self.max_waiting} requests already wait")
        self._waiting.append(request)

    def finish(self, request: Request, reason: FinishReason) -> None:
        """Take the request out of the queue or the running set and free its slot at once.
        Finishing an already finished request changes nothing: the first reason stands."""
        if request.finished:
            return
        if request.status is RequestStatus.RUNNING:
            del self._running[id(request)]
        else:
            self._waiting.remove(request)
        # Samples waiting for this request's prompt (n > 1) prefill it themselves now.
        for fork in request.forks:
            if fork.fork_of is request:
                fork.fork_of = None
        if request.slot is not None:
            self.pool.free(request.slot)
            request.slot = None
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.finish_time = self._clock()

    def schedule(self) -> StepPlan:
        finished = [r for r in (*self._waiting, *self._running.values()) if r.cancelled]
        for request in finished:
            self.finish(request, "cancelled")

        # Every running request decodes every step, whatever waits: admission only adds
        # prefills beside them, so a long queue never starves sequences already generating.
        decode = tuple(r for r in self._running.values() if r.output_ids)

        prefill: list[Request] = []
        budget = self.max_prefill_tokens
        for request in self._running.values():  # prompts admitted earlier, in admission order
            if budget == 0:
                break
            if request.fork_of is None and request.num_prefilled < request.num_prompt_tokens:
                budget -= self._plan_chunk(request, budget)
                prefill.append(request)
        while self._waiting and budget > 0:
            request = self._waiting[0]
            if request.fork_of is not None:  # queued after its prompt's request was admitted:
                request.fork_of = None  # it prefills the prompt itself
            # The samples of one prompt take their slots together: their prefill is one.
            group = [request, *(f for f in request.forks if f.fork_of is request and not f.finished)]
            if len(group) > self.pool.free_slots:
                break
            for member in group:
                self._waiting.remove(member)
                member.slot = self.pool.allocate(member.request_id)
                member.status = RequestStatus.RUNNING
                self._running[id(member)] = member
            if self.prefix is not None:  # a cached prefix is prefilled already
                request.num_prefilled = self.prefix.reuse(request)
            budget -= self._plan_chunk(request, budget)
            prefill.append(request)

        pairs = [
            (fork, request)
            for request in prefill
            if request.prefill_completes
            for fork in request.forks
            if fork.fork_of is request and fork.status is RequestStatus.RUNNING
        ]
        for fork, _ in pairs:  # the runner copies the prompt's keys and values into their slots
            fork.fork_of = None
            fork.num_prefilled = fork.num_prompt_tokens
        forks, sources = tuple(f for f, _ in pairs), tuple(r for _, r in pairs)
        chunks = tuple((r.prefill_start, r.prefill_length) for r in prefill)
        return StepPlan(
            prefill=tuple(prefill),
            decode=decode,
            finished=tuple(finished),
            prefill_chunks=chunks,
            forks=forks,
            fork_sources=sources,
        )

    @staticmethod
    def _plan_chunk(request: Request, budget: int) -> int:
        """The next chunk of `request`'s prompt, at most `budget` tokens: recorded on the request
        (prefill_start, prefill_length) and counted as prefilled. Returns its length."""
        length = min(request.num_prompt_tokens - request.num_prefilled, budget)
        request.prefill_start, request.prefill_length = request.num_prefilled, length
        request.num_prefilled += length
        return length
