"""Splitting a byte stream into physical lines, with every line bounded in memory.

Lines end at the newline code unit of the file's encoding ("\\n" as one byte, or as a
UTF-16/UTF-32 code unit at an aligned offset), so a wide-encoded file is split without
decoding it, and one bad code unit costs only its own line. A line longer than
`max_bytes` is never held whole: its first `KEEP_BYTES` are kept for the quarantine and the
rest is skipped. A `Gap` (unreadable bytes) ends the line in progress, whose bytes belong
to the gap's record.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Literal, NamedTuple

import numpy as np

from aieng_core.data.byte_source import Gap

KEEP_BYTES = 4096
_ASCII_BLANK = b" \t\r\x0b\x0c"
_BLANK_CODES = np.array([0x20, 0x09, 0x0D, 0x0B, 0x0C], dtype=np.uint32)


class Line(NamedTuple):
    number: int  # 1-based physical line number
    data: bytes  # without its newline; only the first KEEP_BYTES when too_large
    size: int  # the line's full length in bytes
    too_large: bool
    suspect: str | None = None  # why the line's bytes cannot be trusted (a failed gzip CRC)
    quotes: int = 0  # '"' code units in the whole line, kept even when its bytes are not (CSV)


class LineGap(NamedTuple):
    number: int  # the line number at which the unreadable range begins
    gap: Gap
    partial: bytes  # the start of the line that the gap cut off (at most KEEP_BYTES)


class Layout(NamedTuple):
    """How newlines look in a file: the code unit width and byte order, and where text starts."""

    width: int = 1  # 1 for UTF-8 and ASCII-compatible encodings, 2 for UTF-16, 4 for UTF-32
    byteorder: Literal["little", "big"] = "little"
    skip: int = 0  # a byte-order mark to drop from the start

    @property
    def newline(self) -> bytes:
        return (10).to_bytes(self.width, self.byteorder)


def count_quotes(data: bytes, layout: Layout = Layout()) -> int:
    """'"' code units in `data`, counted at aligned offsets for UTF-16/32."""
    if layout.width == 1:
        return data.count(b'"')
    usable = len(data) - len(data) % layout.width
    dtype = np.dtype(f"{'<' if layout.byteorder == 'little' else '>'}u{layout.width}")
    return int(np.count_nonzero(np.frombuffer(data[:usable], dtype=dtype) == 0x22))


def is_blank(data: bytes, layout: Layout = Layout()) -> bool:
    """A line holding only ASCII whitespace is not a record."""
    if layout.width == 1:
        return not data.strip(_ASCII_BLANK)
    if len(data) % layout.width:
        return False
    dtype = np.dtype(f"{'<' if layout.byteorder == 'little' else '>'}u{layout.width}")
    return bool(np.isin(np.frombuffer(data, dtype=dtype), _BLANK_CODES).all())


def split_lines(pieces: Iterable[bytes | Gap], layout: Layout, max_bytes: int) -> Iterator[Line | LineGap]:
    newline, width = layout.newline, layout.width
    line = _LineBuffer(max_bytes, layout)
    number = 1
    carry = b""  # bytes of an incomplete code unit, for wide encodings
    to_skip = layout.skip
    for piece in pieces:
        if isinstance(piece, Gap):
            line.add(carry)
            yield LineGap(number, piece, line.take()[0][:KEEP_BYTES])
            number += 1
            carry = b""  # the readable bytes after a gap start a fresh, aligned stream
            continue
        untrusted = getattr(piece, "detail", None)  # SuspectBytes from a gzip member failing its CRC
        if to_skip:
            dropped = len(piece[:to_skip])
            piece, to_skip = piece[to_skip:], to_skip - dropped
        if width > 1:
            piece = carry + piece
            cut = len(piece) - len(piece) % width
            piece, carry = piece[:cut], piece[cut:]
        start = 0
        while True:
            found = piece.find(newline, start)
            while found >= 0 and found % width:
                found = piece.find(newline, found + 1)
            if found < 0:
                line.add(piece[start:], untrusted)
                break
            line.add(piece[start:found], untrusted or None, newline_follows=True)
            data, size, why, quotes = line.take()
            yield Line(number, data, size, size > max_bytes, why, quotes)
            number += 1
            start = found + width
    line.add(carry)
    if line.size:
        data, size, why, quotes = line.take()
        yield Line(number, data, size, size > max_bytes, why, quotes)


class _LineBuffer:
    """The line in progress: whole while it fits in max_bytes, else only its first KEEP_BYTES."""

    def __init__(self, max_bytes: int, layout: Layout = Layout()) -> None:
        self.max_bytes = max_bytes
        self.layout = layout
        self.parts: list[bytes] = []
        self.size = 0
        self.quotes = 0
        self.suspect: str | None = None

    def add(self, part: bytes, untrusted: str | None = None, newline_follows: bool = False) -> None:
        if untrusted and (part or newline_follows):
            self.suspect = untrusted  # a line is untrusted if any of its bytes, or its end, is
        if not part:
            return
        self.quotes += count_quotes(part, self.layout)  # parts start at aligned offsets
        was_within = self.size <= self.max_bytes
        self.size += len(part)
        if self.size <= self.max_bytes:
            self.parts.append(part)
        elif was_within:  # it just went over: keep only its start, for the quarantine
            self.parts = [(b"".join(self.parts) + part[:KEEP_BYTES])[:KEEP_BYTES]]

    def take(self) -> tuple[bytes, int, str | None, int]:
        data, size, suspect, quotes = b"".join(self.parts), self.size, self.suspect, self.quotes
        self.parts, self.size, self.suspect, self.quotes = [], 0, None, 0
        return data, size, suspect, quotes
