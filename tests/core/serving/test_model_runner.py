"""The cached forward and the model runner against the no-cache reference forward."""

from __future__ import annotations

import torch

from aieng_core.model.llama import LlamaConfig, LlamaForCausalLM
from aieng_core.serving.kv_cache import KVCachePool
from aieng_core.serving.model_runner import ModelRunner
from aieng_core.serving.request import Request, SamplingParams, StepPlan

CONFIG = LlamaConfig(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=48,
)


def _model() -> LlamaForCausalLM:
    torch.manual_seed(1)
    return LlamaForCausalLM(CONFIG).eval()


def _admit(pool: KVCachePool, name: str, prompt: list[int]) -> Request:
    request = Request(name, prompt, SamplingParams(max_new_tokens=8))
    request.slot = pool.allocate(name)
    return request


def _prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(2)
    return [torch.randint(2, 300, (n,), generator=generator).tolist() for n in (7, 1, 19, 4)]


def test_prefill_of_right_padded_prompts_gives_each_prompts_own_next_token_logits() -> None:
    model, pool = _model(), KVCachePool.for_model(CONFIG, max_batch=4, max_context=48)
    runner = ModelRunner(model, pool)
    prompts = _prompts()
    requests = [_admit(pool, f"r{n}", p) for n, p in enumerate(prompts)]
    logits = runner.prefill_logits(requests)
    assert logits.shape == (4, 300)
    for row, prompt in enumerate(prompts):
        reference, _ = model(torch.tensor([prompt]))
        torch.testing.assert_close(logits[row], reference[0, -1], rtol=1e-4, atol=1e-5)


def test_decode_steps_at_different_positions_match_the_reference_and_generate_greedy() -> None:
    model, pool = _model(), KVCachePool.for_model(CONFIG, max_batch=6, max_context=48)
    runner = ModelRunner(model, pool)
    prompts = _prompts()
    requests = [_admit(pool, f"r{n}", p) for n, p in enumerate(prompts)]
    # Admitted in two waves, so the sequences decode at different positions in one batch.
    for wave in (requests[:2], requests[2:]):
        for request, row in zip(wave, runner.prefill_logits(wave), strict=True):
            request.output_ids.append(int(row.argmax()))
    for _ in range(10):
        for request, row in zip(requests, runner.decode_logits(requests), strict=True):
            reference, _ = model(torch.tensor([request.prompt_ids + request.output_ids]))
            torch.testing.assert_close(row, reference[0, -1], rtol=1e-4, atol=1e-5)
            request.output_ids.append(int(row.argmax()))
    for request in requests:
        expected = model.generate_greedy(torch.tensor([request.prompt_ids]), 11)[0, request.num_prompt_tokens :]
        assert request.output_ids == expected.tolist()


def test_a_decode_step_never_writes_into_a_slot_that_is_not_decoding() -> None:
    model, pool = _model(), KVCachePool.for_model(CONFIG, max_batch=4, max_context=48)
    runner = ModelRunner(model, pool)
    prompts = _prompts()
    requests = [_admit(pool, f"r{n}", p) for n, p in enumerate(prompts)]
    for request, row in zip(requests, runner.prefill_logits(requests), strict=True):
        request.output_ids.append(int(row.argmax()))
    idle = requests[1]  # slot 1 sits between decoding slots 0 and 2
    before = [(k[idle.slot, :, :48].clone(), v[idle.slot, :, :48].clone()) for k, v in zip(pool.keys, pool.values)]
    runner.decode_logits([requests[0], requests[2]])
    for (k, v), (k0, v0) in zip(zip(pool.keys, pool.values), before, strict=True):
        assert torch.equal(k[idle.slot, :, :48], k0) and torch.equal(v[idle.slot, :, :48], v0)


def test_run_turns_a_step_plan_into_one_sampled_token_per_request_in_plan_order() -> None:
    model, pool = _model(), KVCachePool.for_model(CONFIG, max_batch=4, max_context=48)
    runner = ModelRunner(model, pool)
    prompts = _prompts()
    first = [_admit(pool, f"r{n}", p) for n, p in enumerate(prompts[:2])]
    result = runner.run(StepPlan(prefill=tuple(first)))
    assert result.prefill_tokens == 7 + 1 and result.decode_tokens == 0
    for request, token in zip(first, result.tokens, strict=True):
        request.output_ids.append(token)
    second = [_admit(pool, f"r{n + 2}", p) for n, p in enumerate(prompts[2:])]
    result = runner.run(StepPlan(prefill=tuple(second), decode=tuple(first)))
    assert len(result.tokens) == 4 and result.prefill_tokens == 19 + 4 and result.decode_tokens == 2
    for request, token in zip([*second, *first], result.tokens, strict=True):
        reference, _ = model(torch.tensor([request.prompt_ids + request.output_ids]))
        assert token == int(reference[0, -1].argmax())
