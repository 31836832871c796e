"""Greedy continuations through the engine, as the server would batch them: what a bundle
records as its goldens and what the benchmark report shows of a model's text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aieng_core.serving.engine import Engine
from aieng_core.serving.request import SamplingParams


def greedy_continuations(engine: Engine, prompts: Sequence[str], max_new_tokens: int) -> list[dict[str, Any]]:
    """One greedy generation per prompt, all submitted together:
    `[{prompt, prompt_ids, max_new_tokens, token_ids, text, finish_reason}]`."""
    outputs = engine.generate(list(prompts), SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0))
    return [
        {
            "prompt": prompt,
            "prompt_ids": engine.encode(prompt),
            "max_new_tokens": max_new_tokens,
            "token_ids": list(output.token_ids),
            "text": output.text,
            "finish_reason": output.finish_reason,
        }
        for prompt, output in zip(prompts, outputs)
    ]


def golden_agreement(fp32: list[dict[str, Any]], int8: list[dict[str, Any]]) -> dict[str, Any]:
    """Greedy agreement of the int8 goldens with the float32 ones, prompt by prompt: identical
    continuations, and tokens equal before the first divergence (after it, the two condition
    on different text, so later tokens say nothing more)."""
    per_prompt = []
    for expected, got in zip(fp32, int8, strict=True):
        a, b = list(expected["token_ids"]), list(got["token_ids"])
        agreeing = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        per_prompt.append(
            {"prompt": expected["prompt"], "identical": a == b, "tokens_agreeing": agreeing, "tokens": len(a)}
        )
    tokens = sum(p["tokens"] for p in per_prompt)
    agreeing = sum(p["tokens_agreeing"] for p in per_prompt)
    return {
        "prompts": len(per_prompt),
        "identical": sum(1 for p in per_prompt if p["identical"]),
        "tokens": tokens,
        "tokens_agreeing": agreeing,
        "token_agreement": agreeing / tokens if tokens else 1.0,
        "per_prompt": per_prompt,
    }
