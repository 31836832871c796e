"""Decode attention in groups of rows, each attending up to its own longest row
(model/decode_attention.py), and decoding requests re-seated by length when that pays
(serving/slot_order.py): the group shapes, which requests move and with which keys, when
nothing moves, and that the engine's tokens do not change."""

from __future__ import annotations

import pytest
import torch

from aieng_core.model.decode_attention import attention_cells, group_lengths, group_of_rows, group_sizes
from aieng_core.serving.kv_cache import KVCachePool
from aieng_core.serving.request import Request, SamplingParams
from aieng_core.serving.slot_order import regroup, step_lengths
from tests.core.serving.test_engine import _mixed_prompts

POSITIONS = 128


def test_group_sizes_split_rows_into_at_most_four_near_equal_groups_of_at_least_min_rows() -> None:
    assert group_sizes(1) == (1,)
    assert group_sizes(31) == (31,)
    assert group_sizes(32) == (16, 16)
    assert group_sizes(37) == (19, 18)
    assert group_sizes(64) == (16, 16, 16, 16)
    assert group_sizes(150) == (38, 38, 37, 37)
    assert group_sizes(4, min_rows=1) == (1, 1, 1, 1)
    assert group_sizes(4, min_rows=2) == (2, 2)
    assert group_of_rows((2, 1, 3)) == [0, 0, 1, 2, 2, 2]
    with pytest.raises(ValueError, match="at least one row"):
        group_sizes(0)


def test_each_group_attends_its_longest_row_and_the_cells_count_its_padding() -> None:
    lengths = [90, 10, 40, 30, 1, 1]
    assert group_lengths(lengths, (2, 2, 2)) == [90, 40, 1]
    assert group_lengths(lengths, (2, 2, 2), minimum=2) == [90, 40, 2]
    assert attention_cells(lengths, (2, 2, 2)) == 2 * 90 + 2 * 40 + 2 * 1
    assert attention_cells(lengths, (6,)) == 6 * 90  # one group: every row up to the longest
    with pytest.raises(ValueError, match="5 row lengths for groups of 6 rows"):
        group_lengths(lengths[:5], (2, 2, 2))


def _pool(rows: int) -> KVCachePool:
    return KVCachePool(num_layers=2, max_batch=rows, num_kv_heads=2, max_context=POSITIONS, head_dim=4)


def _decoding(pool: KVCachePool, lengths: list[int]) -> list[Request]:
    """A decoding request per length, slot i holding lengths[i]; every cached key and value of
    slot i is i + 1 (the marker that must travel with its request)."""
    requests = []
    for slot, length in enumerate(lengths):
        request = Request(f"r{slot}", [5] * (length - 1), SamplingParams(max_new_tokens=8))
        request.output_ids = [7]
        request.slot = pool.allocate(request.request_id)
        assert request.slot == slot and request.num_tokens == length
        for tensor in (*pool.keys, *pool.values):
            tensor[slot, :, : length - 1] = slot + 1
        requests.append(request)
    return requests


def test_interleaved_lengths_are_re_seated_by_group_with_their_keys_and_only_misplaced_rows_move() -> None:
    pool = _pool(8)
    # Long and short interleaved, as slots freed by short requests take long ones: every
    # group of two attends up to a long row.
    lengths = [100, 10, 90, 10, 80, 10, 70, 10]
    requests = _decoding(pool, lengths)
    sizes = (2, 2, 2, 2)
    assert attention_cells(step_lengths(requests, 8), sizes) == 2 * (100 + 90 + 80 + 70)

    moved = regroup(pool, requests, sizes)

    # 100 and 90 in group 0, 80 and 70 in group 1, the short ones after them. The 100 in
    # slot 0 and the 10 in slot 7 are already in their groups: six move, two stay.
    assert moved == 6
    seated = step_lengths(requests, 8)
    assert [max(seated[i : i + 2]) for i in range(0, 8, 2)] == [100, 80, 10, 10]
    assert attention_cells(seated, sizes) == 2 * (100 + 80 + 10 + 10)
    assert requests[0].slot == 0 and requests[7].slot == 7
    assert sorted(r.slot for r in requests) == list(range(8))
    for marker, request in enumerate(requests, start=1):
        assert pool.owner(request.slot) == request.request_id
        for tensor in (*pool.keys, *pool.values):
            assert torch.all(tensor[request.slot, :, : request.num_tokens - 1] == marker), request.request_id
    assert regroup(pool, requests, sizes) == 0  # in order now: nothing more moves


def test_nothing_moves_when_the_attention_saved_does_not_pay_for_the_keys_copied() -> None:
    pool = _pool(4)
    # Swapping slots 1 and 2 saves 2 * (101 - 100) positions a step and copies 200.
    requests = _decoding(pool, [101, 100, 101, 100])
    assert regroup(pool, requests, (2, 2)) == 0
    assert [r.slot for r in requests] == [0, 1, 2, 3]
    # A new short request beside the longest changes no group's length: no move either.
    pool = _pool(4)
    requests = _decoding(pool, [90, 3, 60, 60])
    assert regroup(pool, requests, (2, 2)) == 0
    assert [r.slot for r in requests] == [0, 1, 2, 3]


def test_prefilling_and_free_slots_stay_where_they_are() -> None:
    pool = _pool(6)
    requests = _decoding(pool, [10, 10, 90, 90])
    waiting = Request("prefilling", [5] * 30, SamplingParams(max_new_tokens=8))
    waiting.slot = pool.allocate(waiting.request_id)  # slot 4, no output yet: not decoding
    moved = regroup(pool, requests, (3, 3))
    assert moved == 2
    assert sorted(r.slot for r in requests) == [0, 1, 2, 3]  # only among their own slots
    assert waiting.slot == 4 and pool.owner(4) == "prefilling" and pool.owner(5) is None


def test_a_move_must_permute_allocated_slots() -> None:
    pool = _pool(4)
    _decoding(pool, [10, 20])
    with pytest.raises(ValueError, match="must permute"):
        pool.move([0], [1], 5)
    with pytest.raises(RuntimeError, match="only allocated slots"):
        pool.move([1, 2], [2, 1], 5)


def test_greedy_tokens_do_not_change_when_requests_are_re_seated(make_engine, tiny_model) -> None:
    engine = make_engine(max_batch=16, max_prefill_tokens=48)  # prompts admitted over several steps
    engine.runner.graphs.min_group_rows = 4  # four groups of four rows
    prompts = _mixed_prompts(engine, 24)  # 24 requests through 16 slots: slots are reused
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    outputs = engine.generate(prompts, params)
    assert engine.runner.moved_rows > 0, "the workload never re-seated a request"
    for prompt, output in zip(prompts, outputs, strict=True):
        expected = tiny_model.generate_greedy(torch.tensor([prompt]), 20)[0, len(prompt) :].tolist()
        assert list(output.token_ids) == expected
