"""Content hashes: of files, of canonical JSON, and of streamed rows.

We hash canonical content, never Parquet file bytes (Parquet embeds its writer's version),
so the same data gives the same hash on any machine, path or day.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any, BinaryIO

CHUNK_BYTES = 1 << 20


def canonical_json(value: Any) -> bytes:
    """JSON with fixed settings: sorted keys, no spaces, UTF-8, no NaN."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def sha256_json(value: Any) -> str:
    return hashlib.sha256(canonical_json(value)).hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_stream(stream: BinaryIO) -> tuple[str, int]:
    """Hash a binary stream in fixed chunks; returns (hex digest, byte count)."""
    digest = hashlib.sha256()
    size = 0
    buffer = bytearray(CHUNK_BYTES)
    view = memoryview(buffer)
    while n := stream.readinto(buffer):
        digest.update(view[:n])
        size += n
    return digest.hexdigest(), size


def sha256_file(path: str | Path) -> str:
    with open(path, "rb") as handle:
        return sha256_stream(handle)[0]


class RowHasher:
    """Streams fields into SHA-256 with length prefixes, so ("ab", "c") != ("a", "bc").

    None is encoded distinctly from the empty string. Rows must be fed in a deterministic
    order; our readers sort files by name and keep in-file order.
    """

    _NONE = b"\xff" * 8

    def __init__(self) -> None:
        self._digest = hashlib.sha256()

    def field(self, value: str | bytes | None) -> None:
        if value is None:
            self._digest.update(self._NONE)
            return
        data = value.encode("utf-8") if isinstance(value, str) else value
        self._digest.update(struct.pack("<Q", len(data)))
        self._digest.update(data)

    def row(self, *values: str | bytes | None) -> None:
        for value in values:
            self.field(value)

    def hexdigest(self) -> str:
        return self._digest.hexdigest()
