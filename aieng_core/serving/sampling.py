"""Pick each request's next token from its row of logits, the whole batch at once.

Greedy rows take the argmax (one argmax over the batch). Sampled rows are scaled by their
temperature, sorted once (stable: on ties the lower id ranks first, as argmax picks it), cut
to their top-k and then to the nucleus (top-p: the smallest prefix whose mass reaches p), and
drawn by inverse CDF, all as batched tensor operations; only the uniform number each row
draws with comes from its request's own generator. So a seeded request gives the same tokens
whatever else shares the batch, and a row whose probabilities are not finite fails alone.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import torch

from aieng_core.serving.request import FAILED_TOKEN, Request, RequestError, SamplingParams, TokenLogprob

log = logging.getLogger("aieng.serving.sampling")

_SEED_LIMIT = 2**64  # torch.Generator.manual_seed takes a 64-bit seed


def make_generator(params: SamplingParams, device: str | torch.device = "cpu") -> torch.Generator:
    """A generator seeded from params.seed, or from the OS when no seed is given."""
    seed = params.seed
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little")
    elif not 0 <= seed < _SEED_LIMIT:
        raise RequestError("seed", f"must be in [0, 2**64), got {seed}")
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def sample(logits: torch.Tensor, requests: Sequence[Request]) -> list[int]:
    """One token id per row of `logits` (n, vocab), row i for requests[i]."""
    if logits.dim() != 2 or logits.shape[0] != len(requests):
        raise ValueError(f"logits of shape {tuple(logits.shape)} do not match {len(requests)} requests")
    if not requests:
        return []
    raw = logits
    logits = adjusted(logits, requests)
    # One argmax over the whole batch: the all-greedy batch (the benchmark path) needs nothing else.
    tokens = torch.argmax(logits, dim=-1).tolist()
    rows = [i for i, request in enumerate(requests) if not request.params.greedy]
    if rows:
        sampled = [requests[i] for i in rows]
        for request in sampled:
            if request.generator is None:
                request.generator = make_generator(request.params)
        for i, token in zip(rows, sample_rows(logits[rows], sampled), strict=True):
            tokens[i] = token
    record_logprobs(raw, requests, tokens)
    return tokens


def record_logprobs(logits: torch.Tensor, requests: Sequence[Request], tokens: Sequence[int]) -> None:
    """Appends to each request that asks for logprobs its chosen token's log-probability and
    its row's top ones, from the raw `logits` (the model's distribution, as vLLM reports it by
    default). Batched over those rows; nothing at all when none asks (the benchmark path)."""
    rows = [i for i, r in enumerate(requests) if r.params.logprobs is not None and tokens[i] != FAILED_TOKEN]
    if not rows:
        return
    logprobs = torch.log_softmax(logits[rows].float(), dim=-1)
    chosen = logprobs.gather(1, torch.tensor([[tokens[i]] for i in rows], device=logits.device))[:, 0].tolist()
    most = max(requests[i].params.logprobs or 0 for i in rows)
    top_values: list[list[float]] = [[] for _ in rows]
    top_ids: list[list[int]] = [[] for _ in rows]
    if most:
        values, ids = torch.topk(logprobs, most, dim=-1)
        top_values, top_ids = values.tolist(), ids.tolist()
    for n, i in enumerate(rows):
        k = requests[i].params.logprobs or 0
        top = tuple(zip(top_ids[n][:k], top_values[n][:k], strict=True))
        requests[i].logprobs.append(TokenLogprob(tokens[i], chosen[n], top))


def adjusted(logits: torch.Tensor, requests: Sequence[Request]) -> torch.Tensor:
    """`logits` with each request's logit_bias added and its presence and frequency penalties
    subtracted (OpenAI's definitions, on the request's output tokens), batched over the rows
    that have any; the same tensor when none has (the benchmark path pays nothing)."""
    rows = [i for i, request in enumerate(requests) if request.params.adjusts_logits]
    if not rows:
        return logits
    device, vocab = logits.device, logits.shape[-1]
    logits = logits.float().clone()
    # Every (row, token) pair once per generated token: their counts, by index_put accumulation.
    count_rows = [i for i in rows for _ in requests[i].output_ids]
    count_tokens = [token for i in rows for token in requests[i].output_ids]
    if count_rows:
        counts = torch.zeros(len(requests), vocab, device=device)
        ones = torch.ones(len(count_rows), device=device)
        index = (torch.tensor(count_rows, device=device), torch.tensor(count_tokens, device=device))
        counts.index_put_(index, ones, accumulate=True)
        frequency = torch.tensor([r.params.frequency_penalty for r in requests], device=device)
        presence = torch.tensor([r.params.presence_penalty for r in requests], device=device)
        logits -= frequency[:, None] * counts + presence[:, None] * (counts > 0)
    bias_rows = [i for i in rows for _ in requests[i].params.logit_bias]
    if bias_rows:
        tokens = [token for i in rows for token, _ in requests[i].params.logit_bias]
        values = [value for i in rows for _, value in requests[i].params.logit_bias]
        index = (torch.tensor(bias_rows, device=device), torch.tensor(tokens, device=device))
        logits.index_put_(index, torch.tensor(values, device=device), accumulate=True)
    return logits


def scaled_rows(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """fp32 logits divided by each row's temperature."""
    temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=logits.device)
    return logits.float() / temperature[:, None]


def sample_rows(logits: torch.Tensor, requests: Sequence[Request]) -> list[int]:
    """A drawn token per row of `logits`, each row with its request's parameters and generator;
    FAILED_TOKEN for a row whose probabilities are not finite (only that request fails)."""
    params = [r.params for r in requests]
    device = logits.device
    values, ids = torch.sort(scaled_rows(logits, params), dim=-1, descending=True, stable=True)
    vocab = values.shape[-1]
    ranks = torch.arange(vocab, device=device)
    top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=device)
    values = values.masked_fill(ranks >= top_k[:, None], float("-inf"))
    # The nucleus, within the top-k: the smallest prefix whose mass reaches top_p. Rounding can
    # leave the total just under 1.0, hence no cut at all for top_p >= 1; the first is always kept.
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device)
    reaching = (torch.cumsum(torch.softmax(values, dim=-1), dim=-1) < top_p[:, None]).sum(dim=-1) + 1
    keep = torch.where(top_p >= 1.0, top_k, torch.minimum(reaching, top_k))
    values = values.masked_fill(ranks >= keep[:, None], float("-inf"))
    cdf = torch.cumsum(torch.softmax(values, dim=-1), dim=-1)
    # Each row's uniform from its own generator (on the generator's device, as torch draws).
    uniforms = torch.cat([torch.rand(1, generator=r.generator, device=r.generator.device) for r in requests])
    targets = uniforms.to(device=device, dtype=cdf.dtype)[:, None] * cdf[:, -1:]
    index = torch.searchsorted(cdf, targets).clamp_(max=(keep - 1)[:, None])
    drawn = ids.gather(1, index)[:, 0].tolist()
    total = cdf[:, -1]
    bad = (~torch.isfinite(total) | (total <= 0)).tolist()
    for row, request in enumerate(requests):
        if bad[row]:
            log.error("sampling failed for request %s: its probabilities are not finite", request.request_id)
            drawn[row] = FAILED_TOKEN
    return drawn
