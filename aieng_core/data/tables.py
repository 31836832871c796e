"""Parquet schemas of the data artifacts, and small helpers to read them back.

Reads decode column chunks on pyarrow's CPU pool, which pyarrow sizes to the host's cores; it
is sized here to the cores this process has (cpu/quota.py: its affinity mask and cgroup CPU
limit), as the engine's and training's threads are (the tokenizers' Rust pool reads the same
limit itself)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from aieng_core.cpu.quota import usable_cores

CLEAN_FILE = "clean.parquet"
QUARANTINE_FILE = "quarantine.parquet"
TOKENS_FILE = "tokens.parquet"

CLEAN_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("text", pa.large_string()),
        ("source", pa.string()),
        ("lang", pa.string()),
        ("created_at", pa.string()),
        ("source_file", pa.string()),  # provenance: landed file name
        ("line", pa.int64()),  # provenance: line or row number in that file
    ]
)

QUARANTINE_SCHEMA = pa.schema(
    [
        ("source_file", pa.string()),
        ("line", pa.int64()),  # line (JSONL, CSV) or row (Parquet) number; 0 = whole file
        ("reason", pa.string()),
        ("detail", pa.string()),
        ("raw", pa.large_binary()),  # the line as read (JSONL); the row re-serialized (CSV, Parquet)
    ]
)

TOKENS_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("input_ids", pa.large_list(pa.int32())),  # ends with the tokenizer's EOS id
        ("num_tokens", pa.int32()),
    ]
)

# Small files, many readers: modest row groups keep streamed reads bounded in memory.
ROW_GROUP_ROWS = 16_384


def parquet_writer(path: Path, schema: pa.Schema) -> pq.ParquetWriter:
    return pq.ParquetWriter(path, schema, compression="zstd")


def num_rows(path: Path) -> int:
    return pq.ParquetFile(path).metadata.num_rows


@functools.cache
def _fit_arrow_pool() -> None:
    pa.set_cpu_count(usable_cores())


def iter_batches(path: Path, columns: list[str] | None = None, batch_rows: int = 4096) -> Iterator[pa.RecordBatch]:
    _fit_arrow_pool()
    yield from pq.ParquetFile(path).iter_batches(batch_size=batch_rows, columns=columns)


def head(path: Path, rows: int, columns: list[str] | None = None) -> list[dict[str, Any]]:
    """The first `rows` rows, for previews."""
    for batch in iter_batches(path, columns=columns, batch_rows=rows):
        return batch.to_pylist()[:rows]
    return []
