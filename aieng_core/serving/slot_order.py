"""Decoding rows kept in length order, so each attention group attends little padding.

A decode step's attention groups are runs of consecutive slots (model/decode_attention.py), each
attending up to its longest row. Slots are handed out as they free up, so a new, short
sequence lands wherever a finished one was, beside long ones. Before a decode step the runner
asks `regroup` whether to re-seat the decoding requests among the slots they already hold:
the longest in the first group, the shortest in the last. Only a request in the wrong group
moves, and within a group the order is free, so a new arrival usually moves one request per
group boundary, not every row below it.

A move copies the request's cached keys and values (read once, written once, where
attention only reads them), so the runner re-seats only when the positions the step stops
attending, counted over PAYBACK_STEPS steps, outweigh twice the positions copied. Lengths
grow by one each step together, so the order holds until requests arrive or leave, and the
saving lasts well beyond those steps. Prefilling requests keep their slots (their rows run
idle in the decode step); which slot a request holds never changes its tokens, only the last
bits of its logits (a longer padded length sums more exact zeros).
"""

from __future__ import annotations

from collections.abc import Sequence

from aieng_core.model.decode_attention import attention_cells, group_of_rows
from aieng_core.serving.kv_cache import KVCachePool
from aieng_core.serving.request import Request

PAYBACK_STEPS = 4


def step_lengths(requests: Sequence[Request], rows: int) -> list[int]:
    """Each row's attended length in a decode step of `rows` rows: a request's its own (its
    tokens), a row with no decoding request 1 (an idle row sees position 0)."""
    lengths = [1] * rows
    for request in requests:
        lengths[_slot(request)] = request.num_tokens
    return lengths


def regroup(pool: KVCachePool, requests: Sequence[Request], sizes: Sequence[int]) -> int:
    """Re-seat the decoding `requests` by length among their own slots when it pays (see the
    module's docstring); the number of requests moved. `sizes`: the step's attention groups."""
    if len(sizes) == 1:  # one group: every seat is as good as another
        return 0
    rows = sum(sizes)
    group = group_of_rows(sizes)
    slots = sorted(_slot(r) for r in requests)
    # Longest first; among equals, the lower slot first, so equals stay where they are.
    ranked = sorted(requests, key=lambda r: (-r.num_tokens, _slot(r)))
    target = {id(r): group[slot] for r, slot in zip(ranked, slots, strict=True)}
    movers = [r for r in requests if group[_slot(r)] != target[id(r)]]
    if not movers:
        return 0
    # The movers' slots, refilled group by group: each mover takes a slot of its target group.
    open_slots: dict[int, list[int]] = {}
    for slot in sorted(_slot(r) for r in movers):
        open_slots.setdefault(group[slot], []).append(slot)
    seats = [(r, open_slots[target[id(r)]].pop()) for r in movers]

    before = step_lengths(requests, rows)
    after = list(before)
    for request, slot in seats:
        after[slot] = request.num_tokens
    saved = attention_cells(before, sizes) - attention_cells(after, sizes)
    copied = sum(r.num_tokens - 1 for r in movers)  # positions cached so far
    if saved * PAYBACK_STEPS <= 2 * copied:
        return 0
    pool.move([_slot(r) for r, _ in seats], [slot for _, slot in seats], max(r.num_tokens - 1 for r in movers))
    for request, slot in seats:
        request.slot = slot
    return len(seats)


def _slot(request: Request) -> int:
    if request.slot is None:
        raise RuntimeError(f"request {request.request_id} is scheduled but holds no KV-cache slot")
    return request.slot
