"""The KV-cache pool: allocated once, explicit ownership, lowest slot first. No model needed."""

from __future__ import annotations

import pytest
import torch

from aieng_core.model.llama import LlamaConfig
from aieng_core.serving.kv_cache import KVCachePool


def test_the_pool_is_allocated_once_with_the_size_it_reports() -> None:
    pool = KVCachePool(num_layers=3, max_batch=4, num_kv_heads=2, max_context=10, head_dim=8)
    assert len(pool.keys) == len(pool.values) == 3
    # max_context positions plus one scratch position per slot.
    assert pool.keys[0].shape == (4, 2, 11, 8)
    assert pool.nbytes == 2 * 3 * 4 * 2 * 11 * 8 * 4
    assert all(torch.count_nonzero(t) == 0 for t in pool.keys + pool.values)


def test_slots_are_owned_from_allocate_to_free_and_the_lowest_free_slot_comes_first() -> None:
    pool = KVCachePool(num_layers=1, max_batch=3, num_kv_heads=1, max_context=4, head_dim=2)
    storage = [t.data_ptr() for t in pool.keys + pool.values]
    assert [pool.allocate("a"), pool.allocate("b"), pool.allocate("c")] == [0, 1, 2]
    assert pool.free_slots == 0 and pool.owner(1) == "b" and pool.highest_used() == 2
    with pytest.raises(RuntimeError, match="no free KV-cache slot"):
        pool.allocate("d")
    pool.free(1)
    pool.free(0)
    assert pool.owner(1) is None and pool.free_slots == 2
    assert pool.allocate("e") == 0  # lowest first keeps the slots in use packed
    with pytest.raises(RuntimeError, match="not allocated"):
        pool.free(1)
    with pytest.raises(RuntimeError, match="not allocated"):
        pool.free(7)
    # No allocation ever happened after construction: the same storage throughout.
    assert [t.data_ptr() for t in pool.keys + pool.values] == storage


def test_a_pool_for_a_model_takes_its_shape_and_refuses_a_context_longer_than_the_model() -> None:
    config = LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        max_position_embeddings=32,
    )
    pool = KVCachePool.for_model(config, max_batch=5, max_context=32)
    assert pool.keys[1].shape == (5, 2, 33, 16)
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings 32"):
        KVCachePool.for_model(config, max_batch=5, max_context=33)
