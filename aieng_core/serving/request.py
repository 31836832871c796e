"""A generation request, its sampling parameters, and the messages that cross the engine's
boundaries: a step plan into the model runner, sampled tokens out of it.

Framework-free and torch-free: the scheduler and its tests use these without a model.
"""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

FinishReason = Literal["stop", "length", "cancelled", "timeout", "error"]

# Temperatures below this sample greedily (vLLM's _SAMPLING_EPS): dividing logits by 1e-40
# overflows to inf and would make the softmax NaN.
GREEDY_TEMPERATURE = 1e-5
MAX_PENALTY = 2.0  # OpenAI's range for presence_penalty and frequency_penalty
MAX_LOGIT_BIAS = 100.0  # OpenAI's range for a logit_bias value
MAX_LOGPROBS = 20  # OpenAI's most top_logprobs (completions' logprobs: 5; vLLM allows 20 for both)


class RequestError(ValueError):
    """A request that cannot be served as asked; `field` names the offending parameter."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token and when to stop.

    temperature 0 (below GREEDY_TEMPERATURE) is greedy (top_k, top_p and seed are then irrelevant). top_k 0 means no
    top-k cut; top_p 1.0 means no nucleus cut. With a seed, sampled output is reproducible
    whatever else shares the batch: each request draws from its own generator.

    The engine has no product defaults: a caller always says how many tokens, and what it
    leaves out is the neutral value (greedy, no cut). What a server request leaves out comes
    from its bundle (the bundle: config section, serving.json), never from here.
    """

    max_new_tokens: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    # OpenAI's: subtracted from a token's logit once it has been generated (presence), and per
    # time it has been generated (frequency), counting this request's output only, as vLLM does.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # (token id, value) added to that token's logit at every step; ids are checked against the
    # vocabulary by the engine.
    logit_bias: tuple[tuple[int, float], ...] = ()
    # The log-probability of each token chosen, and of the `logprobs` most likely tokens at its
    # step (0: the chosen one's only); None: none. Of the model's own distribution, before
    # penalties, logit_bias and temperature (vLLM's default, raw logprobs).
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise RequestError("max_new_tokens", f"must be at least 1, got {self.max_new_tokens}")
        if not self.temperature >= 0.0:  # also refuses NaN
            raise RequestError("temperature", f"must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise RequestError("top_k", f"must be >= 0 (0: no cut), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise RequestError("top_p", f"must be in (0, 1], got {self.top_p}")
        if any(not s for s in self.stop):
            raise RequestError("stop", "stop strings must not be empty")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -MAX_PENALTY <= getattr(self, name) <= MAX_PENALTY:  # also refuses NaN
                raise RequestError(name, f"must be in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}], got {getattr(self, name)}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise RequestError("logprobs", f"must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        for token, value in self.logit_bias:
            if token < 0 or not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
                raise RequestError(
                    "logit_bias", f"token ids >= 0 and values in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]"
                )

    @property
    def adjusts_logits(self) -> bool:
        """Whether this request changes its logits before picking a token."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE


class TokenLogprob(NamedTuple):
    """A chosen token's log-probability and its step's most likely tokens, (id, log-probability)
    from the most likely down (SamplingParams.logprobs of them)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """One sequence through the engine. The scheduler moves it WAITING -> RUNNING (holding a
    KV slot) -> FINISHED (slot freed). Anyone may call cancel(), from any thread; the engine
    reads the flag before every step and frees the slot at once."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival_time: float = field(default_factory=time.monotonic)
    output_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    slot: int | None = None
    finish_reason: FinishReason | None = None
    scheduled_time: float | None = None  # when it was admitted to a slot (time.monotonic)
    first_token_time: float | None = None
    finish_time: float | None = None
    # Per-request random generator for sampling (a torch.Generator), made at admission.
    generator: Any = None
    # Chunked prefill: prompt tokens whose keys and values are in the cache (or scheduled to be,
    # by the step being planned), and the chunk the current step prefills (start, length).
    num_prefilled: int = 0
    prefill_start: int = 0
    prefill_length: int = 0
    # Samples of one prompt (`n`): the request that prefills the prompt, for each of the others
    # (`fork_of`, until the prompt is forked to them), and the others, for it (`forks`). They
    # are admitted together; when the prompt's last chunk is prefilled, its keys and values are
    # copied into the forks' slots and each fork samples its first token from the same logits.
    logprobs: list[TokenLogprob] = field(default_factory=list, repr=False)  # one per output token, if asked
    # Rows of the prefix cache's store to copy into the slot before the first chunk (prefix_cache.py).
    prefix_rows: tuple[int, ...] = ()
    fork_of: Request | None = field(default=None, repr=False)
    forks: list[Request] = field(default_factory=list, repr=False)
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise RequestError("prompt", "the prompt encodes to no tokens")

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens: the sequence's length so far."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def prefill_completes(self) -> bool:
        """Whether this step's prefill chunk ends the prompt: its logits give the first token."""
        return self.prefill_start + self.prefill_length == self.num_prompt_tokens

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED


@dataclass(frozen=True)
class StepPlan:
    """What the scheduler decided for one engine step.

    prefill: requests prefilling a chunk of their prompt this step (prefill_start,
    prefill_length), each holding a slot; the runner writes the chunk's keys/values and, for a
    chunk that ends the prompt (prefill_completes), samples the first token. decode: requests
    that already have at least one generated token; the runner feeds each its last token at
    position num_tokens - 1.
    The two lists are disjoint. finished: requests the scheduler removed before this step
    (cancelled), with their slots already freed, for the engine to report.
    """

    prefill: tuple[Request, ...] = ()
    decode: tuple[Request, ...] = ()
    finished: tuple[Request, ...] = ()
    # Samples of a prompt whose last chunk is prefilled this step (by their fork_of, in
    # `prefill`): each takes a copy of that prompt's keys and values and samples its first token.
    forks: tuple[Request, ...] = ()
    fork_sources: tuple[Request, ...] = ()  # the request whose prompt each fork copies
    # (prefill_start, prefill_length) of each prefill request as planned: the requests' own
    # fields hold the latest chunk only.
    prefill_chunks: tuple[tuple[int, int], ...] = ()

    @property
    def empty(self) -> bool:
        return not self.prefill and not self.decode

    @property
    def batch_size(self) -> int:
        return len(self.prefill) + len(self.forks) + len(self.decode)

    @property
    def sampled(self) -> tuple[Request, ...]:
        """The requests a token is sampled for (or NO_TOKEN given), in SampledTokens' order."""
        return (*self.prefill, *self.forks, *self.decode)


# A token the sampler could not draw for one row: that request fails alone, its batch goes on.
FAILED_TOKEN = -1
# No token this step: the request prefilled a chunk that does not end its prompt.
NO_TOKEN = -2


@dataclass(frozen=True)
class SampledTokens:
    """What the model runner sampled: one new token id per planned request, in the plan's
    order (StepPlan.sampled: prefill, forks, then decode). Request ids need not be unique (a /predict call sends
    several sequences under one id), so nothing is keyed by them."""

    tokens: tuple[int, ...]
    prefill_tokens: int = 0  # prompt tokens run through the model in this step
    decode_tokens: int = 0
    forward_seconds: float = 0.0  # model forwards and sampling
