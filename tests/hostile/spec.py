"""What the expectations are written against, independently of aieng_core: the limits of
configs/tiny.yaml, the quarantine reasons of the data contract, and the spec's rule for
decoding one unit. Every family of cases is written against them.
"""

from __future__ import annotations

# ---- the limits the expectations assume (configs/tiny.yaml, data section) ----------------
MIN_CHARS = 10
MAX_CHARS = 200_000
MAX_RECORD_BYTES = 1 << 20  # 1 MiB
MAX_FILE_BYTES = 256 << 20  # 256 MiB
STREAM_SAFE_MARKS = 30  # a longer run of combining marks is excessive (Unicode stream-safe format)
MAX_ID_CHARS = 1024

# ---- quarantine reasons (the strings are part of the data contract) -----------------------
MALFORMED_JSON = "malformed_json"
MALFORMED_ROW = "malformed_row"
UNDECODABLE = "undecodable"
AMBIGUOUS_ENCODING = "ambiguous_encoding"
MISSING_FIELD = "missing_field"
WRONG_TYPE = "wrong_type"
DUPLICATE_FIELD = "duplicate_field"
INVALID_ID = "invalid_id"
RECORD_TOO_LARGE = "record_too_large"
UNREADABLE = "unreadable"
EMPTY_TEXT = "empty_text"
EXCESSIVE_COMBINING_MARKS = "excessive_combining_marks"
TOO_SHORT = "too_short"
TOO_LONG = "too_long"
DUPLICATE_ID = "duplicate_id"
DUPLICATE_TEXT = "duplicate_text"
REASONS = (
    MALFORMED_JSON,
    MALFORMED_ROW,
    UNDECODABLE,
    AMBIGUOUS_ENCODING,
    MISSING_FIELD,
    WRONG_TYPE,
    DUPLICATE_FIELD,
    INVALID_ID,
    RECORD_TOO_LARGE,
    UNREADABLE,
    EMPTY_TEXT,
    EXCESSIVE_COMBINING_MARKS,
    TOO_SHORT,
    TOO_LONG,
    DUPLICATE_ID,
    DUPLICATE_TEXT,
)

# What the spec's decoding rule makes of one unit (see spec_verdict).
AS_UTF8, AS_GB18030 = "utf-8", "gb18030"


# ---- the spec's decoding rule, spelled out independently ---------------------------------
def spec_verdict(unit: bytes, fallback: str = "gb18030") -> str:
    """What the spec says decoding one unit (a JSONL line, a CSV physical line, a Parquet
    cell) gives: AS_UTF8, AS_GB18030, AMBIGUOUS_ENCODING or UNDECODABLE."""
    try:
        unit.decode("utf-8")
        return AS_UTF8
    except UnicodeDecodeError:
        pass
    try:
        unit.decode(fallback)
    except UnicodeDecodeError:
        return UNDECODABLE
    inside = outside = 0
    i = 0
    while i < len(unit):
        lead = unit[i]
        if lead < 0x80:
            i += 1
            continue
        trail = unit[i + 1]
        if 0x30 <= trail <= 0x39:
            return AMBIGUOUS_ENCODING  # a four-byte GB18030 sequence
        if 0xA1 <= lead <= 0xFE and 0xA1 <= trail <= 0xFE:
            inside += 1
        else:
            outside += 1
        i += 2
    return AS_GB18030 if outside * 5 <= inside + outside else AMBIGUOUS_ENCODING
