"""The engine loop: ties the scheduler, the model runner and detokenization into steps.

`Engine` is single-threaded and synchronous: add requests, call step() until none is left.
Each step the scheduler picks who runs (continuous batching: a waiting request joins at the
next step, a finished one leaves at once and frees its slot), the runner runs the step and
samples one token per sequence, and the engine turns tokens into text and decides who is
finished. `Engine.generate` runs a list of prompts to completion (goldens, tests, benchmarks).

engine_loop.py runs an Engine in a background thread for the HTTP server.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tokenizers import Tokenizer

from aieng_core.model.llama import LlamaForCausalLM
from aieng_core.serving.detokenizer import IncrementalDetokenizer, token_bytes_table
from aieng_core.serving.kv_cache import KVCachePool
from aieng_core.serving.model_runner import ModelRunner
from aieng_core.serving.prefix_cache import PrefixCache
from aieng_core.serving.request import (
    FAILED_TOKEN,
    NO_TOKEN,
    FinishReason,
    Request,
    RequestError,
    SampledTokens,
    SamplingParams,
    StepPlan,
    TokenLogprob,
)
from aieng_core.serving.sampling import make_generator
from aieng_core.serving.scheduler import Scheduler
from aieng_core.serving.step_graphs import StepGraphSettings

log = logging.getLogger("aieng.serving.engine")


@dataclass(frozen=True)
class EngineLimits:
    max_batch: int
    max_context: int
    max_waiting: int
    max_prefill_tokens: int


@dataclass(frozen=True)
class RequestOutput:
    """A request's progress after a step: the new text (never half a character) and, once
    finished, why. Timings are seconds from arrival, set once known."""

    request_id: str
    new_text: str
    new_token_ids: tuple[int, ...]
    finished: bool
    finish_reason: FinishReason | None
    text: str
    token_ids: tuple[int, ...]
    prompt_tokens: int
    queue_seconds: float | None = None
    ttft_seconds: float | None = None
    e2e_seconds: float | None = None
    # With SamplingParams.logprobs: those of the new tokens, and, once finished, of every token.
    new_logprobs: tuple[TokenLogprob, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class EngineStats:
    num_running: int
    num_waiting: int
    free_slots: int
    max_batch: int
    kv_cache_bytes: int
    prefix_cache_blocks: int = 0  # blocks of prompt prefixes cached now (prefix_cache.py)
    prefix_cache_bytes: int = 0  # preallocated for them


@dataclass(frozen=True)
class StepStats:
    """What one step did and where its time went: the profile of the benchmark's bounds."""

    batch_size: int
    prefill_requests: int
    prefill_tokens: int
    prefill_chunks: tuple[int, ...]  # tokens of each prompt chunk prefilled (chunked prefill)
    decode_tokens: int
    schedule_seconds: float
    forward_seconds: float
    postprocess_seconds: float
    # Prompt tokens of the requests admitted this step, and those of them taken from the prefix cache.
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0


