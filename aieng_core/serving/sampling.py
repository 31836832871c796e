"""Pick each request's next token from its row of logits.

Greedy rows take the argmax. Sampled rows scale by temperature, cut to top-k then to the
nucleus (top-p), and draw with the request's own generator, one row at a time, so a seeded
request gives the same tokens whatever else shares the batch.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import torch

from aieng_core.serving.request import FAILED_TOKEN, Request, RequestError, SamplingParams

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
    # One argmax over the whole batch: the all-greedy batch (the benchmark path) needs nothing else.
    tokens = torch.argmax(logits, dim=-1).tolist()
    for i, request in enumerate(requests):
        if not request.params.greedy:
            if request.generator is None:
                request.generator = make_generator(request.params)
            try:
                tokens[i] = _sample_row(logits[i], request.params, request.generator)
            except RuntimeError:  # e.g. non-finite probabilities: only this request fails
                log.exception("sampling failed for request %s", request.request_id)
                tokens[i] = FAILED_TOKEN
    return tokens


def _sample_row(row: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    scaled = row.float() / params.temperature
    vocab = scaled.shape[0]
    top_k = params.top_k if 0 < params.top_k < vocab else 0
    if top_k == 0 and params.top_p >= 1.0:
        return _draw(torch.softmax(scaled, dim=-1), generator)

    # Stable descending sort: on ties the lower id ranks first, as torch.argmax picks it.
    values, ids = torch.sort(scaled, descending=True, stable=True)
    if top_k:
        values, ids = values[:top_k], ids[:top_k]
    if params.top_p < 1.0:
        probs = torch.softmax(values, dim=-1)
        cumulative = torch.cumsum(probs, dim=-1)
        # The smallest prefix whose mass reaches top_p; rounding can leave the total just under
        # 1.0, hence the clamp, and the first token is always kept.
        keep = min(int((cumulative < params.top_p).sum()) + 1, values.shape[0])
        values, ids = values[:keep], ids[:keep]
    return int(ids[_draw(torch.softmax(values, dim=-1), generator)])


def _draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    # torch draws on the generator's device: a CPU generator serves logits from any device.
    return int(torch.multinomial(probs.to(generator.device), 1, generator=generator))
