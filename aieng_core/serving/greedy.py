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
