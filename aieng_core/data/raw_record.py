"""The RawRecord every format's reader yields and the ReadLimits it reads under, with what
the line readers (JSON Lines and CSV) share: the contract's field names, the newline layout a
byte-order mark fixes, and decoding one line. Apart from readers.py so that each format's
reader can import it without importing the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from aieng_core.data import reasons
from aieng_core.data.byte_source import ByteSource, Gap
from aieng_core.data.decoding import DEFAULT_FALLBACK_ENCODINGS, Decoded, bom_encoding, decode_unit
from aieng_core.data.lines import Layout

CONTRACT_FIELDS = ("id", "text", "source", "lang", "created_at")


class RawRecord(NamedTuple):
    source_file: str  # name inside the partition folder
    line: int  # 1-based line (JSONL, CSV) or row (Parquet) number; 0 for a whole-file failure
    raw: bytes  # the row as read (at most its first 4 KiB when too large), kept for quarantine
    fields: dict[str, Any] | None  # the parsed contract fields, when the record could be read
    reason: str | None = None  # why it could not be read
    detail: str | None = None


@dataclass(frozen=True)
class ReadLimits:
    max_record_bytes: int = 8 << 20
    max_file_bytes: int = 16 << 30
    batch_rows: int = 4096
    fallback_encodings: tuple[str, ...] = DEFAULT_FALLBACK_ENCODINGS
    batch_bytes: int = 64 << 20

    @classmethod
    def from_config(cls, data: Any) -> ReadLimits:
        return cls(
            data.max_record_bytes,
            data.max_file_bytes,
            data.batch_rows,
            tuple(data.fallback_encodings),
            data.batch_bytes,
        )


def detect_layout(source: ByteSource) -> tuple[Layout, str | None]:
    """The newline layout of a line file, and the codec its byte-order mark fixes (if any)."""
    head = b""
    for piece in source.pieces():
        if isinstance(piece, Gap):
            break
        head += piece[: 4 - len(head)]
        if len(head) >= 4:
            break
    found = bom_encoding(head)
    if found is None:
        return Layout(), None
    codec, skip = found
    if codec == "utf-8":
        return Layout(1, "little", skip), None
    width = 4 if codec.startswith("utf-32") else 2
    return Layout(width, "little" if codec.endswith("le") else "big", skip), codec


def decode_line(data: bytes, codec: str | None, limits: ReadLimits) -> Decoded:
    if codec is None:
        return decode_unit(data, limits.fallback_encodings)
    try:
        return Decoded(data.decode(codec), codec)
    except UnicodeDecodeError as exc:
        return Decoded(
            None,
            reason=reasons.UNDECODABLE,
            detail=f"invalid {codec} (the byte-order mark's encoding): {exc.reason} at byte {exc.start}",
        )
