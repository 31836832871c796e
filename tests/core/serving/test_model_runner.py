"""The cached forward and the model runner against the no-cache reference forward."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from aieng_core.model.decode_attention import _fused_decode_attention, decode_attention
from aieng_core.model.llama import (
    LlamaConfig,
    LlamaForCausalLM,
    apply_rotary,
    apply_rotary_signed,
    rotary_tables,
    signed_sin,
)
from aieng_core.serving.kv_cache import KVCachePool
from aieng_core.serving.model_runner import ModelRunner
from aieng_core.serving.request import NO_TOKEN, Request, SamplingParams, StepPlan

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
    """Admitted with its whole prompt as this step's chunk (as the scheduler plans a prompt
    that fits the budget)."""
    request = Request(name, prompt, SamplingParams(max_new_tokens=8))
    request.slot = pool.allocate(name)
    _chunk(request, len(prompt))
    return request


def _chunk(request: Request, length: int) -> None:
    request.prefill_start, request.prefill_length = request.num_prefilled, length
    request.num_prefilled += length


def _prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(2)
    return [torch.randint(2, 300, (n,), generator=generator).tolist() for n in (7, 1, 19, 4)]


def test_a_packed_prefill_gives_each_prompts_own_next_token_logits() -> None:
    model, pool = _model(), KVCachePool.for_model(CONFIG, max_batch=4, max_context=48)
    runner = ModelRunner(model, pool)
    prompts = _prompts()
    requests = [_admit(pool, f"r{n}", p) for n, p in enumerate(prompts)]
    logits = runner.prefill_logits(requests)
    assert logits.shape == (4, 300)
    for row, prompt in enumerate(prompts):
        reference, _ = model(torch.tensor([prompt]))
        torch.testing.assert_close(logits[row], reference[0, -1], rtol=1e-4, atol=1e-5)


def test_prompts_prefilled_in_chunks_beside_whole_ones_match_the_reference() -> None:
    """Chunks of 5 tokens, each attending to its prompt's cached start and then itself, packed
    beside a whole prompt and beside each other: the same logits as the no-cache reference, and
    the same cache contents as the whole prompt prefilled at once."""
    model = _model()
    chunked_pool, whole_pool = (KVCachePool.for_model(CONFIG, max_batch=4, max_context=48) for _ in range(2))
    chunked, whole = ModelRunner(model, chunked_pool), ModelRunner(model, whole_pool)
    prompts = _prompts()  # lengths 7, 1, 19, 4
    long_a = Request("long-a", prompts[2], SamplingParams(max_new_tokens=8))
    long_b = Request("long-b", prompts[0] + prompts[3], SamplingParams(max_new_tokens=8))  # 11 tokens
    for request in (long_a, long_b):
        request.slot = chunked_pool.allocate(request.request_id)
    short = Request("short", prompts[1], SamplingParams(max_new_tokens=8))
    short.slot = chunked_pool.allocate("short")
    logits: dict[str, torch.Tensor] = {}
    for step in range(4):  # 19 tokens in chunks of 5
        planned = [r for r in (long_a, long_b) if r.num_prefilled < r.num_prompt_tokens]
        for request in planned:
            _chunk(request, min(5, request.num_prompt_tokens - request.num_prefilled))
        if step == 1:  # a whole one-token prompt packed between the chunks
            _chunk(short, 1)
            planned.insert(1, short)
        rows = chunked.prefill_logits(planned)
        completing = [r for r in planned if r.prefill_completes]
        assert rows.shape == (len(completing), CONFIG.vocab_size)
        logits.update({r.request_id: row for r, row in zip(completing, rows, strict=True)})
    assert sorted(logits) == ["long-a", "long-b", "short"]
    for request in (long_a, long_b, short):
        reference, _ = model(torch.tensor([request.prompt_ids]))
        torch.testing.assert_close(logits[request.request_id], reference[0, -1], rtol=1e-4, atol=1e-5)
    for request in (long_a, long_b):
        again = _admit(whole_pool, request.request_id, request.prompt_ids)
        whole.prefill_logits([again])
        length = request.num_prompt_tokens
        for cache in ("keys", "values"):
            for layer in range(CONFIG.num_hidden_layers):
                torch.testing.assert_close(
                    getattr(chunked_pool, cache)[layer][request.slot, :, :length],
                    getattr(whole_pool, cache)[layer][again.slot, :, :length],
                    rtol=1e-5,
                    atol=1e-6,
                )


def test_the_last_chunk_of_a_prompt_samples_the_same_first_token_as_a_whole_prefill() -> None:
    model = _model()
    pool = KVCachePool.for_model(CONFIG, max_batch=2, max_context=48)
    runner = ModelRunner(model, pool)
    prompt = _prompts()[2]
    request = Request("r", prompt, SamplingParams(max_new_tokens=8))
    request.slot = pool.allocate("r")
    tokens = []
    for length in (6, 6, 7):
        _chunk(request, length)
        tokens += runner.prefill([request])
    reference, _ = model(torch.tensor([prompt]))
    assert tokens == [NO_TOKEN, NO_TOKEN, int(reference[0, -1].argmax())]


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


def test_signed_rotary_equals_the_reference_rotary_exactly() -> None:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(5, 6, CONFIG.head_dim, generator=generator)
    cos, sin = rotary_tables(CONFIG, torch.tensor([0, 3, 17, 40, 47]), torch.float32)
    cos, sin = cos[:, None], sin[:, None]
    # x * cos + rotate_half(x) * sin, one fused multiply-add apart at most.
    torch.testing.assert_close(
        apply_rotary_signed(x, cos, signed_sin(sin)), apply_rotary(x, cos, sin), rtol=0, atol=1e-6
    )
    # Position 0 (cos 1, sin 0) leaves x unchanged; a quarter turn (cos 0, sin 1) is rotate_half exactly.
    assert torch.equal(apply_rotary_signed(x, torch.ones_like(cos), signed_sin(torch.zeros_like(sin))), x)
    half = CONFIG.head_dim // 2
    quarter = apply_rotary_signed(x, torch.zeros_like(cos), signed_sin(torch.ones_like(sin)))
    assert torch.equal(quarter, torch.cat((-x[..., half:], x[..., :half]), dim=-1))


def test_decode_attention_equals_masked_scaled_dot_product_attention_with_grouped_heads() -> None:
    generator = torch.Generator().manual_seed(4)
    batch, heads, kv_heads, length, head_dim = 3, 8, 2, 9, 16
    q = torch.randn(batch, heads, head_dim, generator=generator)
    keys = torch.randn(batch, kv_heads, length, head_dim, generator=generator)
    values = torch.randn(batch, kv_heads, length, head_dim, generator=generator)
    lengths = torch.tensor([9, 1, 5])
    sees = torch.arange(length)[None, :] < lengths[:, None]
    bias = torch.zeros(batch, length).masked_fill(~sees, float("-inf"))
    grouped_bias = bias[:, None, None].expand(batch, kv_heads, heads // kv_heads, length).flatten(0, 1)
    ours = decode_attention(q, keys, values, grouped_bias)
    reference = F.scaled_dot_product_attention(
        q[:, :, None], keys, values, attn_mask=sees[:, None, None, :], enable_gqa=True
    )
    torch.testing.assert_close(ours, reference.reshape(batch, heads * head_dim), rtol=1e-5, atol=1e-6)
    # Row 1 sees only position 0: its output is exactly that position's values, per kv head.
    expected = values[1, :, 0].repeat_interleave(heads // kv_heads, dim=0).reshape(-1)
    torch.testing.assert_close(ours[1], expected, rtol=0, atol=1e-6)
    # The form the captured graphs compile (reductions, not matmuls) computes the same.
    fused = _fused_decode_attention(q, keys, values, grouped_bias)
    torch.testing.assert_close(fused, reference.reshape(batch, heads * head_dim), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fused[1], expected, rtol=0, atol=1e-6)


def test_the_runner_lays_weights_out_column_major_in_place_without_changing_a_value() -> None:
    model = _model()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    linear_weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    runner = ModelRunner(model, KVCachePool.for_model(CONFIG, max_batch=1, max_context=48))
    assert runner.model is model
    for weight in linear_weights:
        assert weight.t().is_contiguous() and not weight.is_contiguous()
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied
    after = model.state_dict()
    assert before.keys() == after.keys()
    for name, tensor in before.items():
        assert torch.equal(after[name], tensor), name
