"""Prefix caching: a shared prompt prefix's keys and values are reused, not recomputed; the
tokens are the same with and without it; keys are the bundle's and the blocks' own; LRU keeps
a chain's first blocks longest."""

from __future__ import annotations

import torch

from aieng_core.serving.engine import Engine, EngineLimits
from aieng_core.serving.kv_cache import KVCachePool
from aieng_core.serving.prefix_cache import BLOCK_TOKENS, PrefixCache, _Block
from aieng_core.serving.request import Request, SamplingParams


def _engine(model, tokenizer, prefix_cache_tokens: int, max_prefill_tokens: int = 512, key: str = "b1") -> Engine:
    limits = EngineLimits(max_batch=8, max_context=64, max_waiting=64, max_prefill_tokens=max_prefill_tokens)
    return Engine(
        model, tokenizer, limits, model.config.eos_token_id, bundle_key=key, prefix_cache_tokens=prefix_cache_tokens
    )


SYSTEM = list(range(100, 100 + 2 * BLOCK_TOKENS + 5))  # 37 tokens: two full blocks and 5 more


def _prompts() -> list[list[int]]:
    other_system = [n + 1 for n in SYSTEM]
    return [
        SYSTEM + [7, 8, 9],
        SYSTEM + [300 + n for n in range(6)],
        SYSTEM[:20] + [5, 6],
        [42] * 3,
        other_system + [7, 8, 9],  # the first prompt's end after another prefix: other tokens
        SYSTEM + [7, 8, 9],
    ]


def test_greedy_tokens_are_the_same_with_and_without_the_cache(sensitive_model, tiny_tokenizer) -> None:
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    without = _engine(sensitive_model, tiny_tokenizer, 0)
    expected = [list(without.generate([p], params)[0].token_ids) for p in _prompts()]
    assert len({tuple(e) for e in expected[:5]}) == 5  # distinct: a wrong reuse would show
    for chunk in (512, 8):  # whole prompts per step, and chunked prefill beside the cache
        cached = _engine(sensitive_model, tiny_tokenizer, 1024, max_prefill_tokens=chunk)
        got = [list(cached.generate([p], params)[0].token_ids) for p in _prompts()]
        assert got == expected
        # 2 blocks reused by each later prompt that starts with SYSTEM, 1 by SYSTEM[:20] + [5, 6]
        assert cached.prefix_cache.stats.hit == 2 * BLOCK_TOKENS + BLOCK_TOKENS + 2 * BLOCK_TOKENS
        assert cached.prefix_cache.stats.queried == sum(len(p) for p in _prompts())
    assert without.prefix_cache.stats.queried == 0 and not without.prefix_cache.enabled


def test_a_hit_prefills_only_the_rest_of_the_prompt(sensitive_model, tiny_tokenizer) -> None:
    engine = _engine(sensitive_model, tiny_tokenizer, 1024)
    params = SamplingParams(max_new_tokens=1, ignore_eos=True)
    prompt = SYSTEM + [7, 8, 9]
    engine.generate([prompt], params)
    assert engine.last_step is not None and engine.last_step.prefill_tokens == len(prompt)
    engine.generate([prompt], params)
    assert engine.last_step.prefill_tokens == len(prompt) - 2 * BLOCK_TOKENS
    assert engine.prefix_cache.cached_blocks == 2


def test_the_last_prompt_token_is_always_computed(sensitive_model, tiny_tokenizer) -> None:
    engine = _engine(sensitive_model, tiny_tokenizer, 1024)
    params = SamplingParams(max_new_tokens=4, ignore_eos=True)
    prompt = SYSTEM[: 2 * BLOCK_TOKENS]  # exactly two blocks
    first = engine.generate([prompt], params)[0]
    again = engine.generate([prompt], params)[0]
    assert again.token_ids == first.token_ids
    # Only the first block is reused: the second holds the last token, whose logits are needed.
    assert engine.prefix_cache.stats.hit == BLOCK_TOKENS
    assert engine.last_step is not None


def test_keys_chain_the_bundle_and_every_token_before_the_block_end(sensitive_model) -> None:
    pool = KVCachePool.for_model(sensitive_model.config, 2, 64)
    one, other = PrefixCache(pool, 64, "bundle-a"), PrefixCache(pool, 64, "bundle-b")
    tokens = list(range(2 * BLOCK_TOKENS))
    changed_late = tokens[:-1] + [999]
    changed_early = [999] + tokens[1:]
    assert len(one.block_keys(tokens)) == 2
    assert len(one.block_keys(tokens[:-1])) == 1  # a partial block has no key
    assert one.block_keys(changed_late)[0] == one.block_keys(tokens)[0]
    assert one.block_keys(changed_late)[1] != one.block_keys(tokens)[1]
    assert not set(one.block_keys(changed_early)) & set(one.block_keys(tokens))  # the chain carries the change
    assert not set(one.block_keys(tokens)) & set(other.block_keys(tokens))  # another bundle, other keys


def _request(pool: KVCachePool, prompt: list[int], slot: int) -> Request:
    request = Request(request_id="r", prompt_ids=prompt, params=SamplingParams(max_new_tokens=1))
    request.slot = slot
    return request


