"""Reading landed files into raw records, one record per input row, streaming.

Every record that goes in comes out as exactly one RawRecord: either with its parsed
contract fields, or with the quarantine reason that stopped it. A reader error costs only
the records it cannot read: a bad line, cell, page or gzip member is quarantined with its
line, row or byte range, and reading goes on after it. `LandedFile.tally()` compares the
records read with a count taken without the parsers (record_count.py), which is what makes
`rows_in == rows_clean + rows_quarantined` mean something.

Every bound is applied before the expensive work: a line over `data.max_record_bytes` is
never held whole or parsed, decompression stops at `data.max_file_bytes`, and only the
contract's fields are kept from a parsed record, so memory is bounded by configuration
whatever the input.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from aieng_core.data import reasons
from aieng_core.data.byte_source import ByteSource, Gap
from aieng_core.data.decoding import DEFAULT_FALLBACK_ENCODINGS, Decoded, bom_encoding, decode_unit
from aieng_core.data.lines import KEEP_BYTES, Layout, Line, LineGap, count_quotes, is_blank, split_lines
from aieng_core.data.record_count import count_lines, parquet_footer_rows

DATA_SUFFIXES = (".jsonl", ".jsonl.gz", ".csv", ".csv.gz", ".parquet")
CONTRACT_FIELDS = ("id", "text", "source", "lang", "created_at")

log = logging.getLogger("aieng.data")


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


def is_data_file(name: str) -> bool:
    return not name.startswith(".") and name.endswith(DATA_SUFFIXES)


def read_records(path: Path, name: str, limits: ReadLimits = ReadLimits()) -> Iterator[RawRecord]:
    """All records of one landed file, by its suffix."""
    return LandedFile(path, name, limits).records()


class LandedFile:
    """One landed file: its records, and how many it should have produced."""

    def __init__(self, path: Path, name: str, limits: ReadLimits = ReadLimits()) -> None:
        if not name.endswith(DATA_SUFFIXES):
            raise ValueError(f"{name}: not a data file (expected one of {', '.join(DATA_SUFFIXES)})")
        self.path, self.name, self.limits = Path(path), name, limits
        self.source = ByteSource(self.path, limits.max_file_bytes)
        self.read = 0
        self.lines_consumed = 0  # CSV: physical lines the reader went through
        self.header_quarantined = False  # CSV: the header could not be used and is a record itself

    def records(self) -> Iterator[RawRecord]:
        if self.name.endswith(".parquet"):
            reader = read_parquet(self.path, self.name, self.limits)
        elif self.name.endswith((".jsonl", ".jsonl.gz")):
            reader = read_jsonl(self.source, self.name, self.limits)
        else:
            reader = read_csv(self.source, self.name, self.limits, self)
        line = 0
        try:
            for record in reader:
                self.read += 1
                line = record.line
                yield record
        except Exception as exc:  # a reader bug must cost this file's rest, visibly, not the partition
            log.error(f"{self.name}: reader failed after line {line}: {exc!r}")
            self.read += 1
            yield RawRecord(
                self.name, line + 1, b"", None, reasons.UNREADABLE, f"reader failed after line {line}: {exc!r}"
            )

    def tally(self) -> dict[str, Any]:
        """Records read and records expected from a count that shares no parser with the reader."""
        if self.name.endswith(".parquet"):
            rows = parquet_footer_rows(self.path)
            expected, source = (1, "no readable footer") if rows is None else (rows, "parquet footer")
        else:
            layout, _ = detect_layout(self.source)
            count = count_lines(self.source.pieces(), layout, self.limits.max_record_bytes)
            if self.name.endswith((".jsonl", ".jsonl.gz")):
                expected, source = count.records + count.gaps, "non-blank lines"
            elif not count.has_quote:
                header = 0 if self.header_quarantined else 1
                expected, source = max(count.records - header, 0) + count.gaps, "non-blank lines after the header"
            else:
                # Quoted fields may span lines: every physical line must have been consumed.
                expected, source = self.read + abs(count.lines - self.lines_consumed), "lines consumed"
        return {"expected": expected, "read": self.read, "count_source": source}


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


def _decode(data: bytes, codec: str | None, limits: ReadLimits) -> Decoded:
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


# ---- JSONL ------------------------------------------------------------------------------
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
        decoded = _decode(raw, codec, limits)
        if decoded.text is None:
            yield RawRecord(name, item.number, raw, None, decoded.reason, decoded.detail)
            continue
        text = decoded.text if codec is None else decoded.text.removesuffix("\r")
        yield json_record(name, item.number, raw if codec is None else text.encode("utf-8"), text)


# ---- CSV --------------------------------------------------------------------------------
csv.field_size_limit(2**31 - 1)  # records are bounded by data.max_record_bytes before csv sees them


class _StopRecord(Exception):
    """Raised into the csv reader to abandon the record in progress."""

    def __init__(self, reason: str, detail: str, gap: LineGap | None = None) -> None:
        super().__init__(detail)
        self.reason, self.detail, self.gap = reason, detail, gap


def _as_utf8(line: bytes, codec: str | None) -> bytes:
    """A consumed line as the quarantine keeps it: as landed, or re-encoded as UTF-8 when a
    byte-order mark named a wide encoding."""
    if codec is None:
        return line[:-1] if line.endswith(b"\r") else line
    try:
        return line.decode(codec).removesuffix("\r").encode("utf-8")
    except UnicodeDecodeError:
        return line


def _inside_quotes_after(line: str, inside: bool, at_record_start: bool) -> bool:
    """Whether a quoted field is still open at the end of `line`, given whether one was open
    at its start. A quote opens a field only at a field's start (RFC 4180), so `5" screen`
    opens nothing; inside a field a doubled quote is a literal quote."""
    position = 0
    if not inside and at_record_start and line.startswith('"'):
        inside, position = True, 1
    while True:
        if inside:
            found = line.find('"', position)
            if found < 0:
                return True
            if line.startswith('""', found):
                position = found + 2
                continue
            inside, position = False, found + 1
        else:
            found = line.find(',"', position)
            if found < 0:
                return False
            inside, position = True, found + 2


class _CsvLines:
    """The decoded lines fed to Python's csv reader. Every line fed is attributed to the
    record being read, which gives each record its raw bytes and lets the tally check that
    every physical line was consumed. A line that cannot be fed (undecodable, too large, a
    gap) raises _StopRecord into the csv reader, which drops the record in progress and
    starts afresh on the next line."""

    def __init__(self, source: ByteSource, limits: ReadLimits) -> None:
        self.limits = limits
        self.layout, self.codec = detect_layout(source)
        self.items = split_lines(source.pieces(), self.layout, limits.max_record_bytes)
        self.consumed: list[bytes] = []  # raw lines of the record in progress
        self.consumed_bytes = 0
        self.inside = False  # whether the record so far ends inside a quoted field
        self.first_line = 0
        self.lines_seen = 0
        self.pending: LineGap | None = None  # a gap met while skipping an oversized record

    def __iter__(self) -> _CsvLines:
        return self

    def __next__(self) -> str:
        if self.pending is not None:
            gap, self.pending = self.pending, None
            raise _StopRecord(reasons.UNREADABLE, gap.gap.detail, gap)
        item = next(self.items)  # StopIteration ends the csv reader
        while isinstance(item, Line) and not self.consumed and not item.too_large and is_blank(item.data, self.layout):
            self.lines_seen += 1  # a blank line between records is not a record, and csv never sees it
            item = next(self.items)
        if isinstance(item, LineGap):
            raise _StopRecord(reasons.UNREADABLE, item.gap.detail, item)
        self._consume(item)
        if item.suspect and not is_blank(item.data, self.layout):
            self._skip_rest_of_record()
            raise _StopRecord(reasons.UNREADABLE, f"line {item.number}: {item.suspect}")
        if item.too_large or self.consumed_bytes > self.limits.max_record_bytes:
            self._skip_rest_of_record()
            raise _StopRecord(
                reasons.RECORD_TOO_LARGE,
                f"record from line {self.first_line} is {self.consumed_bytes} bytes, over data.max_record_bytes "
                f"({self.limits.max_record_bytes}); raw keeps its start",
            )
        decoded = _decode(item.data, self.codec, self.limits)
        if decoded.text is None:
            self._skip_rest_of_record()
            raise _StopRecord(decoded.reason or reasons.UNDECODABLE, f"line {item.number}: {decoded.detail}")
        return decoded.text + "\n"

    def _structure(self, data: bytes) -> str:
        """The line as characters good enough to find quotes and commas, whatever its
        encoding (GB18030 trail bytes are never 0x22 or 0x2C)."""
        return data.decode("latin-1") if self.codec is None else data.decode(self.codec, "replace")

    def _consume(self, item: Line) -> None:
        self.lines_seen += 1
        at_start = not self.consumed and self.consumed_bytes == 0
        if at_start:
            self.first_line = item.number
        if self.consumed_bytes <= self.limits.max_record_bytes:
            self.consumed.append(item.data)
        self.consumed_bytes += item.size
        inside = _inside_quotes_after(self._structure(item.data), self.inside, at_start)
        if item.too_large and inside:
            # Only the line's start was kept. Inside a field, quotes come in pairs until the
            # closing one, so an odd count in the rest of the line means the field closed.
            inside = (item.quotes - count_quotes(item.data, self.layout)) % 2 == 0
        self.inside = inside

    def _skip_rest_of_record(self) -> None:
        """A record abandoned midway (too large, undecodable, untrusted) ends where its
        quoted field closes, not at the next line: the rest of a quoted field must not be
        parsed as records of its own."""
        while self.inside:
            item = next(self.items, None)
            if item is None:
                return
            if isinstance(item, LineGap):
                self.pending = item
                return
            self._consume(item)

    def take(self) -> tuple[int, int, bytes]:
        """(first line, line count, raw bytes) of the record just read, and start the next."""
        raw = b"\n".join(_as_utf8(line, self.codec) for line in self.consumed)
        if self.consumed_bytes > self.limits.max_record_bytes:
            raw = raw[:KEEP_BYTES]
        taken = (self.first_line, len(self.consumed), raw)
        self.consumed, self.consumed_bytes, self.inside, self.first_line = [], 0, False, 0
        return taken


def _header_record(name: str, line: int, raw: bytes, problem: tuple[str, str], landed: LandedFile | None) -> RawRecord:
    """An unusable header is quarantined as a record of its own, so that a file whose
    content never gets past its header (e.g. one line ended by lone CRs) is not lost
    silently; the tally counts it."""
    if landed is not None:
        landed.header_quarantined = True
    return RawRecord(name, line, raw, None, *problem)


def read_csv(
    source: ByteSource, name: str, limits: ReadLimits, landed: LandedFile | None = None
) -> Iterator[RawRecord]:
    """One record per data row; the first non-blank line is the header naming the columns.

    Strict CSV: a field that starts with a quote must end with one (`1,"quoted" tail` is
    malformed_row, not silently unquoted)."""
    lines = _CsvLines(source, limits)
    reader = csv.reader(lines, strict=True)
    header: list[str] | None = None
    header_problem: tuple[str, str] | None = None
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except _StopRecord as stop:
            first, _, raw = lines.take()
            if stop.gap is not None:
                # The lines of a record that a gap cuts off go with the gap's record.
                partial = raw + b"\n" + stop.gap.partial if raw else stop.gap.partial
                yield RawRecord(name, first or stop.gap.number, partial, None, reasons.UNREADABLE, stop.detail)
            elif header is None:
                header, header_problem = (
                    [],
                    (stop.reason, f"the CSV header (line {first}) cannot be read: {stop.detail}"),
                )
                yield _header_record(name, first, raw, header_problem, landed)
            else:
                yield RawRecord(name, first, raw, None, stop.reason, stop.detail)
            continue
        except csv.Error as exc:
            first, _, raw = lines.take()
            if header is None:
                header, header_problem = (
                    [],
                    (reasons.MALFORMED_ROW, f"the CSV header (line {first}) is malformed: {exc}"),
                )
                yield _header_record(name, first, raw, header_problem, landed)
            else:
                yield RawRecord(name, first, raw, None, reasons.MALFORMED_ROW, f"malformed CSV record: {exc}")
            continue
        first, count, raw = lines.take()
        if not row:
            continue  # defensive: _CsvLines never feeds a blank line at a record start
        if header is None:
            header = [cell.strip() for cell in row]
            repeated = sorted({cell for cell in header if cell in CONTRACT_FIELDS and header.count(cell) > 1})
            if repeated:
                header_problem = (
                    reasons.DUPLICATE_FIELD,
                    f"column {', '.join(map(repr, repeated))} appears more than once in the header",
                )
            continue
        if header_problem is not None:
            yield RawRecord(name, first, raw, None, *header_problem)
        elif len(row) != len(header):
            yield RawRecord(
                name,
                first,
                raw,
                None,
                reasons.MALFORMED_ROW,
                f"row has {len(row)} fields, the header has {len(header)}",
            )
        else:
            yield RawRecord(name, first, raw, {key: value for key, value in zip(header, row) if key in CONTRACT_FIELDS})
    if landed is not None:
        landed.lines_consumed = lines.lines_seen


# ---- Parquet ----------------------------------------------------------------------------
class Unconvertible:
    """A cell that cannot become a Python value (a timestamp out of range, an unknown time
    zone); the contract rejects it as wrong_type if it is in a contract field."""

    def __init__(self, problem: str) -> None:
        self.problem = problem

    def __repr__(self) -> str:
        return f"<unconvertible: {self.problem}>"


def _column_values(column: pa.Array, limits: ReadLimits) -> tuple[list[Any], list[Decoded | None]]:
    """Python values of one column, and per cell the failed decode of a text cell (or None).
    A cell that failed keeps its bytes as its value, for the quarantine's raw column."""
    kind = column.type
    if pa.types.is_dictionary(kind):
        column, kind = column.dictionary_decode(), kind.value_type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        try:
            column.validate(full=True)  # valid UTF-8 throughout: the fast path
            return column.to_pylist(), [None] * len(column)
        except pa.ArrowInvalid:
            # Writers that skip validation leave invalid UTF-8 in string columns; read the
            # bytes and decode each cell, so one bad cell costs one row.
            column = (
                column.cast(pa.binary_view())
                if pa.types.is_string_view(kind)
                else column.view(pa.large_binary() if pa.types.is_large_string(kind) else pa.binary())
            )
            kind = column.type
    if (
        pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_binary_view(kind)
        or pa.types.is_fixed_size_binary(kind)
    ):
        values: list[Any] = []
        failures: list[Decoded | None] = []
        for cell in column.to_pylist():
            decoded = None if cell is None else decode_unit(cell, limits.fallback_encodings)
            failed = decoded is not None and decoded.text is None
            values.append(cell if failed else (decoded.text if decoded else None))
            failures.append(decoded if failed else None)
        return values, failures
    try:
        values = column.to_pylist()
    except Exception:  # out-of-range dates, unknown time zones: convert cell by cell
        values = []
        for index in range(len(column)):
            try:
                values.append(column[index].as_py())
            except Exception as exc:
                values.append(Unconvertible(f"{kind}: {exc}"))
    temporal = (dt.datetime, dt.date, dt.time)
    return [value.isoformat() if isinstance(value, temporal) else value for value in values], [None] * len(column)


