"""The JSON Lines reader: one record per non-blank physical line, each parsed on its own.

Only the contract's fields are kept from a parsed object, and a contract key given twice is
duplicate_field rather than silently the last value.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

from aieng_core.data import reasons
from aieng_core.data.byte_source import ByteSource
from aieng_core.data.lines import KEEP_BYTES, Line, LineGap, is_blank, split_lines
from aieng_core.data.raw_record import CONTRACT_FIELDS, RawRecord, ReadLimits, decode_line, detect_layout


def _too_large(name: str, number: int, line: Line, limits: ReadLimits, what: str = "line") -> RawRecord:
    detail = (
        f"{what} is {line.size} bytes, over data.max_record_bytes ({limits.max_record_bytes}); "
        f"raw keeps its first {KEEP_BYTES} bytes"
    )
    return RawRecord(name, number, line.data, None, reasons.RECORD_TOO_LARGE, detail)


def _unreadable(name: str, item: LineGap) -> RawRecord:
    return RawRecord(
        name,
        item.number,
        item.partial,
        None,
        reasons.UNREADABLE,
        f"{item.gap.detail} (line numbers after it are counted from the readable data)",
    )


class _JsonObject(dict):
    """A parsed JSON object that remembers keys it was given more than once."""

    repeated: frozenset[str] = frozenset()


def _json_object(pairs: list[tuple[str, Any]]) -> _JsonObject:
    value = _JsonObject(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        value.repeated = frozenset(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
    return value


def _long_int(digits: str) -> int | Decimal:
    # Python refuses to parse integers over 4,300 digits; such a number in a field the
    # contract ignores must not cost the row, and in a contract field it is wrong_type anyway.
    return int(digits) if len(digits) <= 4000 else Decimal(digits)


def _parse_json(text: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_json_object)
    except ValueError as exc:
        if "integer string conversion" not in str(exc):
            raise
        return json.loads(text, object_pairs_hook=_json_object, parse_int=_long_int)


def json_record(name: str, line: int, raw: bytes, text: str) -> RawRecord:
    try:
        value = _parse_json(text)
    except RecursionError:
        return RawRecord(name, line, raw, None, reasons.MALFORMED_JSON, "JSON nested too deeply to parse")
    except ValueError as exc:
        return RawRecord(name, line, raw, None, reasons.MALFORMED_JSON, f"invalid JSON: {exc}")
    if not isinstance(value, _JsonObject):  # every JSON object is parsed as one (object_pairs_hook)
        return RawRecord(
            name, line, raw, None, reasons.MALFORMED_ROW, f"expected a JSON object, got {type(value).__name__}"
        )
    repeated = sorted(value.repeated.intersection(CONTRACT_FIELDS))
    if repeated:
        return RawRecord(
            name,
            line,
            raw,
            None,
            reasons.DUPLICATE_FIELD,
            f"key {', '.join(map(repr, repeated))} appears more than once",
        )
    # Keep only the contract's fields: a record with 100,000 other keys costs nothing after this.
    return RawRecord(name, line, raw, {key: value[key] for key in CONTRACT_FIELDS if key in value})


def read_jsonl(source: ByteSource, name: str, limits: ReadLimits) -> Iterator[RawRecord]:
    """One record per non-blank physical line."""
    layout, codec = detect_layout(source)
    for item in split_lines(source.pieces(), layout, limits.max_record_bytes):
        if isinstance(item, LineGap):
            yield _unreadable(name, item)
            continue
        if item.too_large:
            yield _too_large(name, item.number, item, limits)
            continue
        if is_blank(item.data, layout):
            continue
        if item.suspect:
            yield RawRecord(name, item.number, item.data, None, reasons.UNREADABLE, item.suspect)
            continue
        raw = item.data[:-1] if codec is None and item.data.endswith(b"\r") else item.data
        decoded = decode_line(raw, codec, limits)
        if decoded.text is None:
            yield RawRecord(name, item.number, raw, None, decoded.reason, decoded.detail)
            continue
        text = decoded.text if codec is None else decoded.text.removesuffix("\r")
        yield json_record(name, item.number, raw if codec is None else text.encode("utf-8"), text)
