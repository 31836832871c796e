"""Reading landed files into raw records, one record per input row, streaming.

Every row that goes in comes out as exactly one RawRecord: either with its parsed fields,
or with the quarantine reason that stopped it. That one-to-one rule is what makes
`rows_in == rows_clean + rows_quarantined` checkable downstream.

JSONL is decoded line by line (one GBK line inside a UTF-8 file is recovered); CSV and
Parquet are decoded per file, and a file that no single encoding fits is decoded row by row.
"""

from __future__ import annotations

import codecs
import csv
import datetime as dt
import gzip
import io
import json
import sys
import zlib
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from aieng_core.data import reasons
from aieng_core.data.decoding import bom_encoding, decode_strict, detect_stream_encoding, is_non_ascii_utf8

DATA_SUFFIXES = (".jsonl", ".jsonl.gz", ".csv", ".csv.gz", ".parquet")

csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # long documents are too_long, not a csv.Error


class RawRecord(NamedTuple):
    source_file: str  # name inside the partition folder
    line: int  # 1-based line (JSONL, CSV) or row (Parquet) number; 0 for a whole-file failure
    raw: bytes  # the row as read, kept for quarantine
    fields: dict[str, Any] | None  # the parsed record, when it could be read
    reason: str | None = None  # why it could not be read
    detail: str | None = None


def is_data_file(name: str) -> bool:
    return not name.startswith(".") and name.endswith(DATA_SUFFIXES)


def _opener(path: Path) -> Callable[[], io.BufferedIOBase]:
    if path.name.endswith(".gz"):
        return lambda: gzip.open(path, "rb")
    return lambda: open(path, "rb")


def read_records(path: Path, name: str, batch_rows: int = 4096) -> Iterator[RawRecord]:
    """All records of one landed file, by its suffix."""
    if name.endswith((".jsonl", ".jsonl.gz")):
        return _guarded(read_jsonl(_opener(path), name), name)
    if name.endswith((".csv", ".csv.gz")):
        return _guarded(read_csv(_opener(path), name), name)
    if name.endswith(".parquet"):
        return read_parquet(path, name, batch_rows)
    raise ValueError(f"{name}: not a data file (expected one of {', '.join(DATA_SUFFIXES)})")


def _guarded(records: Iterator[RawRecord], name: str) -> Iterator[RawRecord]:
    """Keeps the rows read before a file turns out unreadable (corrupt or truncated gzip,
    I/O error), and records the rest of the file as one malformed_row, instead of failing
    the whole partition."""
    line = 0
    try:
        for record in records:
            line = record.line
            yield record
    except (OSError, EOFError, zlib.error) as exc:
        yield RawRecord(name, line + 1, b"", None, reasons.MALFORMED_ROW, f"file unreadable from line {line + 1} on: {exc}")


# ---- JSONL ------------------------------------------------------------------------------
def _json_record(name: str, line: int, raw: bytes, text: str) -> RawRecord:
    try:
        value = json.loads(text)
    except ValueError as exc:
        return RawRecord(name, line, raw, None, reasons.MALFORMED_JSON, f"invalid JSON: {exc}")
    if not isinstance(value, dict):
        return RawRecord(name, line, raw, None, reasons.MALFORMED_ROW, f"expected a JSON object, got {type(value).__name__}")
    return RawRecord(name, line, raw, value)


def read_jsonl(open_stream: Callable[[], io.BufferedIOBase], name: str) -> Iterator[RawRecord]:
    """One record per non-blank line. Blank lines are not records."""
    with open_stream() as stream:
        encoding = bom_encoding(stream.read(4))
    if encoding in ("utf-16", "utf-32"):
        # Wide encodings cannot be split on b"\n"; decode the stream as a whole instead.
        yield from _read_wide_jsonl(open_stream, name, encoding)
        return
    with open_stream() as stream:
        for number, line in enumerate(stream, 1):
            if number == 1 and line.startswith(codecs.BOM_UTF8):
                line = line[len(codecs.BOM_UTF8) :]
            raw = line.rstrip(b"\r\n")
            if not raw.strip():
                continue
            decoded = decode_strict(raw)
            if decoded is None:
                yield RawRecord(name, number, raw, None, reasons.UNDECODABLE, "line is neither UTF-8 nor GB18030")
                continue
            yield _json_record(name, number, raw, decoded[0])


def _read_wide_jsonl(open_stream, name: str, encoding: str) -> Iterator[RawRecord]:
    number = 0
    with open_stream() as stream:
        text = io.TextIOWrapper(stream, encoding=encoding, errors="strict", newline="")
        try:
            for number, line in enumerate(text, 1):
                body = line.rstrip("\r\n")
                if body.strip():
                    yield _json_record(name, number, body.encode("utf-8"), body)
        except UnicodeDecodeError as exc:
            yield RawRecord(name, number + 1, b"", None, reasons.UNDECODABLE, f"invalid {encoding} from line {number + 1} on: {exc}")