class Engine:
    def __init__(
        self,
        model: LlamaForCausalLM,
        tokenizer: Tokenizer,
        limits: EngineLimits,
        eos_token_id: int,
        graphs: StepGraphSettings = StepGraphSettings(),
        bundle_key: str = "unbundled",
        prefix_cache_tokens: int = 0,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.limits = limits
        self.eos_token_id = eos_token_id
        device = next(model.parameters()).device
        self.pool = KVCachePool.for_model(model.config, limits.max_batch, limits.max_context, device)
        # Keyed by the bundle: a cached prefix is never reused by another bundle's engine.
        self.prefix_cache = PrefixCache(self.pool, prefix_cache_tokens, bundle_key)
        prefix = self.prefix_cache if self.prefix_cache.enabled else None
        self.scheduler = Scheduler(self.pool, limits.max_waiting, limits.max_prefill_tokens, prefix=prefix)
        self.runner = ModelRunner(model, self.pool, graphs, bundle_key, prefix)
        self._token_bytes = token_bytes_table(tokenizer)
        self._detokenizers: dict[int, IncrementalDetokenizer] = {}  # by id(request)
        self.last_step: StepStats | None = None

    # ---- requests ------------------------------------------------------------------------
    def encode(self, prompt: str) -> list[int]:
        return self.tokenizer.encode(prompt, add_special_tokens=False).ids

    def prepare(self, request_id: str, prompt: str | Sequence[int], params: SamplingParams) -> Request:
        """A checked request, not yet queued. Thread-safe: the HTTP server calls it in its
        own thread so a bad request is refused at once with the field named."""
        ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise RequestError("prompt", "the prompt is empty (it encodes to no tokens)")
        vocab = self.model.config.vocab_size
        if any(not 0 <= token < vocab for token in ids):
            raise RequestError("prompt", f"token ids must be in [0, {vocab})")
        if any(not 0 <= token < vocab for token, _ in params.logit_bias):
            raise RequestError("logit_bias", f"token ids must be in [0, {vocab})")
        context = self.limits.max_context
        if len(ids) >= context:
            raise RequestError("prompt", f"the prompt is {len(ids)} tokens; max_context is {context}")
        if len(ids) + params.max_new_tokens > context:
            # Refused, not truncated: a silently shortened answer looks like a model problem.
            raise RequestError(
                "max_new_tokens",
                f"prompt ({len(ids)} tokens) + max_new_tokens ({params.max_new_tokens}) exceeds max_context "
                f"({context}); at most {context - len(ids)} new tokens fit",
            )
        request = Request(request_id=request_id, prompt_ids=ids, params=params)
        if not params.greedy:
            request.generator = make_generator(params)
        return request

    def prepare_samples(
        self, prompt: str | Sequence[int], samples: Sequence[tuple[str, SamplingParams]]
    ) -> list[Request]:
        """The `n` samples of one prompt, each (request id, params), checked and not yet queued:
        the first prefills the prompt, the others fork from it (scheduler.py). Queue them all,
        in order, before the next step."""
        if len(samples) > self.limits.max_batch:
            raise RequestError(
                "n",
                f"{len(samples)} samples of one prompt need as many KV-cache slots at once; this bundle has "
                f"{self.limits.max_batch} (bundle.max_batch)",
            )
        (first_id, first_params), *others = samples
        first = self.prepare(first_id, prompt, first_params)
        first.forks = [self.prepare(request_id, first.prompt_ids, params) for request_id, params in others]
        for fork in first.forks:
            fork.fork_of = first
        return [first, *first.forks]

    def enqueue(self, request: Request) -> None:
        self.scheduler.add(request)  # QueueFull when max_waiting requests already wait
        self._detokenizers[id(request)] = IncrementalDetokenizer(self._token_bytes, request.params.stop)

    def add_request(self, request_id: str, prompt: str | Sequence[int], params: SamplingParams) -> Request:
        request = self.prepare(request_id, prompt, params)
        self.enqueue(request)
        return request

    @property
    def token_bytes(self) -> list[bytes]:
        """The bytes each token id stands for (detokenizer.token_bytes_table)."""
        return self._token_bytes

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def stats(self) -> EngineStats:
        return EngineStats(
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            free_slots=self.pool.free_slots,
            max_batch=self.pool.max_batch,
            kv_cache_bytes=self.pool.nbytes,
            prefix_cache_blocks=self.prefix_cache.cached_blocks,
            prefix_cache_bytes=self.prefix_cache.nbytes,
        )

    # ---- stepping ------------------------------------------------------------------------
    def step(self) -> list[tuple[Request, RequestOutput]]:
        """One iteration: schedule, run, detokenize. Returns (request, output) for every
        request that progressed or finished in this step."""
        started = time.perf_counter()
        self.last_step = None  # an empty step reports nothing (on_step must not count one twice)
        prefix = self.prefix_cache.stats
        looked_up = (prefix.queried, prefix.hit)
        plan = self.scheduler.schedule()
        scheduled = time.perf_counter()
        outputs = [(request, self._finished_output(request)) for request in plan.finished]
        if plan.empty:
            return outputs
        admitted = time.monotonic()
        for request in plan.prefill:
            if request.scheduled_time is None:  # its first chunk: it took its slot, and its forks theirs
                for admitted_now in (request, *request.forks):
                    if admitted_now.scheduled_time is None:
                        admitted_now.scheduled_time = admitted
        try:
            result = self.runner.run(plan)
        except Exception:
            # One bad step must not take the server down: its requests fail, the rest go on;
            # the samples still waiting for a failed prompt's prefill fail with it.
            log.exception("engine step failed; finishing its %d requests with an error", plan.batch_size)
            waiting = [f for r in plan.prefill for f in r.forks if f.fork_of is r and not f.finished]
            self.last_step = self._step_stats(plan, None, looked_up, started, scheduled, time.perf_counter())
            return outputs + [(r, self._finish(r, "error", "")) for r in (*waiting, *plan.sampled)]
        ran = time.perf_counter()
        now = time.monotonic()
        for request, token in zip(plan.sampled, result.tokens, strict=True):
            if token != NO_TOKEN:  # NO_TOKEN: a prompt chunk that does not end its prompt
                outputs.append((request, self._advance(request, token, now)))
        self.last_step = self._step_stats(plan, result, looked_up, started, scheduled, ran)
        return outputs

    def _step_stats(
        self,
        plan: StepPlan,
        result: SampledTokens | None,
        looked_up: tuple[int, int],
        started: float,
        scheduled: float,
        ran: float,
    ) -> StepStats:
        """What the step did; `result` None: it failed. `looked_up`: the prefix cache's
        (queried, hit) before the step."""
        prefix = self.prefix_cache.stats
        return StepStats(
            batch_size=plan.batch_size,
            prefill_requests=len(plan.prefill),
            prefill_tokens=result.prefill_tokens if result is not None else 0,
            prefill_chunks=tuple(length for _, length in plan.prefill_chunks),
            decode_tokens=result.decode_tokens if result is not None else 0,
            schedule_seconds=scheduled - started,
            forward_seconds=ran - scheduled,
            postprocess_seconds=time.perf_counter() - ran,
            prefix_queried_tokens=prefix.queried - looked_up[0],
            prefix_hit_tokens=prefix.hit - looked_up[1],
        )

    def _advance(self, request: Request, token: int, now: float) -> RequestOutput:
        if token == FAILED_TOKEN:
            return self._finish(request, "error", "")
        request.output_ids.append(token)
        if request.first_token_time is None:
            request.first_token_time = now
        params = request.params
        if token == self.eos_token_id and not params.ignore_eos:
            return self._finish(request, "stop", "", (token,))
        detokenizer = self._detokenizers[id(request)]
        new_text = detokenizer.push(token)
        if detokenizer.stopped:
            return self._finish(request, "stop", new_text, (token,))
        if len(request.output_ids) >= params.max_new_tokens:
            return self._finish(request, "length", new_text, (token,))
        return self._output(request, new_text, (token,))

    def _finish(
        self, request: Request, reason: FinishReason, new_text: str, new_ids: tuple[int, ...] = ()
    ) -> RequestOutput:
        detokenizer = self._detokenizers.get(id(request))
        if detokenizer is not None and not detokenizer.stopped:
            new_text += detokenizer.flush()
        self.scheduler.finish(request, reason)
        output = self._output(request, new_text, new_ids)
        self._detokenizers.pop(id(request), None)
        return output

    def _finished_output(self, request: Request) -> RequestOutput:
        """Output of a request the scheduler finished itself (cancelled)."""
        output = self._output(request, "", ())
        self._detokenizers.pop(id(request), None)
        return output

    def _output(self, request: Request, new_text: str, new_ids: tuple[int, ...]) -> RequestOutput:
        detokenizer = self._detokenizers.get(id(request))
        arrival = request.arrival_time
        started = request.scheduled_time
        asked = request.params.logprobs is not None
        return RequestOutput(
            request_id=request.request_id,
            new_text=new_text,
            new_token_ids=new_ids,
            finished=request.finished,
            finish_reason=request.finish_reason,
            text=detokenizer.text if detokenizer is not None else "",
            token_ids=tuple(request.output_ids),
            prompt_tokens=request.num_prompt_tokens,
            queue_seconds=None if started is None else started - arrival,
            ttft_seconds=None if request.first_token_time is None else request.first_token_time - arrival,
            e2e_seconds=None if request.finish_time is None else request.finish_time - arrival,
            new_logprobs=tuple(request.logprobs[len(request.logprobs) - len(new_ids) :]) if asked and new_ids else (),
            logprobs=tuple(request.logprobs) if asked and request.finished else (),
        )

    # ---- whole generations -----------------------------------------------------------------
    def generate(
        self, prompts: Sequence[str | Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[RequestOutput]:
        """Run every prompt to completion, batched as the server would; final outputs in
        prompt order. Requests beyond the waiting queue are fed in as it drains."""
        if self.has_work:
            raise RuntimeError("generate() needs an idle engine")
        each = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(each) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(each)} sampling parameters")
        pending = collections.deque(
            self.prepare(f"generate-{n}", prompt, p) for n, (prompt, p) in enumerate(zip(prompts, each))
        )
        order = {id(request): n for n, request in enumerate(pending)}
        final: list[RequestOutput | None] = [None] * len(pending)
        while pending or self.has_work:
            while pending and self.scheduler.num_waiting < self.limits.max_waiting:
                self.enqueue(pending.popleft())
            for request, output in self.step():
                if output.finished:
                    final[order[id(request)]] = output
        return [output for output in final if output is not None]

    def warmup(self, prompt_lengths: Sequence[int], new_tokens: int = 8) -> dict[str, Any]:
        """The decode step graphs captured (step_graphs.py; once per engine), then what real
        traffic does first, at every thread count the steps may run at: for each batch bucket,
        that many prompts prefilled together (packed, up to max_prefill_tokens) and decoded in
        the bucket, half greedy and half sampled; then one generation per prompt length, so the
        first real request of each size does not pay for first-use allocations. Returns the
        capture's figures (`step_graphs`), each bucket's run (`batches`) and seconds per prompt
        length, first run (cold) and again (warm)."""
        from aieng_core.serving.device import torch_threads

        graphs = self.runner.graphs
        step_graphs = graphs.summary() if graphs.figures else graphs.capture()
        filler = [token for token in self.encode(" the data pipeline" * 64) if token != self.eos_token_id]
        batches: list[dict[str, Any]] = []
        for threads in graphs.thread_counts:
            with torch_threads(threads):
                for bucket in graphs.buckets:
                    batches.append({"threads": threads, **self._warm_bucket(bucket, filler, new_tokens, len(batches))})
        timings = []
        for length in prompt_lengths:
            prompt = _cut(filler, length)
            new = max(1, min(new_tokens, self.limits.max_context - length))
            params = SamplingParams(max_new_tokens=new, ignore_eos=True)
            runs = []
            for _ in range(2):
                started = time.perf_counter()
                self.generate([prompt], params)
                runs.append(time.perf_counter() - started)
            timings.append(
                {"prompt_tokens": length, "new_tokens": new, "cold_seconds": runs[0], "warm_seconds": runs[1]}
            )
        return {"buckets": timings, "batches": batches, "step_graphs": step_graphs}

    def _warm_bucket(self, bucket: int, filler: list[int], new_tokens: int, run: int) -> dict[str, Any]:
        """`bucket` prompts long enough together to fill one prefill step (within the context),
        generated together: a packed prefill, then decode steps of `bucket` rows. Each prompt of
        each run starts with a token of its own, so none is taken from the prefix cache."""
        new = max(1, min(new_tokens, self.limits.max_context - 2))
        length = max(1, min(-(-self.limits.max_prefill_tokens // bucket), self.limits.max_context - new - 1))
        params = [
            SamplingParams(max_new_tokens=new, ignore_eos=True)
            if row % 2 == 0
            else SamplingParams(max_new_tokens=new, ignore_eos=True, temperature=0.8, top_p=0.9, top_k=40, seed=row)
            for row in range(bucket)
        ]
        vocab = self.model.config.vocab_size
        firsts = [(run * self.limits.max_batch + row) % (vocab - 1) for row in range(bucket)]
        prompts = [[first + (first >= self.eos_token_id), *_cut(filler, length - 1)] for first in firsts]
        started = time.perf_counter()
        self.generate(prompts, params)
        return {"batch": bucket, "prompt_tokens": length, "new_tokens": new, "seconds": time.perf_counter() - started}

    def prepare_to_serve(self, prompt_lengths: Sequence[int]) -> dict[str, Any]:
        """What readiness promises, before it turns 200: a warmup generation per prompt length
        that fits this engine's context, then a one-token forward. Returns warmup()'s timings."""
        timings = self.warmup([n for n in prompt_lengths if n < self.limits.max_context])
        self.check_forward()
        self.prefix_cache.clear()  # warmup's filler is not what the cache and its hit rate are for
        return timings

    @torch.inference_mode()
    def check_forward(self) -> None:
        """One one-token forward through a free slot: what readiness promises works."""
        if self.has_work:
            return  # the engine is generating: evidently forwards work
        self.generate([[self.filler_token()]], SamplingParams(max_new_tokens=1, ignore_eos=True))

    def filler_token(self) -> int:
        return next(t for t in self.encode(" the") if t != self.eos_token_id)

    def output_of(self, request: Request) -> RequestOutput:
        """The request's output as it stands, with nothing new: what its caller is told when the
        request ends outside a step (cancelled before it was queued, failed with its loop)."""
        return self._output(request, "", ())


def _cut(filler: list[int], length: int) -> list[int]:
    """The first `length` tokens of `filler` repeated."""
    return (filler * (length // max(len(filler), 1) + 1))[:length]