def test_reuse_copies_the_stored_keys_and_values_into_the_slot(sensitive_model) -> None:
    pool = KVCachePool.for_model(sensitive_model.config, 2, 64)
    cache = PrefixCache(pool, 64, "b")
    prompt = list(range(2 * BLOCK_TOKENS + 3))
    for tensor in (*pool.keys, *pool.values):
        tensor[0].normal_()
    cache.store(_request(pool, prompt, 0), len(prompt))
    reader = _request(pool, prompt, 1)
    assert cache.reuse(reader) == 2 * BLOCK_TOKENS
    for tensor in (*pool.keys, *pool.values):
        assert not tensor[1].any()  # found, not yet copied: the step copies it
    cache.load(reader)
    assert reader.prefix_rows == ()
    for tensor in (*pool.keys, *pool.values):
        assert torch.equal(tensor[1, :, : 2 * BLOCK_TOKENS], tensor[0, :, : 2 * BLOCK_TOKENS])
        assert not tensor[1, :, 2 * BLOCK_TOKENS :].any()  # nothing past the reused blocks


def test_a_block_whose_tokens_differ_under_the_same_key_is_never_reused(sensitive_model) -> None:
    # A hash collision, made by hand: the stored block's tokens are not the prompt's.
    pool = KVCachePool.for_model(sensitive_model.config, 2, 64)
    cache = PrefixCache(pool, 64, "b")
    prompt = list(range(BLOCK_TOKENS + 1))
    cache.store(_request(pool, prompt, 0), len(prompt))
    key = cache.block_keys(prompt)[0]
    stored = cache._blocks[key]
    cache._blocks[key] = _Block(stored.index, stored.parent, (0,) * BLOCK_TOKENS)
    assert cache.reuse(_request(pool, prompt, 1)) == 0


def test_eviction_is_least_recently_used_and_keeps_a_chains_first_block_longest(sensitive_model) -> None:
    pool = KVCachePool.for_model(sensitive_model.config, 1, 64)
    cache = PrefixCache(pool, 3 * BLOCK_TOKENS, "b")
    assert cache.num_blocks == 3
    a = list(range(2 * BLOCK_TOKENS + 1))
    b = [500 + n for n in range(BLOCK_TOKENS + 1)]
    c = [700 + n for n in range(BLOCK_TOKENS + 1)]
    for prompt in (a, b, c):  # c needs a row: a's second block goes, its first stays
        cache.store(_request(pool, prompt, 0), len(prompt))
    assert cache.cached_blocks == 3 and cache.stats.evicted_blocks == 1
    assert cache.reuse(_request(pool, a, 0)) == BLOCK_TOKENS
    assert cache.reuse(_request(pool, b, 0)) == BLOCK_TOKENS  # b is older than c but was hit after a
    cache.store(_request(pool, [900 + n for n in range(BLOCK_TOKENS + 1)], 0), BLOCK_TOKENS + 1)
    assert cache.reuse(_request(pool, c, 0)) == 0  # c was the least recently used
    assert cache.stats.hit == 2 * BLOCK_TOKENS


def test_a_prompt_longer_than_the_store_keeps_its_first_blocks(sensitive_model) -> None:
    pool = KVCachePool.for_model(sensitive_model.config, 1, 64)
    cache = PrefixCache(pool, 2 * BLOCK_TOKENS, "b")
    prompt = list(range(3 * BLOCK_TOKENS + 1))
    cache.store(_request(pool, prompt, 0), len(prompt))
    assert cache.cached_blocks == 2
    assert cache.reuse(_request(pool, prompt, 0)) == 2 * BLOCK_TOKENS


def test_reuse_beside_live_decoders_re_seated_by_length_keeps_every_token(sensitive_model, tiny_tokenizer) -> None:
    # 40 slots: decode steps split into attention groups and re-seat rows by length
    # (slot_order.py) while prompts are admitted with cached prefixes, in chunks, and n forks.
    def run(prefix_cache_tokens: int) -> tuple[list[tuple[int, ...]], int, int]:
        limits = EngineLimits(max_batch=40, max_context=64, max_waiting=200, max_prefill_tokens=40)
        engine = Engine(
            sensitive_model, tiny_tokenizer, limits, sensitive_model.config.eos_token_id,
            prefix_cache_tokens=prefix_cache_tokens,
        )  # fmt: skip
        systems = [SYSTEM[:32], [n + 3 for n in SYSTEM[:32]]]
        pending = []
        for n in range(60):
            prompt = systems[n % 2] + [200 + (n * 7 + k) % 150 for k in range(1 + n % 9)]
            params = SamplingParams(max_new_tokens=6 + n % 17, temperature=0.8, seed=n, ignore_eos=True)
            samples = 3 if n % 10 == 0 else 1
            pending.append(engine.prepare_samples(prompt, [(f"r{n}-{s}", params) for s in range(samples)]))
        requests = [r for group in pending for r in group]
        done: dict[int, tuple[int, ...]] = {}
        step = 0
        while pending or engine.has_work:
            if pending and step % 3 == 0:  # several arrive every third step
                for group in pending[:8]:
                    for request in group:
                        engine.enqueue(request)
                del pending[:8]
            for request, output in engine.step():
                if output.finished:
                    done[id(request)] = output.token_ids
            step += 1
        assert engine.pool.free_slots == 40
        return [done[id(r)] for r in requests], engine.runner.moved_rows, engine.prefix_cache.stats.hit

    without, _, _ = run(0)
    cached, moved, hit = run(4096)
    assert cached == without
    assert moved > 0 and hit > 0  # both paths were taken