# ---- CSV --------------------------------------------------------------------------------
def _csv_line(row: list[str]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow(row)
    return out.getvalue()


def read_csv(open_stream: Callable[[], io.BufferedIOBase], name: str) -> Iterator[RawRecord]:
    """One record per data row; the first row is the header naming the columns."""
    encoding = detect_stream_encoding(open_stream)
    with open_stream() as stream:
        # latin-1 maps every byte to one character, so a file no single encoding fits can
        # still be split into rows, and each row decoded on its own below.
        text = io.TextIOWrapper(stream, encoding=encoding or "latin-1", errors="strict", newline="")
        reader = csv.reader(text)
        try:
            header = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            yield RawRecord(name, 1, b"", None, reasons.MALFORMED_ROW, f"unreadable CSV header: {exc}")
            return
        if encoding is None:
            decoded_header = decode_strict(_csv_line(header).encode("latin-1"))
            header = next(csv.reader([decoded_header[0]])) if decoded_header else header
        header = [column.strip() for column in header]
        header[0] = header[0].lstrip("\ufeff")  # a BOM survives the row-by-row path
        start = reader.line_num + 1
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                yield RawRecord(name, start, b"", None, reasons.MALFORMED_ROW, f"unreadable CSV row: {exc}")
                start = reader.line_num + 1
                continue
            number, start = start, reader.line_num + 1
            if not row:
                continue  # a blank line is not a record
            line = _csv_line(row)
            if encoding is None:
                original = line.encode("latin-1")
                decoded = decode_strict(original)
                if decoded is None:
                    yield RawRecord(name, number, original, None, reasons.UNDECODABLE, "row is neither UTF-8 nor GB18030")
                    continue
                line = decoded[0]
                row = next(csv.reader([line]))
            raw = line.encode("utf-8")
            if len(row) != len(header):
                yield RawRecord(name, number, raw, None, reasons.MALFORMED_ROW, f"row has {len(row)} fields, the header has {len(header)}")
                continue
            yield RawRecord(name, number, raw, dict(zip(header, row)))


# ---- Parquet ----------------------------------------------------------------------------
def _parquet_encoding(parquet: pq.ParquetFile, columns: list[str]) -> str | None:
    """The one encoding all binary cells of the file decode with, or None (cell by cell).

    Streams the cells once per question, so a large file is never held in memory."""

    def cells() -> Iterator[bytes]:
        for batch in parquet.iter_batches(columns=columns):
            for column in batch.columns:
                yield from (value for value in column.to_pylist() if value is not None)

    def all_decode(encoding: str) -> bool:
        try:
            for value in cells():
                value.decode(encoding)
        except UnicodeDecodeError:
            return False
        return True

    if all_decode("utf-8"):
        return "utf-8"
    if any(is_non_ascii_utf8(value) for value in cells()):
        return None  # a mix of UTF-8 and GBK cells: decode each on its own
    return "gb18030" if all_decode("gb18030") else None


def _parquet_value(value: Any, encoding: str | None) -> Any:
    if isinstance(value, bytes):
        if encoding is not None:
            return value.decode(encoding)
        decoded = decode_strict(value)
        if decoded is None:
            raise UnicodeDecodeError("gb18030", value, 0, len(value), "neither UTF-8 nor GB18030")
        return decoded[0]
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    return value


def _raw_json(row: dict[str, Any]) -> bytes:
    def default(value: Any) -> str:
        return value.decode("latin-1") if isinstance(value, bytes) else str(value)

    return json.dumps(row, ensure_ascii=False, default=default, sort_keys=True).encode("utf-8")


def read_parquet(path: Path, name: str, batch_rows: int = 4096) -> Iterator[RawRecord]:
    """One record per row, read in record batches."""
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        yield RawRecord(name, 0, b"", None, reasons.MALFORMED_ROW, f"not a readable Parquet file: {exc}")
        return
    binary = [f.name for f in parquet.schema_arrow if pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type)]
    encoding = _parquet_encoding(parquet, binary) if binary else "utf-8"
    number = 0
    try:
        for batch in parquet.iter_batches(batch_size=batch_rows):
            for row in batch.to_pylist():
                number += 1
                raw = _raw_json(row)
                try:
                    fields = {key: _parquet_value(value, encoding) for key, value in row.items()}
                except UnicodeDecodeError:
                    yield RawRecord(name, number, raw, None, reasons.UNDECODABLE, "a binary cell is neither UTF-8 nor GB18030")
                    continue
                yield RawRecord(name, number, raw, fields)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
        yield RawRecord(name, number + 1, b"", None, reasons.MALFORMED_ROW, f"unreadable from row {number + 1} on: {exc}")
