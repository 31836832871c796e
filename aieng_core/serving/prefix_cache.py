"""Prefix caching: the keys and values of prompt prefixes already computed, reused, not recomputed.

Chat requests repeat their system prompt; a prompt list or `n` samples of templated prompts
repeat whole headers. The cache keeps the KV of full blocks of `BLOCK_TOKENS` prompt tokens in
a store of its own, allocated once beside the pool (its size is `serving.prefix_cache_tokens`).
When a request takes a slot, the longest run of its leading blocks found in the store is
counted as prefilled (the scheduler prefills only the rest) and copied into the slot at the
start of the step, before any prefill. After
every prefill chunk, the prompt's newly completed blocks are copied into the store.

Keys. A block's key is a SHA-256 chain: the bundle key (the bundle's content-hashed id), the
key of the block before it, and the block's token ids. Two prompts share a block's key only
when they share every token up to its end, under the same bundle: the store is the engine's
own (a swapped bundle gets a new engine, and its store starts empty), and should one ever be
shared its keys would still keep bundles apart. The store also keeps each block's tokens and
parent key and compares them on every hit, so even a hash collision cannot reuse the wrong
content.

Why copies, not shared pages: the pool gives each sequence one contiguous slot (what the
decode kernels and captured graphs read), so a hit is one gather per layer, keys and values;
it costs memory bandwidth for the prefix's bytes, where recomputing costs a forward through
every matrix of the model. At least the prompt's last token is always computed: its logits
give the first output token.

Eviction is least recently used, and a hit or store touches a chain from its last block to its
first, so a chain's first blocks (needed by every longer match) are evicted last.

Exact: the cached keys and values are the ones a prefill computed for the same tokens at the
same positions, and a prefill attends to a prefix read from the slot either way (chunked
prefill does the same), so greedy output is the same with and without the cache up to the last
bits of a reduction over rows (tests/core/serving/test_prefix_cache.py checks the tokens).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from aieng_core.serving.kv_cache import KVCachePool, count_allocations
from aieng_core.serving.request import Request

BLOCK_TOKENS = 16  # tokens per cached block (vLLM's default block size)


@dataclass
class PrefixCacheStats:
    """Counted in prompt tokens, since start (vLLM's prefix_cache_queries / _hits): `queried`
    tokens of prompts that took a slot, `hit` of them reused from the store."""

    queried: int = 0
    hit: int = 0
    stored_blocks: int = 0
    evicted_blocks: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit / self.queried if self.queried else 0.0


@dataclass(frozen=True)
class _Block:
    index: int  # the block's row in the store's tensors
    parent: bytes
    tokens: tuple[int, ...]


class PrefixCache:
    def __init__(self, pool: KVCachePool, capacity_tokens: int, bundle_key: str) -> None:
        self.pool = pool
        self.num_blocks = capacity_tokens // BLOCK_TOKENS
        self.root = hashlib.sha256(b"aieng-prefix-cache\0" + bundle_key.encode()).digest()
        heads, head_dim = pool.keys[0].shape[1], pool.keys[0].shape[3]
        like = pool.keys[0]
        shape = (self.num_blocks, heads, BLOCK_TOKENS, head_dim)
        # Zeros, not empty: every page touched now, at start, not by the first store while serving.
        self.keys = count_allocations([torch.zeros(shape, dtype=like.dtype, device=like.device) for _ in pool.keys])
        self.values = count_allocations([torch.zeros(shape, dtype=like.dtype, device=like.device) for _ in pool.values])
        self._blocks: OrderedDict[bytes, _Block] = OrderedDict()  # least recently used first
        self._free = list(range(self.num_blocks))
        self.stats = PrefixCacheStats()

    @property
    def enabled(self) -> bool:
        return self.num_blocks > 0

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    @property
    def cached_blocks(self) -> int:
        return len(self._blocks)

    def block_keys(self, tokens: Sequence[int]) -> list[bytes]:
        """The key of each full block of `tokens`, in order."""
        keys, parent = [], self.root
        for start in range(0, len(tokens) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
            block = array("q", tokens[start : start + BLOCK_TOKENS]).tobytes()
            parent = hashlib.sha256(parent + block).digest()
            keys.append(parent)
        return keys

    def reuse(self, request: Request) -> int:
        """The longest cached run of the request's leading blocks (never the prompt's last
        token: its logits are needed), noted on the request (`prefix_rows`) for load() to copy
        into its slot before its first chunk is prefilled; the prompt tokens it covers. No
        tensor work: the scheduler calls it, the copy runs in the step (a failing copy fails
        the step's requests, not the engine loop)."""
        prompt = request.prompt_ids
        if not self.enabled:
            return 0
        self.stats.queried += len(prompt)
        found: list[_Block] = []
        parent = self.root
        keys = self.block_keys(prompt[: len(prompt) - 1])
        for number, key in enumerate(keys):
            block = self._blocks.get(key)
            tokens = tuple(prompt[number * BLOCK_TOKENS : (number + 1) * BLOCK_TOKENS])
            if block is None or block.parent != parent or block.tokens != tokens:
                break
            found.append(block)
            parent = key
        if not found:
            return 0
        self._touch(keys[: len(found)])
        request.prefix_rows = tuple(block.index for block in found)
        self.stats.hit += len(found) * BLOCK_TOKENS
        return len(found) * BLOCK_TOKENS

    def load(self, request: Request) -> None:
        """Copies the blocks reuse() found for the request into its slot (once)."""
        rows, request.prefix_rows = request.prefix_rows, ()
        if not rows:
            return
        length = len(rows) * BLOCK_TOKENS
        index = torch.tensor(rows, device=self.keys[0].device)
        slot = _slot(request)
        for stored, cached in zip((*self.keys, *self.values), (*self.pool.keys, *self.pool.values), strict=True):
            # (blocks, heads, BLOCK_TOKENS, dim) -> (heads, blocks * BLOCK_TOKENS, dim)
            cached[slot, :, :length] = stored.index_select(0, index).permute(1, 0, 2, 3).flatten(1, 2)

    def store(self, request: Request, upto: int) -> None:
        """Copies the full blocks of the request's prompt before position `upto` (computed by
        now, in its slot) into the store, those not there yet."""
        if not self.enabled:
            return
        prompt = request.prompt_ids[:upto]
        keys = self.block_keys(prompt)
        new = [number for number, key in enumerate(keys) if key not in self._blocks]
        new = new[: self.num_blocks]  # a prompt longer than the whole store keeps its first blocks
        rows: list[int] = []
        for _ in new:
            row = self._take_row(protect=keys)
            if row is None:  # every row holds a block of this very prompt: keep what is there
                break
            rows.append(row)
        new = new[: len(rows)]
        if not new:
            self._touch(keys)
            return
        index = torch.tensor(rows, device=self.keys[0].device)
        slot = _slot(request)
        try:
            for stored, cached in zip((*self.keys, *self.values), (*self.pool.keys, *self.pool.values), strict=True):
                heads, dim = cached.shape[1], cached.shape[3]
                blocks = cached[slot, :, : len(keys) * BLOCK_TOKENS].reshape(heads, len(keys), BLOCK_TOKENS, dim)
                stored.index_copy_(0, index, blocks.permute(1, 0, 2, 3)[torch.tensor(new, device=index.device)])
        except BaseException:
            self._free.extend(rows)  # their blocks were evicted or never held: the rows are free
            raise
        for number, row in zip(new, rows, strict=True):
            parent = keys[number - 1] if number else self.root
            tokens = tuple(prompt[number * BLOCK_TOKENS : (number + 1) * BLOCK_TOKENS])
            self._blocks[keys[number]] = _Block(row, parent, tokens)
        self.stats.stored_blocks += len(new)
        self._touch(keys)

    def clear(self) -> None:
        """Forget every block and count from zero (after warmup: its filler prompts are not
        the traffic the hit rate is about)."""
        self._blocks.clear()
        self._free = list(range(self.num_blocks))
        self.stats = PrefixCacheStats()

    def _take_row(self, protect: Sequence[bytes]) -> int | None:
        """A free row of the store, evicting the least recently used block outside `protect`."""
        if self._free:
            return self._free.pop()
        guarded = set(protect)
        victim = next((key for key in self._blocks if key not in guarded), None)
        if victim is None:
            return None
        self.stats.evicted_blocks += 1
        return self._blocks.pop(victim).index

    def _touch(self, keys: Sequence[bytes]) -> None:
        """Most recently used: the chain's first block last, so it is evicted after the rest."""
        for key in reversed(keys):
            if key in self._blocks:
                self._blocks.move_to_end(key)


def _slot(request: Request) -> int:
    if request.slot is None:
        raise RuntimeError(f"request {request.request_id} holds no KV-cache slot")
    return request.slot
