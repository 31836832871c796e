"""Content hashes: of files, of canonical JSON, and of streamed rows.

We hash canonical content, never Parquet file bytes (Parquet embeds its writer's version),
so the same data gives the same hash on any machine, path or day.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, cast

if TYPE_CHECKING:  # numpy and pyarrow are imported where tables are hashed: the CLI starts without them
    import pyarrow as pa

CHUNK_BYTES = 1 << 20


def canonical_json(value: Any) -> bytes:
    """JSON with fixed settings: sorted keys, no spaces, UTF-8, no NaN."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def sha256_json(value: Any) -> str:
    return hashlib.sha256(canonical_json(value)).hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_stream(stream: BinaryIO) -> tuple[str, int]:
    """SHA-256 and byte count of everything left in a binary stream.

    Reads into one reusable 1 MiB buffer, so it runs at hashlib speed without a new bytes
    object per chunk. A file that shrinks while we read simply ends early (and its hash
    then fails to match wherever it is compared); with mmap the same shrink killed the
    whole process with SIGBUS, and landed files are written by programs we do not own.
    """
    digest = hashlib.sha256()
    size = 0
    buffer = bytearray(CHUNK_BYTES)
    view = memoryview(buffer)
    reader = cast(io.RawIOBase, stream)  # every binary file has readinto; typing's BinaryIO omits it
    while n := reader.readinto(buffer):
        digest.update(view[:n])
        size += n
    return digest.hexdigest(), size


def sha256_file(path: str | Path) -> str:
    """SHA-256 of a file's bytes, as read (never what stat claims its size is)."""
    with open(path, "rb", buffering=0) as handle:
        return sha256_stream(handle)[0]


class ColumnHasher:
    """Streams Arrow record batches into SHA-256, column by column.

    Each column feeds two streams: its value lengths (int64, -1 for null) and its value
    bytes (UTF-8 text, little-endian integers). Streams simply concatenate across batches,
    so the digest depends on the rows and their order, never on batch sizes or the file
    format; and lengths keep ("ab", "c") apart from ("a", "bc"). Hashing whole Arrow
    buffers keeps this at hashlib speed instead of a Python call per field.
    """

    def __init__(self, columns: list[str]) -> None:
        self.columns = list(columns)
        self._lengths = {name: hashlib.sha256() for name in self.columns}
        self._values = {name: hashlib.sha256() for name in self.columns}

    def update(self, batch: pa.RecordBatch) -> None:
        for name in self.columns:
            lengths, values = _column_parts(batch.column(name))
            self._lengths[name].update(lengths)
            self._values[name].update(values)

    def hexdigest(self) -> str:
        return sha256_json(
            {name: [self._lengths[name].hexdigest(), self._values[name].hexdigest()] for name in self.columns}
        )


def _column_parts(array: pa.Array) -> tuple[bytes, bytes | memoryview]:
    import numpy as np
    import pyarrow as pa

    kind = array.type
    if (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    ):
        width = np.int64 if (pa.types.is_large_string(kind) or pa.types.is_large_binary(kind)) else np.int32
        offsets = np.frombuffer(array.buffers()[1], dtype=width)[array.offset : array.offset + len(array) + 1]
        lengths = np.diff(offsets).astype("<i8")
        if array.null_count:  # the null mask costs as much as the rest; most columns have none
            lengths[np.asarray(array.is_null())] = -1
        data = array.buffers()[2]
        values = memoryview(data)[int(offsets[0]) : int(offsets[-1])] if data is not None else b""
        return lengths.tobytes(), values
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        lengths = np.asarray(array.value_lengths().fill_null(-1)).astype("<i8")
        flat = np.asarray(array.flatten())
        return lengths.tobytes(), flat.astype(flat.dtype.newbyteorder("<"), copy=False).tobytes()
    if pa.types.is_integer(kind):
        nulls = np.asarray(array.is_null())
        numbers = np.asarray(array.fill_null(0)).astype("<i8")
        return nulls.astype(np.uint8).tobytes(), numbers.tobytes()
    raise TypeError(f"cannot hash a column of type {kind}")
