"""Golden outputs: greedy continuations recorded by the serving engine when a bundle is built
(serving/greedy.py), and replayed here when it is verified or loaded.

They are recorded by the engine itself (not by the model's reference loop), so a replay
checks exactly what will serve: weights, tokenizer, cache, batching and detokenizer together.
Greedy decoding is deterministic for fixed kernels, but CPU reductions split their work by
thread count, so both recording and replay run on CPU with the thread count recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aieng_core.serving.engine import Engine

GOLDEN_DEVICE = "cpu"


def replay_goldens(engine: Engine, golden: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Generate each recorded prompt again; one result per golden, `ok` when the prompt
    encodes to the same ids and the continuation has the same token ids."""
    from aieng_core.serving.request import SamplingParams

    if not golden:
        return []
    params = [SamplingParams(max_new_tokens=int(entry["max_new_tokens"])) for entry in golden]
    outputs = engine.generate([entry["prompt"] for entry in golden], params)
    results = []
    for entry, output in zip(golden, outputs):
        same_prompt = engine.encode(entry["prompt"]) == list(entry["prompt_ids"])
        results.append(
            {
                "prompt": entry["prompt"],
                "ok": same_prompt and list(output.token_ids) == list(entry["token_ids"]),
                "prompt_ids_match": same_prompt,
                "expected_token_ids": list(entry["token_ids"]),
                "got_token_ids": list(output.token_ids),
                "expected_text": entry["text"],
                "got_text": output.text,
            }
        )
    return results
