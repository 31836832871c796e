"""A decode step's attention: one query per row against its cached keys, the rows split into
groups of consecutive rows, each attending up to its own longest row.

A decode step reads the cache as a view of slots 0..rows-1. One attention call over all rows
attends every row up to the longest row's length: with mixed lengths about half of the
attended positions were padding (the serving benchmark's profile: 54% at batch 64). So the
rows are split into a few groups of consecutive rows, each attending up to the longest row of
its own group, and the serving engine keeps decoding rows in length order
(serving/slot_order.py), so that the rows of a group have similar lengths.

Group sizes depend on the number of rows only, so a captured step graph of a batch bucket
keeps its static shapes; each group's attended length is a dynamic dimension.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# Fewer rows per group than this and the gain was within the noise (scripts/decode_group_speed.py:
# batch 16 in two groups of 8 ran 0.96x to 1.06x of one group, batch 64 in four groups of 16
# 1.14x to 1.22x); more groups than four add calls for little (four groups already cut the
# padding of evenly spread lengths to about an eighth).
MIN_GROUP_ROWS = 16
MAX_GROUPS = 4


def group_sizes(rows: int, min_rows: int = MIN_GROUP_ROWS) -> tuple[int, ...]:
    """Row counts of the groups, in row order, summing to `rows`: as equal as they can be."""
    if rows < 1 or min_rows < 1:
        raise ValueError(f"a decode step needs at least one row and one row per group, got {rows}, {min_rows}")
    count = max(1, min(MAX_GROUPS, rows // min_rows))
    base, extra = divmod(rows, count)
    return tuple(base + (1 if index < extra else 0) for index in range(count))


def group_of_rows(sizes: Sequence[int]) -> list[int]:
    """The group index of every row."""
    return [index for index, size in enumerate(sizes) for _ in range(size)]


def group_lengths(lengths: Sequence[int], sizes: Sequence[int], minimum: int = 1) -> list[int]:
    """Each group's attended length: its longest row's, at least `minimum`."""
    if len(lengths) != sum(sizes):
        raise ValueError(f"{len(lengths)} row lengths for groups of {sum(sizes)} rows")
    out, start = [], 0
    for size in sizes:
        out.append(max(minimum, *lengths[start : start + size]))
        start += size
    return out


def attention_cells(lengths: Sequence[int], sizes: Sequence[int], minimum: int = 1) -> int:
    """Positions the step attends, padding included: each group's rows times its length."""
    return sum(size * length for size, length in zip(sizes, group_lengths(lengths, sizes, minimum)))


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """One query per row against its cached keys, as two batched matmuls.

    q: (batch, heads, head_dim); keys, values: (batch, kv_heads, length, head_dim) views of the
    cache; bias: (batch * kv_heads, heads // kv_heads, length), 0 where a row sees a position and
    -inf where it does not. Query heads are grouped under the key/value head they share (as
    transformers' repeat_kv pairs them), so no key is copied per query head. For a single
    query this beats scaled_dot_product_attention, whose CPU kernel is built for many.
    Returns (batch, heads * head_dim).

    Compiled (serving/step_graphs.py), the same sums are written as products summed over a
    dimension instead: inductor fuses each into one loop over the keys, where a batched
    matmul of a few query rows is one tiny GEMM per row and head (measured on the pipeline
    model, 2 threads: a captured batch-64 step 19.0 -> 15.5 ms, batch 1 3.0 -> 2.6 ms). Eagerly
    those products would be materialized, so the eager step keeps the matmuls.
    """
    if torch.compiler.is_compiling():
        return _fused_decode_attention(q, keys, values, bias)
    batch, heads, head_dim = q.shape
    kv_heads, length = keys.shape[1], keys.shape[2]
    grouped = q.reshape(batch * kv_heads, heads // kv_heads, head_dim)
    keys = keys.reshape(batch * kv_heads, length, head_dim)
    values = values.reshape(batch * kv_heads, length, head_dim)
    scores = torch.baddbmm(bias, grouped, keys.transpose(1, 2), alpha=head_dim**-0.5)
    return torch.bmm(torch.softmax(scores, dim=-1), values).view(batch, heads * head_dim)


def _fused_decode_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor
) -> torch.Tensor:
    """decode_attention for inductor: the same scores and weighted sum, as reductions."""
    batch, heads, head_dim = q.shape
    kv_heads, length = keys.shape[1], keys.shape[2]
    grouped = q.reshape(batch * kv_heads, heads // kv_heads, 1, head_dim)
    keys = keys.reshape(batch * kv_heads, 1, length, head_dim)
    values = values.reshape(batch * kv_heads, 1, length, head_dim)
    scores = (grouped * keys).sum(-1) * head_dim**-0.5 + bias
    weights = torch.softmax(scores, dim=-1).unsqueeze(-1)
    return (weights * values).sum(-2).reshape(batch, heads * head_dim)