def _raw_json(row: dict[str, Any]) -> bytes:
    def default(value: Any) -> str:
        return value.decode("latin-1") if isinstance(value, bytes) else str(value)

    return json.dumps(row, ensure_ascii=False, default=default, sort_keys=True).encode("utf-8", "surrogatepass")[
        :KEEP_BYTES
    ]


def _cell_bytes(column: pa.Array) -> list[int]:
    """Bytes of each text or binary cell (0 for null and other types), computed by Arrow
    without building Python strings; a dictionary column is measured through its indices."""
    kind = column.type
    if pa.types.is_dictionary(kind):
        lengths = _cell_bytes(column.dictionary)
        return [0 if index is None else lengths[index] for index in column.indices.to_pylist()]
    if pa.types.is_fixed_size_binary(kind):
        return [kind.byte_width if valid else 0 for valid in column.is_valid().to_pylist()]
    if pa.types.is_string_view(kind):
        column = column.cast(pa.large_string())
    elif pa.types.is_binary_view(kind):
        column = column.cast(pa.large_binary())
    if (
        pa.types.is_string(column.type)
        or pa.types.is_large_string(column.type)
        or pa.types.is_binary(column.type)
        or pa.types.is_large_binary(column.type)
    ):
        return [length or 0 for length in pc.binary_length(column).to_pylist()]
    return [0] * len(column)


