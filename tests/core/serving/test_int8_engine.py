"""The engine on an int8 variant's model (model/int8_weights.py): greedy tokens equal to the
model's own uncached loop, a request's tokens independent of what shares its batch (what the
rejected dynamic int8 matmuls broke), and its decode steps captured like float32's."""

from __future__ import annotations

import pytest
import torch

from aieng_core.model.int8_weights import is_int8_model, quantized_copy
from aieng_core.serving.engine import Engine, EngineLimits
from aieng_core.serving.request import SamplingParams
from aieng_core.serving.step_graphs import StepGraphSettings

LIMITS = EngineLimits(max_batch=8, max_context=64, max_waiting=8, max_prefill_tokens=16)


@pytest.fixture(scope="module")
def int8(tiny_model):
    model = quantized_copy(tiny_model)
    assert is_int8_model(model) and not is_int8_model(tiny_model)
    return model


def prompts(vocab: int, count: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    # Different lengths, one longer than a prefill chunk.
    return [torch.randint(1, vocab, (5 + 7 * row,), generator=generator).tolist() for row in range(count)]


@pytest.mark.parametrize("batch", [1, 5])
def test_greedy_matches_the_int8_models_own_loop(int8, tiny_tokenizer, batch) -> None:
    engine = Engine(int8, tiny_tokenizer, LIMITS, int8.config.eos_token_id)
    asked = prompts(int8.config.vocab_size, batch, batch)
    outputs = engine.generate(asked, SamplingParams(max_new_tokens=10, ignore_eos=True))
    with torch.no_grad():
        expected = [int8.generate_greedy(torch.tensor([p]), 10)[0, len(p) :].tolist() for p in asked]
    assert [list(output.token_ids) for output in outputs] == expected


def alone_and_batched(model, tokenizer) -> list[tuple[list[int], list[int]]]:
    """(tokens alone, tokens among 7 other requests) of one prompt, greedy and then seeded."""
    engine = Engine(model, tokenizer, LIMITS, model.config.eos_token_id)
    prompt = prompts(model.config.vocab_size, 1, 99)[0]
    greedy = SamplingParams(max_new_tokens=12, ignore_eos=True)
    sampled = SamplingParams(max_new_tokens=12, ignore_eos=True, temperature=0.9, top_p=0.9, seed=7)
    pairs = []
    for params in (greedy, sampled):
        [alone] = engine.generate([prompt], params)
        others = prompts(model.config.vocab_size, 7, 3)
        together = engine.generate([*others, prompt], [*[greedy] * 7, params])
        pairs.append((list(alone.token_ids), list(together[-1].token_ids)))
    return pairs


def test_a_requests_tokens_do_not_depend_on_what_shares_its_batch(int8, tiny_tokenizer) -> None:
    for alone, batched in alone_and_batched(int8, tiny_tokenizer):
        assert batched == alone


def test_the_dropped_dynamic_int8_method_fails_that_check(tiny_model, tiny_tokenizer) -> None:
    """torch's dynamic int8 Linear scales the activations per batch: the same prompt gets other
    tokens among other requests, which is why the variant is weight-only."""
    import copy
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dynamic = torch.ao.quantization.quantize_dynamic(copy.deepcopy(tiny_model), {torch.nn.Linear}, torch.qint8)
        pairs = alone_and_batched(dynamic, tiny_tokenizer)
    assert any(alone != batched for alone, batched in pairs)


def test_its_decode_steps_are_captured_like_float32s(int8, tiny_tokenizer, tmp_path) -> None:
    settings = StepGraphSettings(mode="compile", cache_dir=tmp_path)
    limits = EngineLimits(max_batch=2, max_context=64, max_waiting=4, max_prefill_tokens=16)
    engine = Engine(int8, tiny_tokenizer, limits, int8.config.eos_token_id, settings, bundle_key="int8-test")
    figures = engine.warmup([8])["step_graphs"]
    assert figures["captured_buckets"] == [1, 2]
    eager = Engine(int8, tiny_tokenizer, limits, int8.config.eos_token_id)
    asked = prompts(int8.config.vocab_size, 2, 5)
    params = SamplingParams(max_new_tokens=10, ignore_eos=True)
    captured = [list(o.token_ids) for o in engine.generate(asked, params)]
    assert engine.runner.captured_steps > 0
    assert captured == [list(o.token_ids) for o in eager.generate(asked, params)]
