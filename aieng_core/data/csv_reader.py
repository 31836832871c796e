"""The CSV reader: one record per data row, under the header named by the first non-blank
line. Python's csv module parses; the decoded lines it is fed are attributed to the record in
progress, so that every record keeps its raw bytes and the tally can check that every physical
line was consumed.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from typing import TYPE_CHECKING

from aieng_core.data import reasons
from aieng_core.data.byte_source import ByteSource
from aieng_core.data.lines import KEEP_BYTES, Line, LineGap, count_quotes, is_blank, split_lines
from aieng_core.data.raw_record import CONTRACT_FIELDS, RawRecord, ReadLimits, decode_line, detect_layout

if TYPE_CHECKING:  # for annotations only: readers.py imports this module
    from aieng_core.data.readers import LandedFile

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
        decoded = decode_line(item.data, self.codec, self.limits)
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