def _row_bytes(batch: pa.RecordBatch) -> list[int]:
    """Bytes of text and binary cells per row: the size a line-based record would have."""
    total = [0] * batch.num_rows
    for column in batch.columns:
        total = [t + n for t, n in zip(total, _cell_bytes(column))]
    return total


def _parquet_records(batch: pa.RecordBatch, name: str, first_row: int, limits: ReadLimits) -> Iterator[RawRecord]:
    """The records of one Arrow batch, converted to Python a slice of at most
    `data.batch_bytes` at a time: a dictionary column holding one 128 KiB value 4,096 times
    is 10 KB on disk but 512 MiB as Python strings."""
    sizes = _row_bytes(batch)
    start = 0
    while start < batch.num_rows:
        end, held = start + 1, sizes[start]
        while end < batch.num_rows and held + sizes[end] <= limits.batch_bytes:
            held += sizes[end]
            end += 1
        yield from _parquet_batch(batch.slice(start, end - start), sizes[start:end], name, first_row + start, limits)
        start = end


def _parquet_batch(
    batch: pa.RecordBatch, sizes: list[int], name: str, first_row: int, limits: ReadLimits
) -> list[RawRecord]:
    if max(sizes, default=0) > limits.max_record_bytes:
        # Oversized rows are rejected before any decoding or conversion to Python strings.
        fits = [size <= limits.max_record_bytes for size in sizes]
        kept_sizes = [size for size in sizes if size <= limits.max_record_bytes]
        read = iter(
            _parquet_batch(batch.filter(pa.array(fits)), kept_sizes, name, first_row, limits) if any(fits) else []
        )
        records = []
        for offset, size in enumerate(sizes):
            if fits[offset]:
                records.append(next(read)._replace(line=first_row + offset))
            else:
                detail = f"row holds {size} bytes of text, over data.max_record_bytes ({limits.max_record_bytes})"
                records.append(RawRecord(name, first_row + offset, b"", None, reasons.RECORD_TOO_LARGE, detail))
        return records
    columns = {field: _column_values(batch.column(index), limits) for index, field in enumerate(batch.schema.names)}
    records = []
    for offset in range(batch.num_rows):
        fields = {field: values[offset] for field, (values, _) in columns.items()}
        raw = _raw_json(fields)
        failed = next(
            ((field, failure) for field, (_, failures) in columns.items() if (failure := failures[offset]) is not None),
            None,
        )
        if failed is None:
            records.append(RawRecord(name, first_row + offset, raw, fields))
        else:
            field, decoded = failed
            records.append(RawRecord(name, first_row + offset, raw, None, decoded.reason, f"{field}: {decoded.detail}"))
    return records


