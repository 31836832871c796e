"""The KV-cache pool: every key and value the engine will ever hold, allocated once.

One slot per sequence that can run at a time; each slot holds `max_context` positions of
every layer's keys and values. Allocating it all up front means a step never allocates, the
memory cost is known (and reported) at start-up, and running out is a scheduling decision
(a request waits for a slot), never an out-of-memory crash mid-generation.

Ownership is explicit: a slot belongs to one request id from allocate() to free(). The
bookkeeping is plain Python, so the scheduler's tests run without a model.
"""

from __future__ import annotations

import heapq

import torch

from aieng_core.model.llama import LlamaConfig

_allocated = [0]  # tensors allocated by every pool and prefix cache of this process


def allocations() -> int:
    """Tensors the KV-cache pools and prefix caches of this process allocated: at their start
    only (the server's aieng_kv_cache_allocations; a rise while serving would be a regression)."""
    return _allocated[0]


def count_allocations(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    _allocated[0] += len(tensors)
    return tensors


class KVCachePool:
    def __init__(
        self,
        num_layers: int,
        max_batch: int,
        num_kv_heads: int,
        max_context: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        if min(num_layers, max_batch, num_kv_heads, max_context, head_dim) < 1:
            raise ValueError("every dimension of the KV-cache pool must be at least 1")
        self.max_batch = max_batch
        self.max_context = max_context
        # One position past max_context is scratch: a decode row with no sequence in it writes
        # there, so a batched step never needs a per-row branch and never touches live keys.
        shape = (max_batch, num_kv_heads, max_context + 1, head_dim)
        # Zeros, not empty: a scratch row attends to its position 0, which must hold finite numbers.
        self.keys = count_allocations([torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)])
        self.values = count_allocations([torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)])
        self._owners: list[str | None] = [None] * max_batch
        self._free = list(range(max_batch))  # a heap: the lowest free slot is handed out first

    @classmethod
    def for_model(
        cls, config: LlamaConfig, max_batch: int, max_context: int, device: str | torch.device = "cpu"
    ) -> KVCachePool:
        if max_context > config.max_position_embeddings:
            raise ValueError(
                f"max_context {max_context} exceeds the model's max_position_embeddings "
                f"{config.max_position_embeddings}"
            )
        return cls(
            config.num_hidden_layers,
            max_batch,
            config.num_key_value_heads,
            max_context,
            config.head_dim,
            device=device,
        )

    @property
    def scratch_position(self) -> int:
        return self.max_context

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def owner(self, slot: int) -> str | None:
        return self._owners[slot]

    def allocate(self, owner: str) -> int:
        """The lowest free slot, now owned by `owner`. Lowest first keeps the slots in use
        packed at the start of the pool, which is the range a decode step runs over."""
        if not self._free:
            raise RuntimeError(f"no free KV-cache slot for {owner!r}: all {self.max_batch} are in use")
        slot = heapq.heappop(self._free)
        self._owners[slot] = owner
        return slot

    def free(self, slot: int) -> None:
        if not 0 <= slot < self.max_batch or self._owners[slot] is None:
            raise RuntimeError(f"KV-cache slot {slot} is not allocated")
        self._owners[slot] = None
        heapq.heappush(self._free, slot)

    def highest_used(self) -> int:
        """Index of the highest allocated slot, -1 when none is."""
        return max((slot for slot, owner in enumerate(self._owners) if owner is not None), default=-1)

    def copy(self, source: int, destination: int, length: int) -> None:
        """The first `length` cached positions of `source` into `destination` (both allocated):
        a prompt prefilled once, for each of its samples."""
        if self._owners[source] is None or self._owners[destination] is None:
            raise RuntimeError(f"KV-cache slots {source} -> {destination}: only allocated slots are copied")
        for tensor in (*self.keys, *self.values):
            tensor[destination, :, :length] = tensor[source, :, :length]

    def move(self, sources: list[int], destinations: list[int], length: int) -> None:
        """Re-seats the owners of `sources` in `destinations` (the same set of allocated
        slots, in another order), with the first `length` cached positions of every layer's
        keys and values. slot_order.py decides; the owners' requests must take their new slots."""
        if sorted(sources) != sorted(destinations) or len(set(sources)) != len(sources):
            raise ValueError(f"a move must permute its slots: {sources} -> {destinations}")
        if any(self._owners[slot] is None for slot in sources):
            raise RuntimeError(f"KV-cache slots {sources}: only allocated slots can move")
        device = self.keys[0].device
        src = torch.tensor(sources, device=device)
        dst = torch.tensor(destinations, device=device)
        for tensor in (*self.keys, *self.values):
            cached = tensor[:, :, :length]
            cached.index_copy_(0, dst, cached.index_select(0, src))  # the sources are copied out first
        owners = [self._owners[slot] for slot in sources]
        for slot, owner in zip(destinations, owners, strict=True):
            self._owners[slot] = owner
