"""Generation throughput side by side: peers generating the same number of tokens from
prompts of the same length, in the same process, warmed up, repeated with the order
alternated, reported as the median tokens/s with its spread.

A peer is a function `generate(prompts, new_tokens) -> generated ids per prompt`: our engine
(ignore_eos: every request runs to new_tokens), transformers `generate` (greedy, use_cache,
no EOS token: every row runs to max_new_tokens), or our engine on another model.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPEATS = 3  # timed runs per peer; the order of the peers alternates between runs
WARMUP_NEW_TOKENS = 2  # each peer runs the same prompts once, briefly, before it is timed

# Prompts are cut from this text as each model's tokenizer encodes it: the same words for
# every model, whatever its vocabulary. Speed with ignore_eos does not depend on the words.
PROMPT_TEXT = (
    "The data pipeline lands raw text every day, cleans it, trains a tokenizer and a language model, "
    "measures the model and serves it. 数据清洗之后, 模型被训练、评测并部署。 Once upon a time a model "
    "was trained on a laptop, benchmarked against its peers and promoted to production."
)

Generate = Callable[[list[list[int]], int], list[list[int]]]


def benchmark_prompts(
    encode: Callable[[str], list[int]], eos_token_id: int, count: int, length: int
) -> list[list[int]]:
    """`count` distinct prompts of exactly `length` token ids: windows of PROMPT_TEXT's tokens
    (repeated as needed), each starting one token after the one before. No EOS inside."""
    filler = [token for token in encode(PROMPT_TEXT) if token != eos_token_id]
    if not filler:
        raise ValueError("the benchmark prompt text encodes to no tokens")
    stream = filler * ((count + length) // len(filler) + 1)
    return [stream[start : start + length] for start in range(count)]


def engine_generate(engine: Any) -> Generate:
    """Our engine as a peer: the prompts batched as the server would, greedy, ignore_eos."""
    from aieng_core.serving.request import SamplingParams

    def generate(prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        outputs = engine.generate(prompts, SamplingParams(max_new_tokens=new_tokens, ignore_eos=True))
        return [list(output.token_ids) for output in outputs]

    return generate


def load_transformers_model(model_dir: Path) -> Any:
    """transformers' LlamaForCausalLM on our files (config.json + model.safetensors), on CPU."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa", use_safetensors=True).eval()
    # No EOS token: every row runs to max_new_tokens (as our ignore_eos), with no extra logits processor.
    model.generation_config.eos_token_id = None
    return model


def transformers_generate(model: Any, pad_token_id: int) -> Generate:
    """transformers `generate` as a peer: greedy, KV cache on, the prompts as one batch (all of
    one length, so no padding), on the model's device."""
    import torch

    @torch.inference_mode()
    def generate(prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        ids = torch.tensor(prompts, device=model.device)
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            do_sample=False,
            use_cache=True,
            pad_token_id=pad_token_id,
        )
        return out[:, ids.shape[1] :].tolist()

    return generate


def side_by_side(
    peers: dict[str, tuple[Generate, list[list[int]]]], new_tokens: int, repeats: int = REPEATS
) -> tuple[dict[str, dict[str, Any]], dict[str, list[list[int]]]]:
    """Time each peer (name -> (generate, its prompts)) `repeats` times, alternating the order;
    every request must get exactly `new_tokens`. Returns each peer's figures and the ids it
    generated in its last run."""
    for generate, prompts in peers.values():
        generate(prompts, WARMUP_NEW_TOKENS)
    names = list(peers)
    rates: dict[str, list[float]] = {name: [] for name in names}
    outputs: dict[str, list[list[int]]] = {}
    for repeat in range(repeats):
        for name in names if repeat % 2 == 0 else names[::-1]:
            generate, prompts = peers[name]
            started = time.perf_counter()
            generated = generate(prompts, new_tokens)
            seconds = time.perf_counter() - started
            got = [len(ids) for ids in generated]
            if got != [new_tokens] * len(prompts):
                raise RuntimeError(f"{name} generated {got} tokens per request where {new_tokens} were asked for")
            rates[name].append(sum(got) / seconds)
            outputs[name] = generated
    figures = {
        name: {
            "requests": len(peers[name][1]),
            "tokens": new_tokens * len(peers[name][1]),
            "tokens_per_second": statistics.median(runs),
            "min_tokens_per_second": min(runs),
            "max_tokens_per_second": max(runs),
            "runs": runs,
        }
        for name, runs in rates.items()
    }
    return figures, outputs


def matching(ours: list[list[int]], theirs: list[list[int]]) -> int:
    """How many requests got the same token ids from both peers."""
    return sum(a == b for a, b in zip(ours, theirs, strict=True))
