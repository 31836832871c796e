"""Turning landed bytes into text without ever guessing silently.

Order: a byte-order mark selects UTF-8/UTF-16/UTF-32; otherwise strict UTF-8; otherwise
strict GB18030 (a superset of GBK and GB2312); otherwise the bytes are undecodable and the
row goes to quarantine. Never errors="replace": a replacement character in training data
is data loss nobody sees. Statistical detectors misread short GBK text as Thai or Cyrillic,
so none is used.
"""

from __future__ import annotations

import codecs
from typing import BinaryIO

# Longest marks first: the UTF-32-LE mark begins with the UTF-16-LE one.
BOMS: tuple[tuple[bytes, str], ...] = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
FALLBACK_ENCODINGS = ("utf-8", "gb18030")
_CHUNK = 1 << 20


def bom_encoding(head: bytes) -> str | None:
    """The codec a byte-order mark at the start of `head` selects, if any."""
    for mark, encoding in BOMS:
        if head.startswith(mark):
            return encoding
    return None


def decode_strict(data: bytes) -> tuple[str, str] | None:
    """Decode one unit (a JSONL line, a CSV field): strict UTF-8, else strict GB18030."""
    for encoding in FALLBACK_ENCODINGS:
        try:
            return data.decode(encoding), encoding
        except UnicodeDecodeError:
            continue
    return None


def _decodes_entirely(stream: BinaryIO, encoding: str) -> bool:
    decoder = codecs.getincrementaldecoder(encoding)(errors="strict")
    try:
        while chunk := stream.read(_CHUNK):
            decoder.decode(chunk)
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    return True


def detect_stream_encoding(open_stream) -> str | None:
    """The single encoding a whole file decodes with, or None to decode it row by row.

    `open_stream()` returns a fresh binary stream positioned at the start; files are read
    in chunks, so this is a streaming pass and never holds the file in memory.
    """
    with open_stream() as stream:
        head = stream.read(4)
    candidates = [bom_encoding(head)] if bom_encoding(head) else list(FALLBACK_ENCODINGS)
    for encoding in candidates:
        if encoding == "gb18030":
            with open_stream() as stream:
                if any(is_non_ascii_utf8(line) for line in stream):
                    return None  # a mix of UTF-8 and GBK lines: decode row by row
        with open_stream() as stream:
            if _decodes_entirely(stream, encoding):
                return encoding
    return None


def is_non_ascii_utf8(data: bytes) -> bool:
    """True for bytes that are valid UTF-8 beyond ASCII.

    Most UTF-8 text is also valid GB18030 (as mojibake), so a file that fails UTF-8 as a
    whole is only decoded as GB18030 as a whole when none of its parts is UTF-8 on its own.
    """
    if data.isascii():
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