def _batch_rows(parquet: pq.ParquetFile, group: int, columns: list[str], limits: ReadLimits) -> int:
    """Rows per Arrow batch for a row group: data.batch_rows, fewer when the footer says the
    group's contract columns average so many bytes a row that a batch would pass batch_bytes."""
    metadata = parquet.metadata.row_group(group)
    if not metadata.num_rows:
        return limits.batch_rows
    leaves = [i for i in range(metadata.num_columns) if parquet.schema.column(i).path.split(".")[0] in columns]
    size = sum(metadata.column(i).total_uncompressed_size for i in leaves)
    per_row = max(1, size // metadata.num_rows)
    return max(1, min(limits.batch_rows, limits.batch_bytes // per_row))


def read_parquet(path: Path, name: str, limits: ReadLimits = ReadLimits()) -> Iterator[RawRecord]:
    """One record per row, read row group by row group, contract columns only."""
    try:
        # Page checksums, where the writer wrote them, turn silent page corruption into an error;
        # dictionary columns stay dictionaries, so a repeated value is held once.
        schema = pq.ParquetFile(path).schema_arrow
        text_columns = [f for f in CONTRACT_FIELDS if f in schema.names and schema.names.count(f) == 1]
        parquet = pq.ParquetFile(path, page_checksum_verification=True, read_dictionary=text_columns)
    except Exception as exc:
        yield RawRecord(name, 0, b"", None, reasons.UNREADABLE, f"not a readable Parquet file (no valid footer): {exc}")
        return
    names = schema.names
    repeated = sorted({field for field in CONTRACT_FIELDS if names.count(field) > 1})
    columns = [field for field in CONTRACT_FIELDS if field in names]
    row = 0
    for group in range(parquet.num_row_groups):
        group_rows = parquet.metadata.row_group(group).num_rows
        done = 0
        if repeated:
            detail = f"column {', '.join(map(repr, repeated))} appears more than once in the schema"
            for offset in range(group_rows):
                yield RawRecord(name, row + offset + 1, b"", None, reasons.DUPLICATE_FIELD, detail)
            row += group_rows
            continue
        if not columns:
            for offset in range(group_rows):
                yield RawRecord(name, row + offset + 1, b"{}", {})
            row += group_rows
            continue
        batches = parquet.iter_batches(
            batch_size=_batch_rows(parquet, group, columns, limits),
            row_groups=[group],
            columns=columns,
            use_threads=False,
        )
        while True:
            try:
                batch = next(batches, None)
            except Exception as exc:  # a damaged page: the rest of this row group is lost, the next one is read
                lost = (
                    f"row group {group} (rows {row + 1}-{row + group_rows}) unreadable from row {row + done + 1}: {exc}"
                )
                for offset in range(done, group_rows):
                    yield RawRecord(name, row + offset + 1, b"", None, reasons.UNREADABLE, lost)
                break
            if batch is None:
                break
            yield from _parquet_records(batch, name, row + done + 1, limits)
            done += batch.num_rows
        row += group_rows
    declared = parquet.metadata.num_rows
    if declared > row:
        # The footer's total promises rows that no row group holds: account for each.
        detail = f"the footer declares {declared} rows but its row groups hold {row}"
        for offset in range(row, declared):
            yield RawRecord(name, offset + 1, b"", None, reasons.UNREADABLE, detail)
